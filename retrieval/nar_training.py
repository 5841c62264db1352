"""Training a NAR retriever on (query, docid) pairs with ``accelerate``; then fitting its shortlist clusters.

The conventions of ``dynvocab.training.trainer``: a tqdm bar, a JSON-lines log, a checkpoint every
``save_every`` steps, exact resume (the batch order is a function of the seed and the step; model,
optimizer, scheduler and RNG states are saved), bf16 on a GPU that has it, and several processes by
``accelerate launch`` (each rank trains on its slice of every global batch; only the main one writes).
Checkpoints hold safetensors and JSON only, written atomically and hashed (``dynvocab.tensor_files``).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from dynvocab.config import JsonConfig
from dynvocab.shortlist import ShortlistConfig, ShortlistHead
from dynvocab.tensor_files import read_tensor_folder, write_tensor_folder
from dynvocab.precision import cpu_processes, mixed_precision

from .nar_loss import IGNORE, NarLossWeights, nar_loss
from .nar_model import NarRetriever
from .phrase_vocab import DocidTokenizer

__all__ = ["NarTrainConfig", "NarTrainer", "cached_features", "docid_targets", "fit_learned_head", "trainable_encoder_parameters"]

logger = logging.getLogger(__name__)

CHECKPOINT = "dynvocab.NarCheckpoint"


@dataclass
class NarTrainConfig(JsonConfig):
    """Settings of ``dynvocab nar-train``."""

    output_dir: str = field(default="runs/nar", metadata={"help": "Checkpoints, log and the final model go here."})
    batch_size: int = field(default=32, metadata={"help": "Pairs per step and process."})
    max_steps: int = field(default=1000, metadata={"help": "Optimizer steps in all."})
    learning_rate: float = field(default=1e-4, metadata={"help": "Peak AdamW learning rate of the encoder."})
    output_learning_rate: float = field(default=1e-3, metadata={"help": "Peak AdamW learning rate of the output layer."})
    warmup_steps: int = field(default=50, metadata={"help": "Linear warm-up steps."})
    train_layers: int = field(default=-1, metadata={"help": "Top encoder layers trained (-1: all, 0: only the output layer)."})
    docid_weight: float = field(default=0.25, metadata={"help": "lambda2: weight of x0's docid-token loss l2."})
    normalisation_weight: float = field(default=1.0, metadata={"help": "lambda3: weight of the self-normalisation l3."})
    vocab_chunk: int = field(default=65536, metadata={"help": "Vocabulary rows per chunk of log-sum-exp."})
    mixed_precision: str = field(default="auto", metadata={"help": "'no', 'bf16' or 'auto' (bf16 where the GPU has it)."})
    log_every: int = field(default=10, metadata={"help": "Steps between log lines."})
    save_every: int = field(default=200, metadata={"help": "Steps between checkpoints."})
    seed: int = field(default=0, metadata={"help": "Seed of the batch order and dropout."})

    config_name: ClassVar[str] = "nar_train_config.json"

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_steps", "log_every", "save_every", "vocab_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"NarTrainConfig.{name}={value!r} must be an integer >= 1")
        if not isinstance(self.train_layers, int) or self.train_layers < -1:
            raise ValueError(f"NarTrainConfig.train_layers={self.train_layers!r} must be -1 (all), 0 or a layer count")
        if self.mixed_precision not in ("no", "bf16", "auto"):
            raise ValueError(f"NarTrainConfig.mixed_precision={self.mixed_precision!r}; choose 'no', 'bf16' or 'auto'")
        for name in ("learning_rate", "output_learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"NarTrainConfig.{name}={getattr(self, name)} must be > 0")


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


class NarTrainer:
    """Trains ``model`` on ``queries[i] -> targets[i]`` (rows of ``docid_targets``)."""

    def __init__(self, model: NarRetriever, queries: Sequence[str], targets: torch.Tensor, end_id: int,
                 config: NarTrainConfig, features: torch.Tensor | None = None) -> None:
        if len(queries) != targets.shape[0] or not len(queries):
            raise ValueError(f"got {len(queries)} queries and {targets.shape[0]} target rows; pass one row per query")
        self.config, self.queries, self.targets, self.end_id = config, list(queries), targets, end_id
        self.accelerator = Accelerator(mixed_precision=mixed_precision(config.mixed_precision), cpu=cpu_processes())
        #: a frozen encoder under projected positions: x0 of every query is computed once (or passed in) and cached
        self.cached = config.train_layers == 0 and model.config.position_states == "projected"
        if self.cached and self.accelerator.num_processes > 1:
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
        optimizer = torch.optim.AdamW(groups)
        self.scheduler = get_linear_schedule_with_warmup(optimizer, config.warmup_steps, config.max_steps)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.weights = NarLossWeights(config.docid_weight, config.normalisation_weight)
        self.output_dir = Path(config.output_dir)
        self.step = 0

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

    def train(self, resume: bool = False) -> dict[str, float]:
        """Run to ``max_steps``; with ``resume`` continue from the newest checkpoint in ``output_dir``."""
        config, accelerator = self.config, self.accelerator
        if resume:
            self._resume()
        else:
            torch.manual_seed(config.seed)
            if accelerator.is_main_process:
                self.output_dir.mkdir(parents=True, exist_ok=True)
        bar = tqdm(total=config.max_steps, initial=self.step, desc="nar-train", disable=not accelerator.is_local_main_process)
        log = open(self.output_dir / "log.jsonl", "a", encoding="utf-8") if accelerator.is_main_process else None
        model = accelerator.unwrap_model(self.model)
        if self.cached and self.features is None:
            self.features = cached_features(model, self.queries)
        started, last = time.perf_counter(), {}
        self.model.train()
        while self.step < config.max_steps:
            rows = self.batch_rows(self.step)
            with accelerator.autocast():
                if self.cached:
                    x0 = self.features[rows].to(accelerator.device)
                    positions = model.project(x0)
                else:
                    x0, positions = self.model(**model.tokenize([self.queries[i] for i in rows]))
                terms = nar_loss(x0.float(), positions.float(), model.output, self.targets[rows].to(x0.device),
                                 self.end_id, self.weights, config.vocab_chunk)
            accelerator.backward(terms["loss"])
            accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
            self.step += 1
            last = {k: float(v) for k, v in accelerator.reduce({k: v.detach() for k, v in terms.items()}, "mean").items()}
            bar.set_postfix({k: f"{v:.3f}" for k, v in last.items()})
            bar.update()
            if log is not None and (self.step % config.log_every == 0 or self.step == config.max_steps):
                log.write(json.dumps({"step": self.step, "seconds": round(time.perf_counter() - started, 2), **last}) + "\n")
                log.flush()
            if self.step % config.save_every == 0 or self.step == config.max_steps:
                self.save_checkpoint()
        bar.close()
        if log is not None:
            log.close()
        if accelerator.is_main_process:
            model.save_pretrained(self.output_dir / "final")
        return last

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path | None:
        """Model, optimizer, scheduler and RNG at ``self.step`` in ``checkpoint-<step>``, atomically (main process)."""
        self.accelerator.wait_for_everyone()
        if not self.accelerator.is_main_process:
            return None
        model = self.accelerator.unwrap_model(self.model)
        optimizer_tensors, optimizer_meta = _flatten_optimizer(self.optimizer.state_dict())
        files = {
            "model.safetensors": dict(model.named_parameters()),
            "optimizer.safetensors": optimizer_tensors,
            "rng.safetensors": {"torch": torch.get_rng_state()},
        }
        scheduler = {k: v for k, v in self.scheduler.state_dict().items() if k != "lr_lambdas"}
        metadata = {"step": self.step, "num_processes": self.accelerator.num_processes, "optimizer": optimizer_meta,
                    "scheduler": scheduler, "model_config": model.config.to_dict()}
        path = self.output_dir / f"checkpoint-{self.step}"
        write_tensor_folder(path, CHECKPOINT, files, metadata, {NarTrainConfig.config_name: json.dumps(self.config.to_dict())})
        return path

    def _resume(self) -> None:
        checkpoints = sorted(self.output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        if not checkpoints:
            raise FileNotFoundError(f"no checkpoint-* in {self.output_dir} to resume from; drop --resume to start fresh")
        manifest, files = read_tensor_folder(checkpoints[-1], CHECKPOINT)
        if manifest["num_processes"] != self.accelerator.num_processes:
            raise ValueError(f"{checkpoints[-1]} was written by {manifest['num_processes']} process(es), this run has "
                             f"{self.accelerator.num_processes}; resume with the same number")
        model = self.accelerator.unwrap_model(self.model)
        parameters = dict(model.named_parameters())
        for name, value in files["model.safetensors"].items():
            parameters[name].data.copy_(value)
        self.optimizer.load_state_dict(_unflatten_optimizer(files["optimizer.safetensors"], manifest["optimizer"]))
        self.scheduler.load_state_dict(manifest["scheduler"] | {"lr_lambdas": [None] * len(self.optimizer.param_groups)})
        torch.set_rng_state(files["rng.safetensors"]["torch"])
        self.step = manifest["step"]
        logger.info("resumed from %s at step %d", checkpoints[-1], self.step)


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


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for number, entries in state["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{number}.{name}"] = value
            else:
                scalars[f"{number}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, value in [*tensors.items(), *meta["scalars"].items()]:
        number, name = key.split(".", 1)
        state.setdefault(int(number), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


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
