"""PIXAR's training loss of a non-autoregressive retriever, computed without a ``[B*s, |V|]`` tensor.

``l1``: cross-entropy at each docid position ``t`` of ``softmax(h_t · W)`` against the docid's
token there (its end id included); ``l2``: cross-entropy of ``x0``'s softmax ``softmax(x0 · W)``
against every token of the docid; ``l3``: self-normalisation, the mean of ``(log Σ_v exp(h_t · w_v))^2``
over the scored positions, so that raw scores can stand for log-probabilities on a shortlist.
Every ``log Σ exp`` is taken over chunks of the vocabulary (``dynvocab.scoring.shortlist_head.chunked_logsumexp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dynvocab.config import check_at_least
from dynvocab.scoring.shortlist_head import chunked_logsumexp

__all__ = ["NarLossWeights", "nar_loss"]

IGNORE = -100


@dataclass(frozen=True)
class NarLossWeights:
    """``loss = l1 + docid_weight * l2 + normalisation_weight * l3``."""

    docid_weight: float = 0.25
    normalisation_weight: float = 1.0

    def __post_init__(self) -> None:
        check_at_least(self, 0, ("docid_weight", "normalisation_weight"))


def nar_loss(x0: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, end_id: int,
             weights: NarLossWeights = NarLossWeights(), chunk: int = 65536) -> dict[str, torch.Tensor]:
    """``(B, d)`` shortlist embeddings, ``(B, s, d)`` position embeddings, ``(V, d)`` output layer and
    ``(B, s)`` targets (each docid closed by ``end_id``, ``-100`` after it) -> ``{"l1", "l2", "l3", "loss"}``."""
    if targets.shape != positions.shape[:2]:
        raise ValueError(f"targets {tuple(targets.shape)} must be (B, s) = {tuple(positions.shape[:2])}")
    scored = targets != IGNORE
    if not bool(scored.any()):
        raise ValueError("every target is -100; each docid needs at least its end id")
    states = positions[scored]  # (n, d)
    gold = targets[scored]
    position_lse = chunked_logsumexp(states, weight, chunk)
    gold_scores = (states.to(weight.dtype) * weight[gold]).sum(-1).float()
    l1 = (position_lse - gold_scores).mean()
    # l2: x0 against every docid token; the end id closes every docid and says nothing of the document
    tokens = scored & (targets != end_id)
    rows = tokens.nonzero(as_tuple=True)[0]
    x0_lse = chunked_logsumexp(x0, weight, chunk)
    x0_scores = (x0[rows].to(weight.dtype) * weight[targets[tokens]]).sum(-1).float()
    l2 = (x0_lse[rows] - x0_scores).mean() if rows.numel() else x0_lse.sum() * 0
    l3 = (position_lse**2).mean()
    loss = l1 + weights.docid_weight * l2 + weights.normalisation_weight * l3
    return {"l1": l1, "l2": l2, "l3": l3, "loss": loss}

