"""Linear layers that run on a oneDNN-prepacked copy of their weight at CPU inference.

torch's float32 ``nn.Linear`` on a CPU calls MKL, whose GEMM over 2 to 8 rows costs 2 to 3x its GEMV over one:
a forward over a phrase's or a draft's few tokens then costs 1.3 to 1.6x a one-token step. oneDNN with the
weight reordered once into its blocked layout runs 1 to 8 rows in about the time of one, and one row faster than
MKL's GEMV (``examples/benchmark_packed_linear.py`` prints both on the machine at hand). IPEX did this prepacking
but stopped at torch 2.8, and ``torch.compile``'s freezing recompiles per input shape; so the layer calls torch's
own oneDNN ops (``torch.ops.mkldnn``), which inductor uses for the same purpose.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["PackedLinear", "pack_linear_layers", "unpack_linear_layers"]

logger = logging.getLogger(__name__)

#: the row count oneDNN is told to expect: 2 keeps one token as fast as a GEMV and 8 rows close to it
ROWS_HINT = 2


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose float32 CPU inference runs on a prepacked copy of its weight.

    The copy is made at the first such call and again whenever the weight changes (its storage or version
    counter). Training (a gradient to compute), other devices and dtypes take ``nn.Linear``'s own path.
    Parameters and state dict are ``nn.Linear``'s, so saving, peft and ``.to()`` see a plain layer. The copy
    costs the weight's size in memory once the layer has run on a CPU.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``(..., in_features)`` -> ``(..., out_features)``."""
        weight = self.weight
        if (
            weight.device.type != "cpu"
            or x.device.type != "cpu"
            or weight.dtype != torch.float32
            or x.dtype != torch.float32
            or x.numel() == 0
            or (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
        ):
            if weight.device.type != "cpu":
                self.__dict__.pop("_packed", None)  # a copy from a CPU run is of no use now
            return F.linear(x, weight, self.bias)
        key = (weight.data_ptr(), weight._version)
        packed = self.__dict__.get("_packed")
        if packed is None or packed[0] != key:
            packed = key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS_HINT)
            self.__dict__["_packed"] = packed
        rows = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, x.shape[-1]).contiguous(), packed[1], self.bias, "none", [], ""
        )
        return rows.reshape(*x.shape[:-1], self.out_features)

    def __getstate__(self) -> dict:
        """Pickling and ``copy.deepcopy`` leave the packed copy behind: it is remade on the next call."""
        return {name: value for name, value in super().__getstate__().items() if name != "_packed"}


def pack_linear_layers(module: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` inside ``module`` into a :class:`PackedLinear`, in place; returns how many.

    Nothing is copied until a layer runs on a CPU in float32 without a gradient. Where torch was built without
    oneDNN, nothing changes (0).
    """
    if not torch.backends.mkldnn.is_available():
        logger.info("torch has no oneDNN here: linear layers keep torch's own CPU path")
        return 0
    layers = [layer for layer in module.modules() if type(layer) is nn.Linear]
    for layer in layers:
        layer.__class__ = PackedLinear
    return len(layers)


def unpack_linear_layers(module: nn.Module) -> int:
    """Undo :func:`pack_linear_layers`: every :class:`PackedLinear` becomes a plain ``nn.Linear`` again."""
    layers = [layer for layer in module.modules() if type(layer) is PackedLinear]
    for layer in layers:
        layer.__dict__.pop("_packed", None)
        layer.__class__ = nn.Linear
    return len(layers)
