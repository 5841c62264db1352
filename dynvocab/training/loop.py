"""The one training loop of the library, on ``accelerate``: one CPU, one GPU, or many processes with ``accelerate launch``.

The phrase-encoder trainer (:mod:`dynvocab.training.trainer`), the document-encoder trainers
(:mod:`retrieval.training`) and the NAR trainer (:mod:`retrieval.nar.training`) subclass
:class:`TrainingLoop` and keep only their model, their batches and their loss. The loop owns the rest:

- AdamW over the trainable parameters (or the caller's parameter groups), a linear warm-up and decay
  stepped here once per optimizer step on every rank (a prepared scheduler would step once per process),
  gradient accumulation, clipping at ``max_grad_norm`` and autocast by ``mixed_precision``;
- a tqdm bar and ``log.jsonl`` (main process only);
- checkpoints (``dynvocab.training.checkpoint_files``: safetensors, JSON and a weights-only optimizer file) written
  atomically every ``save_every`` steps, rotated to the newest ``save_total_limit``;
- resume from the newest checkpoint that passes its check (a damaged one is skipped with a warning),
  with the log cut back to what that checkpoint had seen.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, gather_object
from torch import nn
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from ..config import check_at_least
from ..hardware.precision import cpu_processes, mixed_precision
from ..io.atomic import atomic_directory
from .checkpoint_files import (
    STATE_DIR,
    TRAINER_STATE,
    checkpoint_folders,
    checkpoint_step,
    complete_checkpoints,
    load_optimizer,
    load_rank_state,
    load_trainable,
    rank_state,
    restore_rank_state,
    rotate_checkpoints,
    save_optimizer,
    save_rank_states,
    save_trainable,
)

__all__ = ["EXPORT_DIR", "LOG_FILE", "LoopSettings", "TrainingLoop", "check_loop_settings", "loop_field",
           "refuse_old_checkpoints"]

logger = logging.getLogger(__name__)

EXPORT_DIR = "final"
LOG_FILE = "log.jsonl"
PRECISIONS = ("no", "bf16", "auto")


@dataclass
class LoopSettings:
    """The loop's share of a training config (every trainer's config inherits it)."""

    max_steps: int = field(default=200, metadata={"help": "Optimizer steps in all."})
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak AdamW learning rate."})
    warmup_steps: int = field(default=20, metadata={"help": "Linear warm-up steps."})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    grad_accum: int = field(default=1, metadata={"help": "Batches accumulated per optimizer step."})
    log_every: int = field(default=10, metadata={"help": "Steps between log.jsonl lines."})
    save_every: int = field(default=100, metadata={"help": "Steps between checkpoints."})
    save_total_limit: int = field(default=2, metadata={"help": "Complete checkpoints kept (the newest); 0 keeps all."})
    mixed_precision: str = field(default="auto", metadata={"help": "'no', 'bf16' or 'auto' (bf16 where the GPU has it)."})
    seed: int = field(default=0, metadata={"help": "Seed of batches, masks, dropout and initialisation."})


def loop_field(name: str, default: Any) -> Any:
    """A :class:`LoopSettings` field with another default (and the same help), for a trainer whose defaults differ."""
    return field(default=default, metadata=LoopSettings.__dataclass_fields__[name].metadata)


def check_loop_settings(settings: LoopSettings) -> None:
    """Raise ``ValueError`` naming the field and the fix for a setting the loop cannot run with."""
    check_at_least(settings, 1, ("max_steps", "grad_accum", "log_every", "save_every"))
    check_at_least(settings, 0, ("warmup_steps",))
    if not settings.save_total_limit >= 0:
        raise ValueError(f"save_total_limit={settings.save_total_limit} must be >= 0 (0 keeps every checkpoint)")
    if not settings.learning_rate > 0:
        raise ValueError(f"learning_rate={settings.learning_rate!r} must be > 0, e.g. 1e-4")
    if not settings.max_grad_norm > 0:
        raise ValueError(f"max_grad_norm={settings.max_grad_norm!r} must be > 0, e.g. 1.0")
    if settings.mixed_precision not in PRECISIONS:
        raise ValueError(f"mixed_precision={settings.mixed_precision!r}; choose 'no', 'bf16' or 'auto'")


class TrainingLoop:
    """Trains ``module`` for ``settings.max_steps`` optimizer steps; a subclass gives the loss and the export.

    A subclass implements :meth:`training_terms` (one batch's ``{"loss", ...terms}`` on this process) and
    :meth:`write_export` (what inference needs), and may override the hooks :meth:`before_training`,
    :meth:`after_resume`, :meth:`evaluate`, :meth:`extra_state` / :meth:`load_extra_state` (per process)
    and :meth:`checkpoint_record` / :meth:`check_checkpoint_record`. ``exports_checkpoints`` puts the export
    in every checkpoint too, so that any checkpoint loads as a model.
    """

    exports_checkpoints = False
    #: DDP must look for parameters a step leaves unused (an encoder's pooler, say): slower, so off unless needed
    find_unused_parameters = False
    desc = "train"

    def __init__(self, module: nn.Module, settings: LoopSettings, output_dir: str | Path,
                 parameter_groups: list[dict[str, Any]] | None = None) -> None:
        self.settings, self.output_dir = settings, Path(output_dir)
        self.accelerator = Accelerator(
            gradient_accumulation_steps=settings.grad_accum, mixed_precision=mixed_precision(settings.mixed_precision),
            cpu=cpu_processes(), kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=self.find_unused_parameters)],
        )
        if parameter_groups is None:
            parameter_groups = [{"params": [p for p in module.parameters() if p.requires_grad]}]
        optimizer = torch.optim.AdamW(parameter_groups, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        self.scheduler = get_linear_schedule_with_warmup(optimizer, settings.warmup_steps, settings.max_steps)
        self.module, self.optimizer = self.accelerator.prepare(module, optimizer)
        self.step = 0

    @property
    def unwrapped(self) -> nn.Module:
        """The module as it was passed in (not the DDP wrapper)."""
        return self.accelerator.unwrap_model(self.module)

    # ------------------------------------------------------------------ what a trainer gives
    def training_terms(self) -> dict[str, torch.Tensor]:
        """One batch of this process at ``self.step``: ``{"loss": scalar, ...reported terms}``."""
        raise NotImplementedError

    def write_export(self, directory: Path) -> None:
        """Write what inference needs into ``directory`` (a staging folder, swapped in whole)."""
        raise NotImplementedError

    def before_training(self) -> None:
        """Runs once on every process before the first step (and before a resume)."""

    def after_resume(self) -> None:
        """Runs after a checkpoint is loaded, ``self.step`` set (a trainer with a sample stream skips ahead here)."""

    def evaluate(self) -> dict[str, float]:
        """Held-out figures logged after this step (none by default)."""
        return {}

    def extra_state(self) -> dict[str, Any]:
        """This process's state besides the RNGs, as JSON (e.g. a negatives sampler's)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`extra_state` returned."""

    def checkpoint_record(self) -> dict[str, Any]:
        """Facts written into ``trainer_state.json`` beside the step."""
        return {}

    def check_checkpoint_record(self, record: dict[str, Any], checkpoint: Path) -> None:
        """Check a checkpoint's ``trainer_state.json`` before it is loaded (warn or raise)."""

    # ------------------------------------------------------------------ the loop
    def train(self, resume: bool = False) -> dict[str, float]:
        """Run to ``max_steps``; with ``resume`` continue from the newest complete checkpoint in ``output_dir``."""
        settings, accelerator = self.settings, self.accelerator
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if accelerator.is_main_process and hasattr(settings, "save"):
            settings.save(self.output_dir)
        self.before_training()
        if resume:
            self._resume()
        bar = tqdm(total=settings.max_steps, initial=self.step, desc=self.desc, disable=not accelerator.is_local_main_process)
        log = open(self.output_dir / LOG_FILE, "a", encoding="utf-8") if accelerator.is_main_process else None
        started, last = time.perf_counter(), {}
        try:
            while self.step < settings.max_steps:
                lr = self.scheduler.get_last_lr()[0]
                last = self.train_step()
                bar.set_postfix({k: f"{v:.3f}" for k, v in last.items()})
                bar.update()
                if self._due(getattr(settings, "eval_every", 0)):
                    last |= self.evaluate()
                if log is not None and self._due(settings.log_every):
                    record = {"step": self.step, "seconds": round(time.perf_counter() - started, 2), "lr": lr, **last}
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                if self.step % settings.save_every == 0 and self.step < settings.max_steps:
                    self.save_checkpoint()
        finally:
            bar.close()
            if log is not None:
                log.close()
        self.save_checkpoint()
        self.export(self.output_dir / EXPORT_DIR)
        return last

    def train_step(self) -> dict[str, float]:
        """One optimizer step over ``grad_accum`` batches; returns the last batch's terms, averaged over processes."""
        accelerator, settings = self.accelerator, self.settings
        self.module.train()
        for _ in range(settings.grad_accum):
            with accelerator.accumulate(self.module):
                with accelerator.autocast():
                    terms = self.training_terms()
                accelerator.backward(terms["loss"])
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(self.module.parameters(), settings.max_grad_norm)
                self.optimizer.step()
                if accelerator.sync_gradients:
                    self.scheduler.step()
                self.optimizer.zero_grad()
        self.step += 1
        reduced = accelerator.reduce({k: v.detach().float() for k, v in terms.items()}, "mean")
        return {k: float(v) for k, v in reduced.items()}

    def _due(self, every: int) -> bool:
        return bool(every) and (self.step % every == 0 or self.step == self.settings.max_steps)

    # ------------------------------------------------------------------ saving
    def export(self, directory: Path) -> None:
        """What inference needs, in one atomic save by the main process."""
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            with atomic_directory(directory) as staging:
                self.write_export(staging)

    def save_checkpoint(self) -> Path:
        """``output_dir/checkpoint-<step>``: everything an exact resume needs, complete once its manifest is written.

        Each process's RNG and extra state is gathered to the main process, which writes the folder alone;
        older checkpoints beyond ``save_total_limit`` are then removed.
        """
        accelerator = self.accelerator
        directory = self.output_dir / f"checkpoint-{self.step}"
        states = gather_object([rank_state(self.extra_state())])
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            log = self.output_dir / LOG_FILE
            record = {"step": self.step, "num_processes": accelerator.num_processes,
                      "log_bytes": log.stat().st_size if log.exists() else 0, **self.checkpoint_record()}
            with atomic_directory(directory) as staging:
                if self.exports_checkpoints:
                    self.write_export(staging)
                save_trainable(staging, self.unwrapped)
                save_optimizer(staging, self.optimizer, self.scheduler)
                save_rank_states(staging, states)
                (staging / TRAINER_STATE).write_text(json.dumps(record), encoding="utf-8")
            rotate_checkpoints(self.output_dir, self.settings.save_total_limit)
        accelerator.wait_for_everyone()
        return directory

    def _resume(self) -> None:
        """Continue from the newest complete checkpoint; the log is cut back to what that checkpoint had seen."""
        checkpoints = complete_checkpoints(self.output_dir)
        if not checkpoints:
            refuse_old_checkpoints(self.output_dir)
            raise FileNotFoundError(f"no complete checkpoint-* in {self.output_dir} to resume from; drop --resume to start fresh")
        latest = checkpoints[0]
        newer = [p.name for p in checkpoint_folders(self.output_dir) if checkpoint_step(p) > checkpoint_step(latest)]
        if newer:  # killed mid-save: their files are left as they are, and the next save of their step replaces them
            logger.warning("resuming from %s, the newest complete checkpoint: %s %s incomplete (a save was interrupted)",
                           latest.name, ", ".join(newer), "is" if len(newer) == 1 else "are")
        record = json.loads((latest / TRAINER_STATE).read_text(encoding="utf-8"))
        saved, now = record.get("num_processes", 1), self.accelerator.num_processes
        if saved != now:
            raise ValueError(
                f"{latest} was written by a run on {saved} process(es) and this run has {now}: the batches and the "
                f"RNG state are split by process, so resume with --num_processes {saved} (keeping --batch-size), or "
                "start a new --output-dir"
            )
        self.check_checkpoint_record(record, latest)
        self.load_checkpoint(latest)
        self.after_resume()
        if self.accelerator.is_main_process:
            log = self.output_dir / LOG_FILE  # drop lines written after the checkpoint: those steps train again
            if log.exists() and log.stat().st_size > record["log_bytes"]:
                os.truncate(log, record["log_bytes"])
            logger.info("resumed from %s at step %d", latest, self.step)

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Put this process's trainable weights, optimizer, scheduler, RNG and extra state back; returns the record."""
        record = json.loads((directory / TRAINER_STATE).read_text(encoding="utf-8"))
        load_trainable(directory, self.unwrapped)
        load_optimizer(directory, self.optimizer, self.scheduler)
        extra = restore_rank_state(*load_rank_state(directory, self.accelerator.process_index))
        self.load_extra_state(extra)
        self.step = record["step"]
        return record


def refuse_old_checkpoints(output_dir: Path) -> None:
    """Raise ``ValueError`` if the newest ``checkpoint-*`` was written by a trainer of an older release (no ``state/``);
    called when no checkpoint is complete, so an interrupted save is told apart by the complete ones before it."""
    folders = checkpoint_folders(output_dir)
    if folders and not (folders[-1] / STATE_DIR).is_dir():
        raise ValueError(
            f"{folders[-1]} was written by an older dynvocab trainer, whose checkpoint format this release cannot "
            "resume; start a new --output-dir (or drop --resume). Final exports (final/) of that run still load."
        )
