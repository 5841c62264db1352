"""Rows in and out of a running batch's KV cache (``transformers``' ``DynamicCache``, ``(B, heads, slots, head_dim)``
per layer): keep some rows, drop or add slots on the left, and lay a joining group's slots into the batch's.

Only full-attention layers (``DynamicLayer``) can be laid out this way: a sliding-window layer keeps the last
window of slots, which a row joining with fewer slots would not fill alike.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

__all__ = ["check_layers", "drop_leading_slots", "join_rows", "pad_leading_slots", "select_rows"]


def check_layers(cache: DynamicCache) -> None:
    """Refuse a cache with layers other than full-attention ``DynamicLayer`` s, naming the fix."""
    odd = {type(layer).__name__ for layer in cache.layers
           if not isinstance(layer, DynamicLayer) or isinstance(layer, DynamicSlidingWindowLayer)}
    if odd:
        raise ValueError(f"continuous batching lays rows into a full-attention KV cache, but this LM's cache has "
                         f"{sorted(odd)} layers; serve it with --max-batch-size 1")


def select_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep only ``rows`` ``(k,)`` of every layer, in that order."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]


def drop_leading_slots(cache: DynamicCache, slots: int) -> None:
    """Drop the first ``slots`` slots of every row (slots no row attends to)."""
    if slots:
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, slots:], layer.values[:, :, slots:]


def pad_leading_slots(cache: DynamicCache, slots: int) -> None:
    """Add ``slots`` zero slots before every row's first (masked out by the caller)."""
    if slots:
        for layer in cache.layers:
            layer.keys, layer.values = (torch.cat([t.new_zeros(*t.shape[:2], slots, t.shape[3]), t], dim=2)
                                        for t in (layer.keys, layer.values))


def join_rows(cache: DynamicCache, joining: DynamicCache, at: torch.Tensor) -> None:
    """Append ``joining`` 's rows to ``cache``: joining slot ``j`` goes to slot ``at[j]`` of the batch's layout,
    every other slot of the new rows is zero (masked out by the caller).

    Args:
        at: ``(S_j,)`` increasing slot indices of ``cache``, one per slot of ``joining``.
    """
    for layer, new in zip(cache.layers, joining.layers, strict=True):
        for name in ("keys", "values"):
            held, added = getattr(layer, name), getattr(new, name)
            placed = held.new_zeros(added.shape[0], *held.shape[1:])
            placed[:, :, at] = added.to(held.dtype)
            setattr(layer, name, torch.cat([held, placed]))
