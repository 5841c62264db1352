"""What the device computes fast: bf16 where it has it, linear layers on oneDNN-prepacked weights and attention over
grouped key/value heads uncopied on CPUs."""

from .attention import grouped_sdpa_attention, use_grouped_attention
from .packed_linear import PackedLinear, pack_linear_layers, unpack_linear_layers
from .precision import encode_autocast, encode_autocast_dtype, mixed_precision, native_bf16

__all__ = [
    "PackedLinear",
    "encode_autocast",
    "grouped_sdpa_attention",
    "encode_autocast_dtype",
    "mixed_precision",
    "native_bf16",
    "pack_linear_layers",
    "unpack_linear_layers",
    "use_grouped_attention",
]
