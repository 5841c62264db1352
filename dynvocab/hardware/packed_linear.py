"""Linear layers that run on a oneDNN-prepacked copy of their weight at CPU inference.

torch's float32 ``nn.Linear`` on a CPU calls MKL, whose GEMM over 2 to 8 rows costs 2 to 3x its GEMV over one:
a forward over a phrase's or a draft's few tokens then costs 1.35 to 2x a one-token step. oneDNN with the
weight reordered once into its blocked layout runs 1 to 8 rows in about the time of one, and one row faster than
MKL's GEMV (``examples/benchmark_cpu_kernels.py`` prints both on the machine at hand). IPEX did this prepacking
but stopped at torch 2.8, and ``torch.compile``'s freezing recompiles per input shape; so the layer calls torch's
own oneDNN ops (``torch.ops.mkldnn``), which inductor uses for the same purpose.

A bfloat16 layer is packed too where the CPU computes bf16 natively (AVX-512 BF16 or AMX: ``native_bf16``); on a
2-core AVX-512 BF16 EPYC, SmolLM2 in bf16 then writes 0.72x float32's time per character, 0.78x with grounded
decoding (``experiments/grounded/runtime_ratio.py``). Elsewhere bf16 takes torch's path.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

from .precision import native_bf16

__all__ = ["PackedLinear", "pack_linear_layers", "unpack_linear_layers"]

logger = logging.getLogger(__name__)

#: the row count oneDNN is told to expect: 2 keeps one token as fast as a GEMV and 8 rows close to it
ROWS_HINT = 2
#: whether this torch was built with oneDNN (x86 and most ARM wheels are)
ONEDNN = torch.backends.mkldnn.is_available()
#: where a module keeps its packed copy, as ``(data pointer, version, packed weight)`` in its ``__dict__``
PACKED = "_packed"


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose float32 CPU inference (and bfloat16, on a CPU with native bf16) runs on a
    oneDNN-prepacked copy of its weight.

    The copy is made at the first such call and again whenever the weight changes (its storage, version counter or
    shape). Training (a gradient to compute), autocast, other devices and dtypes take ``nn.Linear``'s own path.
    Parameters and state dict are ``nn.Linear``'s, so saving, peft and ``.to()`` see a plain layer. The copy
    costs the weight's size in memory once the layer has run on a CPU. A write through ``weight.data`` bypasses the
    version counter (peft's ``merge_adapter`` does that): call :func:`pack_linear_layers` again after it.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(..., in_features)`` -> ``(..., out_features)``."""
        weight = self.weight
        if (
            x.dtype is not weight.dtype
            or not (weight.dtype is torch.float32 or (weight.dtype is torch.bfloat16 and cpu_bf16()))
            or not (x.is_cpu and weight.is_cpu and ONEDNN)
            or x.numel() == 0
            or torch.is_autocast_enabled("cpu")
            or (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
        ):
            if not weight.is_cpu:
                self.__dict__.pop(PACKED, None)  # a copy from a CPU run is of no use now
            return F.linear(x, weight, self.bias)
        # this runs ~200 times a decoding step: the checks above and below stay cheap attribute reads
        packed = self.__dict__.get(PACKED)
        pointer, version = weight.data_ptr(), weight._version
        if packed is None or packed[0] != pointer or packed[1] != version or packed[2].shape != weight.shape:
            packed = pointer, version, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
            self.__dict__[PACKED] = packed
        x = x if x.is_contiguous() else x.contiguous()
        return torch.ops.mkldnn._linear_pointwise(x, packed[2], self.bias, "none", [], "")

    def __getstate__(self) -> dict:
        """Pickling and ``copy.deepcopy`` leave the packed copy behind (oneDNN's layout has no storage to save):
        it is remade on the next call."""
        return {name: value for name, value in super().__getstate__().items() if name != PACKED}


@functools.cache
def cpu_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (asked once: ``native_bf16``)."""
    return native_bf16(torch.device("cpu"))


def pack_linear_layers(module: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` inside ``module`` into a :class:`PackedLinear`, in place; returns how many.

    Nothing is copied until a layer runs on a CPU in float32 (or native bf16) without a gradient; layers packed before
    drop their copies (to be made again from the weights as they are now). Where torch was built without oneDNN,
    nothing changes (0).
    """
    if not torch.backends.mkldnn.is_available():
        logger.info("torch has no oneDNN here: linear layers keep torch's own CPU path")
        return 0
    layers = [layer for layer in module.modules() if type(layer) in (nn.Linear, PackedLinear)]
    for layer in layers:
        layer.__dict__.pop(PACKED, None)
        layer.__class__ = PackedLinear
    return len(layers)


def unpack_linear_layers(module: nn.Module) -> int:
    """Undo :func:`pack_linear_layers`: every :class:`PackedLinear` becomes a plain ``nn.Linear`` again."""
    layers = [layer for layer in module.modules() if type(layer) is PackedLinear]
    for layer in layers:
        layer.__dict__.pop(PACKED, None)
        layer.__class__ = nn.Linear
    return len(layers)
