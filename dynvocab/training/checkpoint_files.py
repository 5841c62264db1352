"""Trainer checkpoints without pickle: what an exact resume needs, as JSON, safetensors and a weights-only optimizer file.

A checkpoint folder holds the inference export (phrase encoder, LoRA adapter or LM
weights) and ``state/``: the trainable parameters, the optimizer (``torch.save`` of
tensors and numbers only, read back with ``weights_only=True``), the scheduler, and per
process its RNG and extra state (a phrase trainer's negatives). It is written through ``dynvocab.io.atomic``, so its
manifest, written last, marks it complete; :func:`complete_checkpoints` lists only those.
"""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..io.atomic import MANIFEST, recover, remove_directory, verify

__all__ = [
    "CHECKPOINT_PATTERN",
    "STATE_DIR",
    "TRAINER_STATE",
    "checkpoint_folders",
    "checkpoint_step",
    "complete_checkpoints",
    "load_optimizer",
    "load_rank_state",
    "load_trainable",
    "rank_state",
    "restore_rank_state",
    "rotate_checkpoints",
    "save_optimizer",
    "save_rank_states",
    "save_trainable",
]

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^\.?checkpoint-(\d+)")
TRAINER_STATE = "trainer_state.json"
STATE_DIR = "state"


def rank_state(extra: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """This process's RNG state and its trainer's ``extra`` state: ``(JSON-able dict, tensors)``."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    record = {
        "python_random": [version, list(internal), gauss],
        "numpy_random": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
        **extra,
    }
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"torch_cuda_{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())})
    return record, tensors


def restore_rank_state(record: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Put back the RNG state :func:`rank_state` captured; returns the trainer's extra state."""
    version, internal, gauss = record["python_random"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = record["numpy_random"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[name] for name in sorted(tensors) if name.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    return {k: v for k, v in record.items() if k not in ("python_random", "numpy_random")}


def save_rank_states(directory: Path, states: list[tuple[dict[str, Any], dict[str, torch.Tensor]]]) -> None:
    """One ``rank-<i>.json`` and ``rank-<i>.safetensors`` per process, in ``directory/state``."""
    folder = directory / STATE_DIR
    folder.mkdir(exist_ok=True)
    for rank, (record, tensors) in enumerate(states):
        (folder / f"rank-{rank}.json").write_text(json.dumps(record), encoding="utf-8")
        save_file({k: v.contiguous() for k, v in tensors.items()}, folder / f"rank-{rank}.safetensors")


def load_rank_state(directory: Path, rank: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    folder = directory / STATE_DIR
    return json.loads((folder / f"rank-{rank}.json").read_text(encoding="utf-8")), load_file(folder / f"rank-{rank}.safetensors")


def save_trainable(directory: Path, module: torch.nn.Module) -> None:
    """The parameters that train (encoder, adapter or the whole LM), by name, as safetensors."""
    (directory / STATE_DIR).mkdir(exist_ok=True)
    weights = {name: p.detach().cpu().clone() for name, p in module.named_parameters() if p.requires_grad}
    save_file(weights, directory / STATE_DIR / "trainable.safetensors")


@torch.no_grad()
def load_trainable(directory: Path, module: torch.nn.Module) -> None:
    path = directory / STATE_DIR / "trainable.safetensors"
    saved = load_file(path)
    params = {name: p for name, p in module.named_parameters() if p.requires_grad}
    if set(saved) != set(params):
        missing, extra = sorted(set(params) - set(saved))[:3], sorted(set(saved) - set(params))[:3]
        raise ValueError(
            f"{path} was saved for other trainable parameters (missing {missing}, unexpected {extra}): it comes from a "
            "run with another --mode or model; resume with the settings of that run, or start a new --output-dir"
        )
    for name, param in params.items():
        param.copy_(saved[name].to(param.device, param.dtype))


def save_optimizer(directory: Path, optimizer, scheduler) -> None:
    """Optimizer state (tensors and numbers: loadable with ``weights_only=True``) and the scheduler as JSON."""
    (directory / STATE_DIR).mkdir(exist_ok=True)
    torch.save(optimizer.state_dict(), directory / STATE_DIR / "optimizer.pt")
    state = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    (directory / STATE_DIR / "scheduler.json").write_text(json.dumps(state), encoding="utf-8")


def load_optimizer(directory: Path, optimizer, scheduler) -> None:
    folder = directory / STATE_DIR
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=True))
    state = json.loads((folder / "scheduler.json").read_text(encoding="utf-8"))
    scheduler.load_state_dict(state | {"lr_lambdas": [None] * len(scheduler.lr_lambdas)})


def checkpoint_step(path: Path) -> int | None:
    """N of a ``checkpoint-N`` folder; None for anything else (a staging folder included)."""
    match = re.fullmatch(r"checkpoint-(\d+)", path.name)
    return int(match.group(1)) if match and path.is_dir() else None


def checkpoint_folders(output_dir: Path) -> list[Path]:
    """Every ``checkpoint-N`` folder, complete or not, oldest first."""
    return sorted((p for p in output_dir.glob("checkpoint-*") if checkpoint_step(p) is not None), key=checkpoint_step)


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """``checkpoint-N`` folders whose save finished (their manifest is there and matches), newest first.

    Interrupted swaps are recovered first; a checkpoint that fails its check is skipped with a warning.
    """
    steps = {int(m.group(1)) for p in output_dir.glob("*checkpoint-*") if (m := CHECKPOINT_PATTERN.match(p.name))}
    complete = []
    for step in sorted(steps, reverse=True):
        path = output_dir / f"checkpoint-{step}"
        recover(path)
        if not path.is_dir():
            continue
        try:
            verify(path)
        except ValueError as error:
            logger.warning("skipping %s: %s", path, error)
            continue
        complete.append(path)
    return complete


def rotate_checkpoints(output_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (only folders a dynvocab save wrote); 0 keeps all."""
    if keep <= 0:
        return
    for old in complete_checkpoints(output_dir)[keep:]:
        if (old / MANIFEST).is_file():
            remove_directory(old)
