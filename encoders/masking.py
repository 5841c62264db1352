"""The masks of DupMAE pre-training: encoder MLM masking, the decoder's per-row attention mask, BoW targets.

Every function takes a ``torch.Generator`` so that a training step's masks depend only on
the seed and the step, which is what makes a resumed run exact.
"""

from __future__ import annotations

import torch

__all__ = ["IGNORE_INDEX", "bag_of_words_targets", "decoder_attention_mask", "mask_for_mlm", "ordinary_tokens"]

#: label of positions that no loss reads (the value ``torch.nn.functional.cross_entropy`` skips)
IGNORE_INDEX = -100


def ordinary_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: list[int]) -> torch.Tensor:
    """Bool ``(b, t)``: real tokens that are not special ([CLS], [SEP], padding)."""
    special = torch.isin(input_ids, torch.tensor(special_ids, dtype=input_ids.dtype, device=input_ids.device))
    return attention_mask.bool() & ~special


def mask_for_mlm(
    input_ids: torch.Tensor,
    ordinary: torch.Tensor,
    ratio: float,
    mask_token_id: int,
    vocab_size: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of ``ratio`` of the ordinary tokens (80% [MASK], 10% random, 10% kept).

    Returns ``(masked_ids (b, t), labels (b, t))``: labels hold the original id at the
    chosen positions and ``IGNORE_INDEX`` elsewhere.
    """
    device = input_ids.device
    chosen = (torch.rand(input_ids.shape, generator=generator) < ratio).to(device) & ordinary
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    split = torch.rand(input_ids.shape, generator=generator).to(device)
    random_ids = torch.randint(vocab_size, input_ids.shape, generator=generator).to(device)
    masked = torch.where(chosen & (split < 0.8), torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(chosen & (split >= 0.8) & (split < 0.9), random_ids, masked)
    return masked, labels


def decoder_attention_mask(attention_mask: torch.Tensor, ratio: float, generator: torch.Generator) -> torch.Tensor:
    """Bool ``(b, t, t)``: which context positions (columns) each query row of the [CLS] decoder sees.

    Row ``i`` sees position 0 (the [CLS] vector) and a random sample of ``round((1 - ratio) * (n - 2))``
    of the other ``n - 2`` real positions (``n`` real tokens, ``i`` and 0 excluded), never itself and
    never padding: RetroMAE's enhanced decoding. Row 0 and padded rows see only position 0.
    """
    batch, length = attention_mask.shape
    real = attention_mask.bool().cpu()
    positions = torch.arange(length)
    visible = torch.zeros(batch, length, length, dtype=torch.bool)
    visible[:, :, 0] = True
    scores = torch.rand(batch, length, length, generator=generator)
    candidates = real[:, None, :] & (positions[None, :, None] != positions[None, None, :])
    candidates[:, :, 0] = False
    candidates[:, 0, :] = False
    candidates &= real[:, :, None]
    scores = scores.masked_fill(~candidates, 2.0)
    order = scores.argsort(dim=-1)
    counts = torch.round((1.0 - ratio) * (real.sum(dim=1) - 2).clamp(min=0).float()).long()
    ranks = torch.empty_like(order)
    ranks.scatter_(-1, order, positions.expand_as(order))
    visible |= candidates & (ranks < counts[:, None, None])
    return visible.to(attention_mask.device)


def bag_of_words_targets(input_ids: torch.Tensor, ordinary: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Float ``(b, V)``: 1 / (number of unique ordinary tokens) on each of them, 0 elsewhere (rows sum to 1)."""
    targets = torch.zeros(input_ids.shape[0], vocab_size, device=input_ids.device)
    targets.scatter_add_(1, torch.where(ordinary, input_ids, 0), ordinary.float())
    targets = (targets > 0).float()
    return targets / targets.sum(dim=1, keepdim=True).clamp(min=1.0)
