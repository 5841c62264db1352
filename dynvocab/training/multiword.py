"""Training the MWT baseline's new embedding rows with the phrase encoder's budget."""

from __future__ import annotations

import itertools
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from accelerate.utils import set_seed
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..config import JsonConfig, check_at_least
from ..data.assets import resolve_model
from ..multiword import MultiWordLM, MultiWordVocab
from ..tokens.padding import pad_id, pad_sequences
from .corpus import CorpusSettings, batches, check_corpus_settings, training_texts
from .loop import LOG_FILE, LoopSettings, TrainingLoop, check_loop_settings, loop_field

__all__ = ["MultiWordTrainConfig", "MultiWordTrainer", "train_multiword"]

logger = logging.getLogger(__name__)


@dataclass
class MultiWordTrainConfig(LoopSettings, CorpusSettings, JsonConfig):
    """Settings of ``dynvocab train-mwt``; the budget defaults match the shipped phrase encoder's run."""

    model: str = field(default="smollm2", metadata={"help": "Hub name or path of the causal LM; 'smollm2' is the offline asset."})
    output_dir: str = field(default="runs/mwt", metadata={"help": "Checkpoints, log.jsonl and the trained vocabulary (final/) go here."})
    num_ngrams: int = field(default=5000, metadata={"help": "K, the most frequent multi-word n-grams added as tokens."})
    min_count: int = field(default=5, metadata={"help": "Occurrences an n-gram needs to be mined."})
    max_ngram_tokens: int = field(default=8, metadata={"help": "Longest n-gram, in LM tokens."})
    mine_texts: int = field(default=20000, metadata={"help": "Training texts the n-grams are mined from."})
    max_length: int = field(default=128, metadata={"help": "Tokens per training sequence (after merging)."})
    batch_size: int = field(default=8, metadata={"help": "Sequences per step."})
    learning_rate: float = loop_field("learning_rate", 1e-3)
    warmup_steps: int = loop_field("warmup_steps", 10)
    weight_decay: float = loop_field("weight_decay", 0.0)

    config_name: ClassVar[str] = "mwt_train_config.json"

    def __post_init__(self) -> None:
        check_at_least(self, 1, ("num_ngrams", "min_count", "mine_texts", "max_length", "batch_size"))
        check_loop_settings(self)
        check_corpus_settings(self)
        if self.max_ngram_tokens < 2:
            raise ValueError(f"max_ngram_tokens={self.max_ngram_tokens} must be >= 2 (an n-gram has 2+ tokens)")


class MultiWordTrainer(TrainingLoop):
    """Mines the n-grams, grows the LM and trains only the new rows (the LM stays frozen), on the library's one loop."""

    desc = "train-mwt"

    def __init__(self, config: MultiWordTrainConfig) -> None:
        self.config = config
        set_seed(config.seed)
        path = resolve_model(config.model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.vocab_size = lm.get_input_embeddings().num_embeddings
        mined_from = list(itertools.islice(iter(training_texts(config)), config.mine_texts))
        self.vocab = MultiWordVocab.mine(mined_from, tokenizer, self.vocab_size, config.num_ngrams, config.min_count,
                                         config.max_ngram_tokens)
        logger.info("mined %d n-grams from %d texts, e.g. %s", len(self.vocab), len(mined_from),
                    [tokenizer.decode(g) for g in self.vocab.ngrams[:5]])
        self.model = MultiWordLM.from_causal_lm(lm, self.vocab)
        lm.requires_grad_(False)
        matrices = MultiWordLM.embedding_matrices(lm)
        new_rows = (torch.arange(matrices[0].shape[0]) >= self.vocab_size).float()[:, None]
        for matrix in matrices:
            matrix.requires_grad_(True)
            matrix.register_hook(lambda grad: grad * new_rows.to(grad))  # only the n-gram rows learn
        super().__init__(lm, config, config.output_dir, [{"params": matrices}])
        self.pad = pad_id(tokenizer)
        self.stream = batches(config, self.vocab.encode, self.accelerator.process_index, self.accelerator.num_processes)

    def after_resume(self) -> None:
        for _ in range(self.step):  # the stream is a function of the config: skip ahead
            next(self.stream)

    def training_terms(self) -> dict[str, torch.Tensor]:
        accelerator = self.accelerator
        ids, mask = pad_sequences(next(self.stream), self.pad, device=accelerator.device)
        loss = self.module(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        if accelerator.num_processes > 1:  # weigh by this rank's share of the tokens: the mean over ranks is the global mean
            count = mask[:, 1:].sum().float()
            loss = loss * count / accelerator.reduce(count, "mean").clamp(min=1)
        return {"loss": loss, "ngram_share": (ids[mask == 1] >= self.vocab_size).float().mean()}

    def write_export(self, directory: Path) -> None:
        """The n-grams and their trained rows, with the settings and the log so far."""
        log_file = self.output_dir / LOG_FILE
        log = [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()] if log_file.exists() else []
        self.model.lm = self.unwrapped
        self.model.write_files(directory, base_model=self.config.model, train_config=asdict(self.config), train_log=log)


def train_multiword(config: MultiWordTrainConfig, resume: bool = False) -> tuple[MultiWordLM, list[dict]]:
    """Train the MWT baseline; ``output_dir/final`` loads with ``MultiWordLM.from_pretrained``. Returns the trained
    model and the log."""
    trainer = MultiWordTrainer(config)
    trainer.train(resume=resume)
    trainer.model.lm = trainer.unwrapped.eval()
    log_file = trainer.output_dir / LOG_FILE
    return trainer.model, [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()]
