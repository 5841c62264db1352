"""Phrase scoring: LM hidden states against phrase output vectors (Eq. 1 of the paper).

Kept behind one small module so a large-vocabulary head (a shortlist that scores
only a few thousand candidates) can replace the exact dot product. Such a scorer may also
define ``sparse(hidden, vectors) -> (ids, scores) | None``, each position's candidates
``(B, T, C)`` with ``P`` as padding: ``DynamicVocabLM`` then writes them into its logits
instead of concatenating a dense ``(B, T, P)`` block (``ShortlistScorer`` does).
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
        The states go in as one ``(B*T, d)`` matrix: a bf16 product with a ``(1, 1, d)`` slice of a longer
        sequence (a size-1 dimension with a large stride) takes a CPU path 30x slower.
        """
        flat = hidden.reshape(-1, hidden.shape[-1]).to(phrase_vectors.dtype)
        scores = (flat @ phrase_vectors.T).to(hidden.dtype).view(*hidden.shape[:-1], -1)
        if phrase_mask is not None:
            scores = scores.masked_fill(~phrase_mask[:, None, :], float("-inf"))
        return scores
