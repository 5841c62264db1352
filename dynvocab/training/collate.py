"""Collate mixed samples into the two aligned views the loss needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..tokens.padding import pad_sequences
from .samples import MixedSample

__all__ = ["MixedBatch", "collate"]


@dataclass
class MixedBatch:
    """One batch in both views, right-padded.

    Attributes:
        token_ids: ``(B, Tt)`` the plain text in LM tokens.
        token_mask: ``(B, Tt)``.
        mixed_ids: ``(B, Tm)`` the same text with each gold span replaced by ``V + phrase index``.
        mixed_mask: ``(B, Tm)``.
        sigma: ``(B, Tm)`` token-view position aligned with each mixed position: a token
            maps to its own position, a phrase to the position of its last token.
        phrases: ``P`` distinct token-id tuples (golds first, then negatives).
        phrase_mask: ``(B, P)`` which phrases each row may emit.
    """

    token_ids: torch.Tensor
    token_mask: torch.Tensor
    mixed_ids: torch.Tensor
    mixed_mask: torch.Tensor
    sigma: torch.Tensor
    phrases: list[tuple[int, ...]]
    phrase_mask: torch.Tensor

    def to(self, device) -> "MixedBatch":
        for name in ("token_ids", "token_mask", "mixed_ids", "mixed_mask", "sigma", "phrase_mask"):
            setattr(self, name, getattr(self, name).to(device))
        return self


def collate(
    samples: Sequence[MixedSample],
    negatives: Sequence[tuple[int, ...]],
    vocab_size: int,
    in_batch: bool = True,
    pad_id: int = 0,
) -> MixedBatch:
    """Build both views of ``samples`` with the phrase set ``golds + negatives``.

    With ``in_batch`` every row may emit every gold phrase of the batch (in-batch
    negatives); without, a row sees only its own golds and the shared negatives.
    """
    golds = list(dict.fromkeys(p for s in samples for p in s.phrases()))
    phrases = golds + [n for n in dict.fromkeys(negatives) if n not in set(golds)]
    index = {p: i for i, p in enumerate(phrases)}
    mixed_rows, sigma_rows = [], []
    for sample in samples:
        ids, sigma, position = [], [], 0
        for start, end in sample.phrase_spans:
            ids += sample.token_ids[position:start]
            sigma += range(position, start)
            ids.append(vocab_size + index[tuple(sample.token_ids[start:end])])
            sigma.append(end - 1)
            position = end
        ids += sample.token_ids[position:]
        sigma += range(position, len(sample.token_ids))
        mixed_rows.append(ids)
        sigma_rows.append(sigma)
    token_ids, token_mask = pad_sequences([s.token_ids for s in samples], pad_id)
    mixed_ids, mixed_mask = pad_sequences(mixed_rows, pad_id)
    sigma, _ = pad_sequences(sigma_rows)
    phrase_mask = torch.ones(len(samples), len(phrases), dtype=torch.bool)
    if not in_batch:
        phrase_mask[:, : len(golds)] = False
        for row, sample in enumerate(samples):
            for phrase in sample.phrases():
                phrase_mask[row, index[phrase]] = True
    return MixedBatch(token_ids, token_mask, mixed_ids, mixed_mask, sigma, phrases, phrase_mask)

