"""Phrase scoring: LM hidden states against phrase output vectors (Eq. 1 of the paper).

Kept behind one small module so a large-vocabulary head (a shortlist that scores
only a few thousand candidates) can replace the exact dot product.
"""

from __future__ import annotations

import torch
from torch import nn


class DotProductScorer(nn.Module):
    """Exact scores ``h · e_out(p)`` for every phrase, ``-inf`` where a row may not use a phrase."""

    def forward(
        self, hidden: torch.Tensor, phrase_vectors: torch.Tensor, phrase_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``(B, T, d)`` hidden states, ``(P, d)`` vectors, optional ``(B, P)`` bool mask -> ``(B, T, P)``.

        Computed in the vectors' dtype (a bf16 table is read at half the bytes), returned in the hidden states'.
        """
        scores = (hidden.to(phrase_vectors.dtype) @ phrase_vectors.T).to(hidden.dtype)
        if phrase_mask is not None:
            scores = scores.masked_fill(~phrase_mask[:, None, :], float("-inf"))
        return scores
