"""Training a NAR retriever on (query, docid) pairs on the library's one loop (:mod:`dynvocab.training.loop`);
then fitting its shortlist clusters.

The batch order is a function of the seed and the step, so a resumed run repeats the uninterrupted one;
under ``accelerate launch`` each rank trains on its slice of every global batch.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from accelerate import PartialState
from tqdm.auto import tqdm

from dynvocab.config import JsonConfig
from dynvocab.hardware.precision import cpu_processes
from dynvocab.scoring.shortlist_head import ShortlistConfig, ShortlistHead
from dynvocab.training.loop import LoopSettings, TrainingLoop, check_loop_settings, loop_field

from .loss import IGNORE, NarLossWeights, nar_loss
from .model import NarRetriever
from .vocab import DocidTokenizer

__all__ = ["NarTrainConfig", "NarTrainer", "cached_features", "docid_targets", "fit_learned_head", "trainable_encoder_parameters"]

logger = logging.getLogger(__name__)


@dataclass
class NarTrainConfig(LoopSettings, JsonConfig):
    """Settings of ``dynvocab nar-train`` (the loop's own: ``LoopSettings``, here with PIXAR-sized defaults)."""

    output_dir: str = field(default="runs/nar", metadata={"help": "Checkpoints, log and the final model go here."})
    batch_size: int = field(default=32, metadata={"help": "Pairs per step and process."})
    max_steps: int = loop_field("max_steps", 1000)
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak AdamW learning rate of the encoder."})
    output_learning_rate: float = field(default=1e-3, metadata={"help": "Peak AdamW learning rate of the output layer."})
    warmup_steps: int = loop_field("warmup_steps", 50)
    save_every: int = loop_field("save_every", 200)
    train_layers: int = field(default=-1, metadata={"help": "Top encoder layers trained (-1: all, 0: only the output layer)."})
    docid_weight: float = field(default=0.25, metadata={"help": "lambda2: weight of x0's docid-token loss l2."})
    normalisation_weight: float = field(default=1.0, metadata={"help": "lambda3: weight of the self-normalisation l3."})
    vocab_chunk: int = field(default=65536, metadata={"help": "Vocabulary rows per chunk of log-sum-exp."})

    config_name: ClassVar[str] = "nar_train_config.json"

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_steps", "log_every", "save_every", "vocab_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"NarTrainConfig.{name}={value!r} must be an integer >= 1")
        if not isinstance(self.train_layers, int) or self.train_layers < -1:
            raise ValueError(f"NarTrainConfig.train_layers={self.train_layers!r} must be -1 (all), 0 or a layer count")
        check_loop_settings(self)
        if not self.output_learning_rate > 0:
            raise ValueError(f"NarTrainConfig.output_learning_rate={self.output_learning_rate} must be > 0")


def docid_targets(docids: Sequence[str], tokenizer: DocidTokenizer, positions: int) -> tuple[torch.Tensor, list[list[int]]]:
    """``(N, s)`` targets (the docid's ids, the end id, then -100) and the id lists; a docid that does not fit
    ``positions - 1`` ids raises ``ValueError``."""
    encoded = tokenizer.encode_batch(list(docids))
    targets = torch.full((len(encoded), positions), IGNORE, dtype=torch.long)
    for row, ids in enumerate(encoded):
        if not ids or len(ids) >= positions:
            raise ValueError(f"docid {docids[row]!r} takes {len(ids)} ids; NarConfig.positions={positions} allows "
                             f"1..{positions - 1} (plus the end id): raise positions or the vocabulary size")
        targets[row, : len(ids) + 1] = torch.tensor([*ids, tokenizer.end_id])
    return targets, encoded


class NarLossModule(torch.nn.Module):
    """The retriever and its loss in one ``forward``, so that DDP sees every parameter the loss uses."""

    def __init__(self, model: NarRetriever, end_id: int, weights: NarLossWeights, vocab_chunk: int) -> None:
        super().__init__()
        self.model, self.end_id, self.weights, self.vocab_chunk = model, end_id, weights, vocab_chunk

    def forward(self, targets: torch.Tensor, x0: torch.Tensor | None = None, **inputs) -> dict[str, torch.Tensor]:
        """PIXAR's loss terms for ``targets`` ``(b, s)``, from the query ``inputs`` or from cached ``x0`` ``(b, d)``."""
        if x0 is None:
            x0, positions = self.model(**inputs)
        else:
            positions = self.model.project(x0)
        return nar_loss(x0.float(), positions.float(), self.model.output, targets, self.end_id, self.weights,
                        self.vocab_chunk)


class NarTrainer(TrainingLoop):
    """Trains ``model`` on ``queries[i] -> targets[i]`` (rows of ``docid_targets``)."""

    desc = "nar-train"
    find_unused_parameters = True  # the encoder's pooler (and, with projected positions, x0's own layers) get no gradient

    def __init__(self, model: NarRetriever, queries: Sequence[str], targets: torch.Tensor, end_id: int,
                 config: NarTrainConfig, features: torch.Tensor | None = None) -> None:
        if len(queries) != targets.shape[0] or not len(queries):
            raise ValueError(f"got {len(queries)} queries and {targets.shape[0]} target rows; pass one row per query")
        self.config, self.queries, self.targets, self.end_id = config, list(queries), targets, end_id
        #: a frozen encoder under projected positions: x0 of every query is computed once (or passed in) and cached
        self.cached = config.train_layers == 0 and model.config.position_states == "projected"
        if self.cached and PartialState(cpu=cpu_processes()).num_processes > 1:
            raise ValueError("train_layers=0 with projected positions caches features on one process; run it without "
                             "accelerate launch, or train encoder layers")
        if features is not None and (not self.cached or features.shape[0] != len(self.queries)):
            raise ValueError("features are taken only with train_layers=0 and position_states='projected', one row per query")
        self.features = features
        encoder_params = trainable_encoder_parameters(model.encoder, config.train_layers)
        head = [p for name, p in model.named_parameters() if not name.startswith("encoder.")]
        groups = [{"params": head, "lr": config.output_learning_rate}]
        if encoder_params:
            groups.append({"params": encoder_params, "lr": config.learning_rate})
        weights = NarLossWeights(config.docid_weight, config.normalisation_weight)
        super().__init__(NarLossModule(model, end_id, weights, config.vocab_chunk), config, config.output_dir, groups)

    @property
    def retriever(self) -> NarRetriever:
        """The retriever being trained."""
        return self.unwrapped.model

    def batch_rows(self, step: int) -> list[int]:
        """This rank's rows of global batch ``step``: a fixed function of the seed and the step (epochs reshuffled)."""
        size = self.config.batch_size * self.accelerator.num_processes
        first = step * size
        rows = []
        while len(rows) < size:
            epoch, offset = divmod(first + len(rows), len(self.queries))
            order = list(range(len(self.queries)))
            random.Random(self.config.seed + epoch).shuffle(order)
            rows.extend(order[offset : offset + size - len(rows)])
        rank = self.accelerator.process_index
        return rows[rank * self.config.batch_size : (rank + 1) * self.config.batch_size]

    def before_training(self) -> None:
        torch.manual_seed(self.config.seed)
        if self.cached and self.features is None:
            self.features = cached_features(self.retriever, self.queries)

    def training_terms(self) -> dict[str, torch.Tensor]:
        rows, device = self.batch_rows(self.step), self.accelerator.device
        targets = self.targets[rows].to(device)
        if self.cached:
            return self.module(targets, x0=self.features[rows].to(device))
        inputs = self.retriever.tokenize([self.queries[i] for i in rows])
        return self.module(targets, **{k: v.to(device) for k, v in inputs.items()})

    def write_export(self, directory: Path) -> None:
        self.retriever.save_pretrained(directory)


@torch.no_grad()
def cached_features(model: NarRetriever, queries: Sequence[str], batch_size: int = 128) -> torch.Tensor:
    """``x0`` ``(N, d)`` of every query under the (frozen) encoder, in eval mode."""
    was_training = model.training
    model.eval()
    features = torch.cat([model.pooled(queries[i : i + batch_size])
                          for i in tqdm(range(0, len(queries), batch_size), desc="query features")])
    model.train(was_training)
    return features


def trainable_encoder_parameters(encoder: torch.nn.Module, layers: int) -> list[torch.nn.Parameter]:
    """The parameters of the top ``layers`` blocks of ``encoder`` (-1: all of it); the rest is frozen."""
    if layers == -1:
        return [p for p in encoder.parameters() if p.requires_grad]
    depth = encoder.config.num_hidden_layers
    blocks = next((m for m in encoder.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == depth), None)
    if blocks is None:
        raise ValueError(f"cannot find the {depth} layers of {type(encoder).__name__}; use train_layers=-1")
    encoder.requires_grad_(False)
    chosen = [p for block in list(blocks)[depth - min(layers, depth) :] for p in block.parameters()]
    for parameter in chosen:
        parameter.requires_grad_(True)
    return chosen


@torch.no_grad()
def fit_learned_head(model: NarRetriever, queries: Sequence[str], targets: torch.Tensor, end_id: int,
                     config: ShortlistConfig, steps: int = 300, batch_size: int = 64, features: torch.Tensor | None = None
                     ) -> ShortlistHead:
    """PIXAR's second stage: ``x0`` of the training queries (``features`` if already computed), their docid tokens as
    targets, the output layer as vocabulary."""
    model.eval()
    x0 = cached_features(model, queries) if features is None else features
    docid_tokens = targets.masked_fill((targets == end_id) | (targets == IGNORE), -1)
    with torch.enable_grad():
        return ShortlistHead.learned(x0, docid_tokens, model.output.detach(), config, steps=steps, batch_size=batch_size)
