"""Padding id lists into batches, and reading positions back from the attention mask."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["first_token_index", "last_token_index", "pad_id", "pad_sequences", "position_ids_from_mask"]


def pad_sequences(
    sequences: Sequence[Sequence[int]], pad_id: int = 0, side: str = "right", device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad id lists into ``(B, L)`` ids and a ``(B, L)`` 0/1 attention mask, on the ``side`` given."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        start = width - len(seq) if side == "left" else 0
        ids[row, start : start + len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, start : start + len(seq)] = 1
    return ids.to(device), mask.to(device)


def pad_id(tokenizer) -> int:
    """Id written into padded positions: the tokenizer's pad token, else its end-of-text token, else 0."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``(B, L)`` positions counting attended tokens only, so left padding does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last attended position of each row, for left or right padding. ``(B, L) -> (B,)``."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.long() * positions).argmax(dim=1)


def first_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the first attended position of each row. ``(B, L) -> (B,)``."""
    return attention_mask.long().argmax(dim=1)
