"""Which precision and which process backend to use on the device at hand: one answer for the whole library."""

from __future__ import annotations

import os

import torch

__all__ = ["cpu_processes", "encode_autocast_dtype", "mixed_precision"]


def mixed_precision(setting: str) -> str:
    """``'auto'`` becomes ``'bf16'`` where a GPU supports it, else ``'no'``; other settings pass through."""
    if setting not in ("no", "bf16", "auto"):
        raise ValueError(f"mixed_precision={setting!r}; choose 'no', 'bf16' or 'auto'")
    if setting != "auto":
        return setting
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def cpu_processes() -> bool:
    """Launched as several processes on a machine without CUDA: accelerate then needs ``cpu=True`` to use gloo."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()


def encode_autocast_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``encode_dtype`` ``name`` on ``device``; None means no autocast (float32).

    ``"auto"`` picks bfloat16 where the device computes it natively (a CUDA GPU with
    bf16, a CPU with AVX-512 BF16 or AMX) and float32 elsewhere: an emulated bf16 is slower.
    """
    if name == "auto":
        if device.type == "cuda":
            native = torch.cuda.is_bf16_supported()
        else:
            checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private in torch 2.x: absent means no
            native = device.type == "cpu" and any(getattr(torch.cpu, check, lambda: False)() for check in checks)
        return torch.bfloat16 if native else None
    return None if name == "float32" else getattr(torch, name)
