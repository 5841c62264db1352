"""Which precision and which process backend to use on the device at hand: one answer for the whole library."""

from __future__ import annotations

import contextlib
import os

import torch

__all__ = ["cpu_processes", "encode_autocast", "encode_autocast_dtype", "mixed_precision", "native_bf16"]


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


#: oneDNN ISA caps (``ONEDNN_MAX_CPU_ISA``) below AVX-512 BF16: under them oneDNN emulates bf16
_ONEDNN_ISAS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 natively: a CUDA GPU with bf16, a CPU with AVX-512 BF16 or AMX.

    Elsewhere (an AVX2 CPU, say) torch emulates bf16, several times slower than float32. A CPU that has the
    instructions counts only while torch may use them: ``ATEN_CPU_CAPABILITY=avx2`` or ``ONEDNN_MAX_CPU_ISA=AVX2``
    (how one CPU stands in for another) make it emulate bf16 too.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu" or not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper() in _ONEDNN_ISAS_WITHOUT_BF16:
        return False
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private in torch 2.x: absent means no
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


def encode_autocast_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``encode_dtype`` ``name`` on ``device``; None means no autocast (float32).

    ``"auto"`` picks bfloat16 where the device computes it natively (:func:`native_bf16`) and float32
    elsewhere: an emulated bf16 is slower. Every encoder of the library (phrase, document, DupMAE) asks here.
    """
    if name == "auto":
        return torch.bfloat16 if native_bf16(device) else None
    return None if name == "float32" else getattr(torch, name)


def encode_autocast(device: torch.device, name: str = "auto") -> contextlib.AbstractContextManager:
    """``torch.autocast`` in :func:`encode_autocast_dtype`'s dtype, or nothing when that is float32."""
    dtype = encode_autocast_dtype(name, device)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
