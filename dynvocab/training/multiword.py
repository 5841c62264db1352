"""Training the MWT baseline's new embedding rows with the phrase encoder's budget."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, get_linear_schedule_with_warmup

from ..assets import resolve_model
from ..config import check_at_least
from ..corpora import WIKIPEDIA_HELD_OUT
from ..multiword import MultiWordLM, MultiWordVocab
from ..padding import pad_id, pad_sequences
from ..precision import cpu_processes, mixed_precision
from .trainer import epoch_texts, training_texts

__all__ = ["MultiWordTrainConfig", "batches", "train_multiword"]

logger = logging.getLogger(__name__)


@dataclass
class MultiWordTrainConfig:
    """Settings of ``dynvocab train-mwt``; the budget defaults match the shipped phrase encoder's run."""

    model: str = field(default="smollm2", metadata={"help": "Hub name or path of the causal LM; 'smollm2' is the offline asset."})
    data: str = field(default="wikipedia", metadata={"help": "Text/JSONL file, datasets name or dir; 'wikipedia' is the offline asset."})
    output_dir: str = field(default="runs/mwt", metadata={"help": "The trained vocabulary and its log go here (the directory is replaced)."})
    text_field: str = field(default="text", metadata={"help": "Field holding the text in JSONL files and datasets."})
    held_out: float = field(default=WIKIPEDIA_HELD_OUT, metadata={"help": "Share of the offline Wikipedia leads held out (as in `dynvocab train`)."})
    num_ngrams: int = field(default=5000, metadata={"help": "K, the most frequent multi-word n-grams added as tokens."})
    min_count: int = field(default=5, metadata={"help": "Occurrences an n-gram needs to be mined."})
    max_ngram_tokens: int = field(default=8, metadata={"help": "Longest n-gram, in LM tokens."})
    mine_texts: int = field(default=20000, metadata={"help": "Training texts the n-grams are mined from."})
    max_length: int = field(default=128, metadata={"help": "Tokens per training sequence (after merging)."})
    batch_size: int = field(default=8, metadata={"help": "Sequences per step."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate of AdamW."})
    warmup_steps: int = field(default=10, metadata={"help": "Linear warm-up steps."})
    max_steps: int = field(default=200, metadata={"help": "Optimizer steps in all."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    log_every: int = field(default=10, metadata={"help": "Steps between loss log lines."})
    seed: int = field(default=0, metadata={"help": "Seed of shuffling (the held-out split does not depend on it)."})

    def __post_init__(self) -> None:
        check_at_least(self, 1, ("num_ngrams", "min_count", "mine_texts", "max_length", "batch_size", "max_steps", "log_every"))
        if self.max_ngram_tokens < 2:
            raise ValueError(f"max_ngram_tokens={self.max_ngram_tokens} must be >= 2 (an n-gram has 2+ tokens)")
        if not 0.0 < self.held_out < 1.0:
            raise ValueError(f"held_out={self.held_out} must be a fraction in (0, 1)")


def batches(
    config: MultiWordTrainConfig, vocab: MultiWordVocab, shard: int = 0, num_shards: int = 1
) -> Iterator[list[list[int]]]:
    """Endless batches of merged id sequences, one epoch after another (see ``epoch_texts``).

    Shard ``shard`` of ``num_shards`` gets the ``shard``-th ``batch_size`` of each global batch of
    ``batch_size * num_shards`` sequences (as ``sample_stream`` does for the phrase encoder).
    """

    def sequences() -> Iterator[list[int]]:
        for epoch in itertools.count():
            found = False
            for text in epoch_texts(config, epoch):
                ids = vocab.encode(text)[: config.max_length]
                if len(ids) >= 2:
                    found = True
                    yield ids
            if not found:
                raise ValueError(f"data={config.data!r} has no text of 2 or more tokens; pass a corpus with text in it")

    stream = sequences()
    while True:
        batch = [next(stream) for _ in range(config.batch_size * num_shards)]
        yield batch[shard * config.batch_size : (shard + 1) * config.batch_size]


def train_multiword(config: MultiWordTrainConfig) -> tuple[MultiWordLM, list[dict]]:
    """Mine the n-grams, grow the LM, train only the new rows (the LM stays frozen) and save them to
    ``output_dir`` (replaced whole). Returns the trained model and the log."""
    accelerator = Accelerator(mixed_precision=mixed_precision("auto"), cpu=cpu_processes())
    set_seed(config.seed)
    path = resolve_model(config.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab_size = lm.get_input_embeddings().num_embeddings
    mined_from = list(itertools.islice(iter(training_texts(config)), config.mine_texts))
    vocab = MultiWordVocab.mine(mined_from, tokenizer, vocab_size, config.num_ngrams, config.min_count, config.max_ngram_tokens)
    logger.info("mined %d n-grams from %d texts, e.g. %s", len(vocab), len(mined_from),
                [tokenizer.decode(g) for g in vocab.ngrams[:5]])
    model = MultiWordLM.from_causal_lm(lm, vocab)
    lm.requires_grad_(False)
    matrices = MultiWordLM.embedding_matrices(lm)
    new_rows = (torch.arange(matrices[0].shape[0]) >= vocab_size).float()[:, None]
    for matrix in matrices:
        matrix.requires_grad_(True)
        matrix.register_hook(lambda grad: grad * new_rows.to(grad))  # only the n-gram rows learn
    optimizer = torch.optim.AdamW(matrices, lr=config.learning_rate, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, config.warmup_steps, config.max_steps)
    lm, optimizer = accelerator.prepare(lm, optimizer)  # not the scheduler: prepared, it steps once per process
    stream = batches(config, vocab, accelerator.process_index, accelerator.num_processes)
    started, log = time.perf_counter(), []
    lm.train()
    for step in tqdm(range(1, config.max_steps + 1), desc="train-mwt", disable=not accelerator.is_local_main_process):
        ids, mask = pad_sequences(next(stream), pad_id(tokenizer), device=accelerator.device)
        loss = lm(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        if accelerator.num_processes > 1:  # weigh by this rank's share of the tokens: the mean over ranks is the global mean
            count = mask[:, 1:].sum().float()
            loss = loss * count / accelerator.reduce(count, "mean").clamp(min=1)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(matrices, config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step % config.log_every == 0 or step == config.max_steps:
            share = (ids[mask == 1] >= vocab_size).float().mean()
            loss, share = (float(x) for x in accelerator.reduce(torch.stack([loss.detach(), share]), "mean"))
            log.append({"step": step, "seconds": round(time.perf_counter() - started, 2),
                        "loss": loss, "ngram_share": share})
            if accelerator.is_main_process:
                logger.info("%s", log[-1])
    lm.eval()
    model.lm = accelerator.unwrap_model(lm)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        model.save_pretrained(config.output_dir, base_model=config.model, train_config=asdict(config), train_log=log)
    return model, log
