"""The accelerate loop that pre-trains and fine-tunes retrieval encoders (one CPU, one GPU, or ``accelerate launch``).

A step's batch, masks and dropout depend only on ``(seed, step, process)``: :meth:`EncoderTrainer.train`
reseeds torch at every step and asks ``batch_at(step, process, processes)`` for the batch, so a resumed
run repeats the uninterrupted one exactly from the model and optimizer state alone. Checkpoints hold the
module (safetensors), the optimizer (``torch.save``, read back with ``weights_only=True``), the scheduler
and the step (``trainer_state.json``); each is swapped in whole by ``dynvocab.atomic``, whose manifest,
written last, marks it complete: resume takes the newest checkpoint whose manifest matches.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from safetensors.torch import load_model, save_model
from torch import nn
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from dynvocab.atomic import atomic_directory, recover, verify
from dynvocab.precision import cpu_processes, mixed_precision

__all__ = ["EXPORT_DIR", "LoopSettings", "EncoderTrainer"]

logger = logging.getLogger(__name__)

EXPORT_DIR = "final"
STATE_FILE = "trainer_state.json"
MODULE_FILE = "module.safetensors"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass
class LoopSettings:
    """The loop's share of a training config."""

    max_steps: int = field(default=200, metadata={"help": "optimizer steps in all"})
    learning_rate: float = field(default=5e-5, metadata={"help": "peak AdamW learning rate"})
    warmup_steps: int = field(default=20, metadata={"help": "linear warm-up steps"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    log_every: int = field(default=10, metadata={"help": "steps between log.jsonl lines"})
    save_every: int = field(default=100, metadata={"help": "steps between checkpoints"})
    mixed_precision: str = field(default="auto", metadata={"help": "'no', 'bf16' or 'auto' (bf16 where a GPU has it)"})
    seed: int = field(default=0, metadata={"help": "seed of batches, masks, dropout and initialisation"})


class EncoderTrainer:
    """Trains ``module`` (whose ``forward(**batch)`` returns ``{"loss", ...terms}``) for ``settings.max_steps``.

    ``export(module, folder)`` writes what inference needs (``save_pretrained``); it runs for every checkpoint
    and for ``output_dir/final``.
    """

    def __init__(self, module: nn.Module, settings: LoopSettings, output_dir: str | Path,
                 export: Callable[[nn.Module, Path], None]) -> None:
        self.accelerator = Accelerator(mixed_precision=mixed_precision(settings.mixed_precision), cpu=cpu_processes())
        self.settings, self.output_dir, self.export = settings, Path(output_dir), export
        trainable = [p for p in module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        # stepped here once per optimizer step on every rank (a prepared scheduler steps once per process)
        self.scheduler = get_linear_schedule_with_warmup(optimizer, settings.warmup_steps, settings.max_steps)
        self.module, self.optimizer = self.accelerator.prepare(module, optimizer)
        self.step = 0

    @property
    def unwrapped(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.module)

    def train(self, batch_at: Callable[[int, int, int], dict[str, Any]], resume: bool = False,
              on_step: Callable[[int], None] | None = None) -> dict[str, float]:
        """Run to ``max_steps``; ``batch_at(step, process, processes)`` gives that process's batch of a step.

        ``on_step(step)`` runs before each step (a fine-tuner mines hard negatives there).
        """
        settings, accelerator = self.settings, self.accelerator
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            self._resume()
        bar = tqdm(total=settings.max_steps, initial=self.step, desc="train", disable=not accelerator.is_local_main_process)
        log = open(self.output_dir / "log.jsonl", "a", encoding="utf-8") if accelerator.is_main_process else None
        started, last = time.perf_counter(), {}
        while self.step < settings.max_steps:
            if on_step is not None:
                on_step(self.step)
            self.module.train()
            torch.manual_seed(settings.seed * 1_000_003 + self.step * 1009 + accelerator.process_index)
            batch = batch_at(self.step, accelerator.process_index, accelerator.num_processes)
            batch = {k: v.to(accelerator.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            with accelerator.autocast():
                terms = self.module(**batch)
            accelerator.backward(terms["loss"])
            accelerator.clip_grad_norm_(self.module.parameters(), settings.max_grad_norm)
            lr = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
            self.step += 1
            last = {k: float(v) for k, v in accelerator.reduce({k: v.detach() for k, v in terms.items()}, "mean").items()}
            bar.set_postfix({k: f"{v:.3f}" for k, v in last.items()})
            bar.update()
            if log is not None and (self.step % settings.log_every == 0 or self.step == settings.max_steps):
                log.write(json.dumps({"step": self.step, "seconds": round(time.perf_counter() - started, 2), "lr": lr,
                                      **last}) + "\n")
                log.flush()
            if self.step % settings.save_every == 0 or self.step == settings.max_steps:
                self.save_checkpoint()
        bar.close()
        if log is not None:
            log.close()
        self._export(self.output_dir / EXPORT_DIR)
        return last

    def _export(self, directory: Path) -> None:
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            with atomic_directory(directory) as staging:
                self.export(self.unwrapped, staging)

    def save_checkpoint(self) -> Path:
        """``output_dir/checkpoint-<step>``: module, optimizer, scheduler and the step."""
        directory = self.output_dir / f"checkpoint-{self.step}"
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            with atomic_directory(directory) as staging:
                save_model(self.unwrapped, str(staging / MODULE_FILE))
                torch.save(self.optimizer.state_dict(), staging / OPTIMIZER_FILE)
                state = {"step": self.step, "num_processes": self.accelerator.num_processes,
                         "scheduler": self.scheduler.state_dict()}
                (staging / STATE_FILE).write_text(json.dumps(state), encoding="utf-8")
        self.accelerator.wait_for_everyone()
        return directory

    def _resume(self) -> None:
        complete = [p for p in self.output_dir.glob("checkpoint-*") if _complete(p)]
        if not complete:
            raise FileNotFoundError(f"no complete checkpoint-* in {self.output_dir} to resume from; drop --resume to start fresh")
        latest = max(complete, key=lambda p: int(p.name.split("-")[1]))
        state = json.loads((latest / STATE_FILE).read_text(encoding="utf-8"))
        if state["num_processes"] != self.accelerator.num_processes:
            raise ValueError(f"{latest} was written by {state['num_processes']} process(es) and this run has "
                             f"{self.accelerator.num_processes}; resume with the same number or start a new output_dir")
        load_model(self.unwrapped, str(latest / MODULE_FILE), device=str(self.accelerator.device))
        self.optimizer.load_state_dict(torch.load(latest / OPTIMIZER_FILE, weights_only=True,
                                                  map_location=self.accelerator.device))
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        logger.info("resumed from %s at step %d", latest, self.step)


def _complete(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` (recovered first if a swap was interrupted) is a finished save whose manifest matches."""
    recover(checkpoint)
    if not (checkpoint / STATE_FILE).is_file():
        return False
    try:
        verify(checkpoint)
    except ValueError as error:
        logger.warning("skipping %s: %s", checkpoint, error)
        return False
    return True
