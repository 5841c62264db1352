"""The hybrid's fusion weight: how much the sparse part counts, chosen on held-out queries after fine-tuning.

A hybrid scores ``dense . dense + w * sparse . sparse``. Training uses ``w = 1``; afterwards the inverse-cloze pairs
that no training step drew (their sentences never seen as queries) are searched over ``documents`` training documents
(their own, with the sentence cut out, and others at random), and ``w`` is chosen by the one-standard-error rule: the
smallest ``w`` of the grid whose MRR@10 is within one standard error (of its paired per-query difference) of the best
one's. ``w = 0`` is in the grid, so a sparse part that does not help beyond noise is switched off rather than kept on
the strength of a difference the held-out queries cannot resolve.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import numpy as np
import torch

from encoders.hybrid import HybridEncoder, HybridVectors

from .pairs import Pair
from .pretraining import step_indices

__all__ = ["FUSION_WEIGHTS", "choose_sparse_weight", "fusion_reciprocal_ranks", "held_out_pairs",
           "one_standard_error_choice", "sparse_matrix"]

logger = logging.getLogger(__name__)

#: the fusion weights tried; 0 turns the sparse part off
FUSION_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0)


def held_out_pairs(pairs: Sequence[Pair], titles: set[str], steps: int, batch_size: int, seed: int, processes: int = 1,
                   count: int = 500) -> list[Pair]:
    """Up to ``count`` inverse-cloze pairs (query not a title) that none of ``steps`` training steps drew."""
    drawn = {row for step in range(steps) for process in range(processes)
             for row in step_indices(step, batch_size, len(pairs), seed, process, processes)}
    return [pair for row, pair in enumerate(pairs) if row not in drawn and pair[0] not in titles][:count]


def sparse_matrix(vectors: HybridVectors, vocab_size: int) -> torch.Tensor:
    """``(n, V)`` sparse COO tensor of the top-k entries."""
    rows = np.repeat(np.arange(len(vectors)), vectors.ids.shape[1])
    indices = torch.from_numpy(np.stack([rows, vectors.ids.reshape(-1)]))
    return torch.sparse_coo_tensor(indices, torch.from_numpy(vectors.values.reshape(-1)), (len(vectors), vocab_size),
                                   check_invariants=True)


def fusion_reciprocal_ranks(dense: np.ndarray, sparse: np.ndarray, positives: np.ndarray,
                            weights: Sequence[float] = FUSION_WEIGHTS, k: int = 10) -> dict[float, np.ndarray]:
    """Per-query reciprocal rank (0 beyond ``k``) of ``dense + w * sparse`` scores ``(q, n)`` for each ``w``: ``{w: (q,)}``;
    ``positives (q,)`` the relevant column. Ties count against the positive (a document scoring the same ranks above)."""
    out = {}
    for weight in weights:
        scores = dense + weight * sparse
        own = scores[np.arange(len(scores)), positives]
        ranks = (scores >= own[:, None]).sum(1)  # the positive itself included: rank 1 when nothing ties or beats it
        out[float(weight)] = np.where(ranks <= k, 1.0 / ranks, 0.0)
    return out


def one_standard_error_choice(reciprocal_ranks: dict[float, np.ndarray]) -> float:
    """The smallest weight whose mean is within one standard error of the best one's, the error being that of the
    paired per-query difference between the two (Breiman's one-standard-error rule)."""
    means = {w: float(np.mean(r)) for w, r in reciprocal_ranks.items()}
    best = max(means, key=means.get)
    for weight in sorted(means):
        difference = reciprocal_ranks[best] - reciprocal_ranks[weight]
        error = float(np.std(difference, ddof=1) / np.sqrt(len(difference))) if len(difference) > 1 else 0.0
        if means[best] - means[weight] <= error:
            return weight
    return best


def choose_sparse_weight(encoder: HybridEncoder, queries: list[Pair], documents: list[dict], corpus_size: int = 4000,
                         weights: Sequence[float] = FUSION_WEIGHTS, seed: int = 0) -> tuple[float, dict[float, float], int]:
    """``(chosen w, {w: MRR@10}, documents searched)`` of ``encoder`` (its parts scored at ``w = 1``) on ``queries`` over a corpus of their
    own documents (as the pairs give them: the sentence cut out) plus other ``documents`` up to ``corpus_size``; the
    choice follows :func:`one_standard_error_choice`."""
    if not queries:
        raise ValueError("no held-out queries to choose the fusion weight on; every pair was drawn for training "
                         "(train fewer steps, or pass fusion_queries=0 to keep the weight at 1)")
    own = {pair[2]: pair[1] for pair in queries}
    others = [d for d in documents if d["id"] not in own]
    extra = random.Random(seed).sample(others, max(0, min(len(others), corpus_size - len(own))))
    keys = list(own) + [d["id"] for d in extra]
    texts = list(own.values()) + [d["text"] for d in extra]
    column = {key: i for i, key in enumerate(keys)}
    unit = encoder.with_sparse_weight(1.0).eval()
    docs = unit.encode(texts, show_progress_bar=True)
    found = unit.encode([pair[0] for pair in queries], show_progress_bar=False)
    dense = found.dense @ docs.dense.T
    sparse = torch.sparse.mm(sparse_matrix(docs, unit.vocab_size), sparse_matrix(found, unit.vocab_size).to_dense().T)
    ranks = fusion_reciprocal_ranks(dense, sparse.T.numpy(), np.array([column[pair[2]] for pair in queries]), weights)
    table = {w: float(np.mean(r)) for w, r in ranks.items()}
    chosen = one_standard_error_choice(ranks)
    logger.info("fusion weight %.2g (MRR@10 %.4f, the best %.4f, over %d held-out queries and %d documents; %s)", chosen,
                table[chosen], max(table.values()), len(queries), len(texts),
                ", ".join(f"w={w:g}: {m:.4f}" for w, m in table.items()))
    return chosen, table, len(texts)
