"""The document-encoder trainer: the library's one loop (:mod:`dynvocab.training.loop`) over batches that are a
function of ``(seed, step, process)``.

A step's batch, masks and dropout depend only on those: torch is reseeded at every step and
``batch_at(step, process, processes)`` gives the batch, so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynvocab.training.loop import LoopSettings, TrainingLoop

__all__ = ["EncoderTrainer"]


class EncoderTrainer(TrainingLoop):
    """Trains ``module`` (whose ``forward(**batch)`` returns ``{"loss", ...terms}``) on ``batch_at``'s batches.

    ``export(module, folder)`` writes what inference needs (``save_pretrained``) into ``output_dir/final``;
    ``before_step(step)`` runs before each step (a fine-tuner mines hard negatives there).
    """

    def __init__(self, module: nn.Module, settings: LoopSettings, output_dir: str | Path,
                 batch_at: Callable[[int, int, int], dict[str, Any]], export: Callable[[nn.Module, Path], None],
                 before_step: Callable[[int], None] | None = None) -> None:
        super().__init__(module, settings, output_dir)
        self.batch_at, self.export_module, self.before_step = batch_at, export, before_step

    def training_terms(self) -> dict[str, torch.Tensor]:
        accelerator, step = self.accelerator, self.step
        if self.before_step is not None:
            self.before_step(step)
        torch.manual_seed(self.settings.seed * 1_000_003 + step * 1009 + accelerator.process_index)
        batch = self.batch_at(step, accelerator.process_index, accelerator.num_processes)
        batch = {k: v.to(accelerator.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return self.module(**batch)

    def write_export(self, directory: Path) -> None:
        self.export_module(self.unwrapped, directory)
