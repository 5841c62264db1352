"""The training loop on ``accelerate``: one CPU, one GPU, or many processes with ``accelerate launch``.

Under N processes every rank builds the same global stream of samples and trains on its
own ``batch_size`` slice of each global batch (``sample_stream(..., shard, num_shards)``),
so the shards are disjoint and together cover the data, and a run on N processes with
``batch_size`` B trains on the batches a single process with ``batch_size`` N * B sees.
Only the main process writes logs, exports and checkpoint files; each rank keeps its own
RNG and negatives state in the checkpoint, and a resume needs the same number of processes.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import reduce, set_seed
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..data.assets import resolve_model
from ..hardware.precision import cpu_processes, mixed_precision
from ..loading import LM_ADAPTER, LM_WEIGHTS
from ..model import DynamicVocabLM
from ..serialization import write_model_files
from ..tokens.ngrams import SuccessorIndex, mine_ngrams
from .cached_samples import cached_sample_stream, chunk_sample, split_chunks
from .collate import MixedBatch, collate
from .config import TrainConfig
from .corpus import epoch_texts, training_texts
from .loop import TrainingLoop
from .loss import LossWeights, dynamic_vocab_loss, term_counts, weighted_total
from .negatives import NegativeSampler
from .readback_loss import cached_readback_loss, token_readback_loss
from .samples import FMMSampler, NIdsSampler, NWordsSampler, SpanSampler, build_samples
from .state_cache import StateCache, build_state_cache, cache_key

__all__ = [
    "Trainer",
    "TrainingModule",
    "build_model",
    "cpu_processes",
    "make_sampler",
    "mixed_precision",
    "open_state_cache",
    "sample_stream",
]

logger = logging.getLogger(__name__)


class TrainingModule(nn.Module):
    """Puts the whole loss in one ``forward`` so DDP/FSDP see every parameter used.

    ``readback`` picks the objective: the paper's mixed view (``"vector"``), or the one
    matched to token read-back (``"tokens"``), from cached states when ``forward`` gets them.
    """

    def __init__(
        self, model: DynamicVocabLM, weights: LossWeights, train_lm: bool, readback: str = "vector",
        spelling_negatives: bool = False,
    ) -> None:
        super().__init__()
        self.model, self.weights, self.train_lm, self.readback = model, weights, train_lm, readback
        self.spelling_negatives = spelling_negatives

    def forward(self, batch: MixedBatch, states: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        if states is not None:
            terms = cached_readback_loss(self.model, batch, *states, self.weights, self.spelling_negatives)
        elif self.readback == "tokens":
            terms = token_readback_loss(self.model, batch, self.weights, self.train_lm, self.spelling_negatives)
        else:
            terms = dynamic_vocab_loss(self.model, batch, self.weights, self.train_lm)
        if PartialState().num_processes == 1:
            return terms
        # each term is a mean over this rank's positions; weigh it by this rank's share of all ranks' positions,
        # so that the mean over ranks (the gradient DDP makes, the figure logged) is the mean over every position,
        # as one process with the whole global batch computes it
        counts = {name: count.float() for name, count in term_counts(batch).items() if name in terms}
        totals = reduce(counts, "mean")
        terms = terms | {name: terms[name] * counts[name] / totals[name].clamp(min=1) for name in counts}
        terms["loss"] = weighted_total(terms, self.weights, self.train_lm)
        return terms


def build_model(config: TrainConfig) -> DynamicVocabLM:
    """The LM (LoRA-wrapped, frozen or fully trainable) with a fresh phrase encoder."""
    path = resolve_model(config.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if config.mode == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout, task_type="CAUSAL_LM")
        lm = get_peft_model(lm, lora)
    elif config.mode == "frozen":
        lm.requires_grad_(False)
    model = DynamicVocabLM.from_causal_lm(lm, tokenizer, encoder_layers=config.encoder_layers)
    model.dynvocab_config.readback = model.dynvocab_config.trained_readback = config.readback
    model.phrase_encoder.requires_grad_(True)
    if config.mode != "full":
        model.phrase_encoder.body.get_input_embeddings().requires_grad_(False)
    return model


def sample_stream(
    config: TrainConfig, tokenizer, support: list[list[int]], shard: int = 0, num_shards: int = 1
) -> Iterator[list]:
    """Endless batches of mixed samples, the same for the same config (so a resume can skip ahead).

    The stream is cut into global batches of ``batch_size * num_shards`` samples, and shard
    ``shard`` gets the ``shard``-th ``batch_size`` of each: shards are disjoint and cover the stream.
    """
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard={shard} must be in [0, num_shards={num_shards})")
    sampler = make_sampler(config, tokenizer, support)
    rng = random.Random(config.seed)

    def epochs() -> Iterator:
        """Samples with at least one phrase (one without teaches the phrase encoder nothing), epoch after epoch."""
        for epoch in itertools.count():
            produced = False
            for sample in build_samples(epoch_texts(config, epoch), tokenizer, sampler, config.max_length, seed=rng):
                if sample.phrase_spans:
                    produced = True
                    yield sample
            if not produced:
                raise ValueError(
                    f"the training data {config.data!r} yields no training sample with a phrase (the texts are too "
                    f"short, or the data is empty); pass texts of a few sentences each, or lower --min-gap"
                )

    samples = epochs()
    while True:
        batch = [next(samples) for _ in range(config.batch_size * num_shards)]
        yield batch[shard * config.batch_size : (shard + 1) * config.batch_size]


def make_sampler(config: TrainConfig, tokenizer, support: list[list[int]]) -> SpanSampler:
    """The span sampler ``config.phrases`` names (FMM mines its n-grams from ``support``)."""
    if config.phrases == "n-words":
        return NWordsSampler(min_gap=config.min_gap, phrase_prob=config.phrase_prob)
    if config.phrases == "n-ids":
        return NIdsSampler(min_gap=config.min_gap, phrase_prob=config.phrase_prob)
    frequent = mine_ngrams(support, min_n=2, max_n=8, min_count=2, top_k=config.fmm_top_k, tokenizer=tokenizer)
    return FMMSampler(set(frequent), min_gap=config.min_gap)


def state_cache_command(config: TrainConfig, output_dir: str = "NEW_DIR") -> str:
    """The command that builds the state cache ``config`` trains from."""
    return (f"dynvocab cache-states --model {config.model} --data {config.data} --max-length {config.max_length} "
            f"--output-dir {output_dir}, then train with --state-cache {output_dir}")


def open_state_cache(
    config: TrainConfig, model: DynamicVocabLM, texts: list[str], directory: Path, batch_size: int = 8,
    shard_chunks: int = 256,
) -> StateCache:
    """The state cache of ``texts`` under the frozen LM, built (or resumed) first where it is not complete;
    with ``config.incomplete_cache`` the shards finished so far, as they are."""
    hint = state_cache_command(config)
    key = cache_key(model.lm, model.tokenizer, texts, config.max_length, "bfloat16")
    if not config.incomplete_cache:
        build_state_cache(model.lm, model.tokenizer, texts, directory, config.max_length, batch_size, shard_chunks, rebuild_hint=hint)
    return StateCache.open(directory, key, hint, allow_incomplete=config.incomplete_cache)


class Trainer(TrainingLoop):
    """Trains the phrase encoder (and the LM, by ``config.mode``) with L_p + L_t + L_kl, on the library's one loop."""

    exports_checkpoints = True  # any checkpoint-N loads as a model (dynvocab eval takes them)

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        PartialState(cpu=cpu_processes())  # the processes meet before the state cache is built, as the loop will
        set_seed(config.seed)
        texts = training_texts(config)  # the data is read before the model loads: a bad path fails at once
        if config.uses_state_cache:
            texts = list(texts)  # the state cache keeps every text (and support_texts must not use up a stream)
        support_texts = list(itertools.islice(iter(texts), config.support_texts))
        if not support_texts:
            raise ValueError(
                f"the training data {config.data!r} holds no text, so it yields no training sample; pass a text or "
                f"JSONL file, a folder or a dataset with texts in the {config.text_field!r} field"
            )
        self.model = build_model(config)
        self.tokenizer = self.model.tokenizer
        self.cache = None
        if config.uses_state_cache:
            cache_dir = Path(config.state_cache) if config.state_cache else Path(config.output_dir) / "state-cache"
            self.cache = open_state_cache(config, self.model, texts, cache_dir)
        self.support = self.tokenizer(support_texts, add_special_tokens=False)["input_ids"]
        names = config.negative_names
        self.negatives = NegativeSampler(
            names,
            successor_index=SuccessorIndex(self.support) if "corpus-retrieval" in names else None,
            model=self.model.lm if "generation" in names else None,
            num_prebatches=config.num_prebatches,
            max_phrase_tokens=self.model.dynvocab_config.max_phrase_tokens,
            max_negatives=config.max_negatives,
            seed=config.seed,
        )
        module = TrainingModule(
            self.model, LossWeights(config.phrase_weight, config.token_weight, config.kl_weight, config.distill_weight),
            config.mode != "frozen",
            config.readback, config.spelling_negatives,
        )
        super().__init__(module, config, config.output_dir, self._parameter_groups())
        self.stream: Iterator[list] | None = None
        self.validation: list | None = None

    def training_terms(self) -> dict[str, torch.Tensor]:
        samples, states = self._batch_states(next(self.stream))
        batch = collate(samples, self.negatives(samples), self.model.vocab_size, self.negatives.in_batch)
        terms = self.module(batch.to(self.accelerator.device), states)
        return terms | {"phrases": torch.tensor(float(len(batch.phrases))), "tokens": batch.token_mask.sum().float()}

    def before_training(self) -> None:
        self.stream = self._stream()
        self.validation = self._validation_batches() if self.config.eval_every else None

    def after_resume(self) -> None:
        for _ in range(self.step * self.config.grad_accum):  # the stream is a function of the config: skip ahead
            next(self.stream)

    def evaluate(self) -> dict[str, float]:
        return self.validate(self.validation) if self.validation is not None else {}

    def extra_state(self) -> dict[str, Any]:
        return {"negatives": self.negatives.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.negatives.load_state_dict(state["negatives"])

    def checkpoint_record(self) -> dict[str, Any]:
        return {} if self.cache is None else {"cached_chunks": int(self.cache.available.sum())}

    def check_checkpoint_record(self, record: dict[str, Any], checkpoint: Path) -> None:
        if self.cache is not None and record.get("cached_chunks", len(self.cache)) != int(self.cache.available.sum()):
            logger.warning(
                "%s trained on %d cached chunks and %d are written now: the resumed sample stream differs from the one the "
                "interrupted run would have seen", checkpoint, record["cached_chunks"], int(self.cache.available.sum()),
            )

    # ------------------------------------------------------------------ data
    def _stream(self) -> Iterator[list]:
        """Batches of this process: samples of the texts, or ``(chunk, sample)`` pairs over the state cache."""
        config, accelerator = self.config, self.accelerator
        if self.cache is None:
            return sample_stream(config, self.tokenizer, self.support, accelerator.process_index, accelerator.num_processes)
        sampler = make_sampler(config, self.tokenizer, self.support)
        return cached_sample_stream(self.cache, self.tokenizer, sampler, config.batch_size, config.seed,
                                    accelerator.process_index, accelerator.num_processes)

    def _batch_states(self, items: list) -> tuple[list, tuple[torch.Tensor, torch.Tensor] | None]:
        """The batch's samples, and their cached states when training from the cache."""
        if self.cache is None:
            return items, None
        chunks, samples = zip(*items)
        return list(samples), self.cache.states(chunks, self.accelerator.device)

    def _validation_batches(self) -> list:
        """Fixed held-out batches: chunks of the held-out texts, spans and negatives drawn once with a fixed seed."""
        config = self.config
        held_out = split_chunks(self.cache)[1][: config.validation_chunks]
        if not held_out:
            raise ValueError(f"the state cache {self.cache.directory} holds no held-out chunk for eval_every; set eval_every=0")
        sampler, rng = make_sampler(config, self.tokenizer, self.support), random.Random(config.seed)
        names = [n for n in config.negative_names if n != "pre-batch"]
        negatives = NegativeSampler(names, successor_index=self.negatives.successor_index,
                                    max_phrase_tokens=self.model.dynvocab_config.max_phrase_tokens,
                                    max_negatives=config.max_negatives, seed=config.seed)
        pairs = [(i, s) for i in held_out if (s := chunk_sample(self.cache, i, self.tokenizer, sampler, rng)).phrase_spans]
        batches = []
        for start in range(0, len(pairs), config.batch_size):
            chunks, samples = zip(*pairs[start : start + config.batch_size])
            batches.append((list(chunks), collate(samples, negatives(samples), self.model.vocab_size, negatives.in_batch)))
        return batches

    @torch.no_grad()
    def validate(self, batches: list) -> dict[str, float]:
        """``val_phrase`` (L_p), ``val_accuracy`` (against ``val_token_accuracy``, phrases off) and ``val_phrase_mass``
        over the held-out batches, position-weighted."""
        totals, positions = {"phrase": 0.0, "distill": 0.0, "accuracy": 0.0, "token_accuracy": 0.0, "phrase_mass": 0.0}, 0
        for chunks, batch in batches:
            terms = cached_readback_loss(self.model, batch.to(self.accelerator.device),
                                         *self.cache.states(chunks, self.accelerator.device),
                                         spelling_negatives=self.config.spelling_negatives)
            count = int(term_counts(batch)["phrase"])
            positions += count
            for name in totals:
                totals[name] += float(terms[name]) * count
        return {f"val_{name}": value / max(positions, 1) for name, value in totals.items()}

    def _parameter_groups(self) -> list[dict]:
        """What trains, in one group; or, with ``lm_learning_rate``, the LM's trained weights in a second group at that rate."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if self.config.lm_learning_rate is None:
            return [{"params": trainable}]
        in_lm = {id(p) for p in self.model.lm.parameters()}
        return [{"params": [p for p in trainable if id(p) not in in_lm]},
                {"params": [p for p in trainable if id(p) in in_lm], "lr": self.config.lm_learning_rate}]

    # ------------------------------------------------------------------ saving
    def write_export(self, directory: Path) -> None:
        """The phrase encoder, plus the LM's adapter or weights if they trained, and where the cache came from."""
        model = self.unwrapped.model
        write_model_files(model, directory)
        if self.cache is not None:  # what the encoder trained on: the cache's key and how much of it was there
            available = self.cache.available
            record = {"key": self.cache.key, "chunks": int(available.sum()), "of_chunks": len(available),
                      "training_chunks": len(split_chunks(self.cache)[0])}
            (directory / "state_cache.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if self.config.mode == "lora":
            model.lm.save_pretrained(directory / LM_ADAPTER)
        elif self.config.mode == "full":
            model.lm.save_pretrained(directory / LM_WEIGHTS)
            model.tokenizer.save_pretrained(directory / LM_WEIGHTS)
        self.config.save(directory)
