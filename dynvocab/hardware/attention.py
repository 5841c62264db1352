"""Attention over grouped key/value heads without copying them out to every query head, on a CPU.

transformers' SDPA attention hands an LM with grouped-query attention (Llama, SmolLM2: 9 query heads over 3 key/value
heads) to torch's SDPA as it is only where no mask is given; a forward over several new tokens after a cache carries
a mask, so it copies every layer's cached keys and values out to all query heads first (``repeat_kv``): on a 2-core
CPU a 2-token forward after 800 cached tokens then costs 1.3x a one-token step, and that is the forward every drafted
or verified step makes. torch's CPU SDPA takes grouped heads with a mask (``enable_gqa``), with the same kernel, so
:func:`grouped_sdpa_attention` passes them as they are there and leaves every other case to transformers' own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

__all__ = ["GROUPED_SDPA", "grouped_sdpa_attention", "use_grouped_attention"]

#: the name the attention function is registered under with transformers
GROUPED_SDPA = "dynvocab_grouped_sdpa"


def grouped_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, with grouped key/value heads passed to torch's SDPA as they are on a CPU.

    ``query`` ``(B, H, T, d)``, ``key`` and ``value`` ``(B, H_kv, S, d)``, ``attention_mask`` ``(B, 1, T, S)`` or None;
    returns ``(B, T, H, d)`` and no attention weights, as transformers' attention functions do.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    plain = (
        query.device.type != "cpu"
        or groups == 1
        or query.shape[2] == 1  # one query token: transformers folds the groups into the query, copying nothing
        or any(kwargs.get(name) is not None for name in ("position_bias", "cache", "softcap"))
        or kwargs.get("output_attentions", False)
    )
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = attention_mask is None and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if causal and key.shape[2] > query.shape[2]:  # transformers' rule: a prefill with room left in a static cache
        key, value = key[:, :, : query.shape[2]], value[:, :, : query.shape[2]]
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                            scale=scaling, is_causal=bool(causal), enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)  # the masks SDPA takes (none where causal will do)


def use_grouped_attention(lm: nn.Module) -> bool:
    """Have ``lm`` (a transformers model) attend with :func:`grouped_sdpa_attention` where it attends with SDPA now;
    returns whether it changed. The same numbers on every device; only a CPU forward over several tokens differs, in
    what it copies."""
    config = getattr(lm, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    lm.set_attn_implementation(GROUPED_SDPA)
    return True
