"""Ranking metrics shared by every retriever: MRR@k, Recall@k, Hits@k, nDCG@k.

Each takes ``rankings`` (one ranked list of document ids per query, best first) and
``relevant`` (the set of relevant ids per query, or a single id) and returns the mean
over queries as a fraction in [0, 1]. Relevance is binary, as in MS MARCO and BEIR's
use of FanOutQA-style evidence pages.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

from dynvocab.config import as_int

__all__ = ["hits_at_k", "mrr_at_k", "ndcg_at_k", "paired_difference_interval", "paired_relative_interval",
           "per_query_metrics", "ranking_metrics", "recall_at_k", "reciprocal_ranks"]

Relevant = Hashable | set | frozenset | list | tuple


def reciprocal_ranks(rankings: Sequence[Sequence[Hashable]], relevant: Sequence[Relevant], k: int = 10) -> list[float]:
    """Per query, 1/rank of the first relevant id within the top ``k`` (0 if none)."""
    return [next((1.0 / rank for rank, doc in enumerate(ranking[:k], 1) if doc in gold), 0.0)
            for ranking, gold in _pairs(rankings, relevant, k)]


def mrr_at_k(rankings: Sequence[Sequence[Hashable]], relevant: Sequence[Relevant], k: int = 10) -> float:
    """Mean over queries of 1/rank of the first relevant id within the top ``k`` (0 if none)."""
    return _mean(reciprocal_ranks(rankings, relevant, k))


def paired_relative_interval(base: Sequence[float], other: Sequence[float], resamples: int = 2000, level: float = 0.95,
                             seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(other) / mean(base) - 1`` over the same queries, resampled in pairs
    (e.g. per-query reciprocal ranks of a shortlist and of full scoring): how far a relative change is from noise."""
    if len(base) != len(other) or not base:
        raise ValueError(f"base and other must be per-query values of the same queries; got {len(base)} and {len(other)}")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level={level} must lie in (0, 1) and resamples={resamples} be >= 1")
    picked = np.random.default_rng(seed).integers(len(base), size=(resamples, len(base)))
    totals = np.asarray(base, dtype=np.float64)[picked].sum(1)
    changes = np.where(totals > 0, np.asarray(other, dtype=np.float64)[picked].sum(1) / np.maximum(totals, 1e-300) - 1, 0.0)
    low, high = np.quantile(changes, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def paired_difference_interval(base: Sequence[float], other: Sequence[float], resamples: int = 2000,
                               level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(other) - mean(base)`` over the same queries, resampled in pairs: an
    interval above zero says ``other`` is ahead by more than the choice of queries explains."""
    if len(base) != len(other) or not len(base):
        raise ValueError(f"base and other must be per-query values of the same queries; got {len(base)} and {len(other)}")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level={level} must lie in (0, 1) and resamples={resamples} be >= 1")
    picked = np.random.default_rng(seed).integers(len(base), size=(resamples, len(base)))
    differences = (np.asarray(other, dtype=np.float64) - np.asarray(base, dtype=np.float64))[picked].mean(1)
    low, high = np.quantile(differences, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def per_query_metrics(rankings: Sequence[Sequence[Hashable]], relevant: Sequence[Relevant],
                      recall_ks: Sequence[int] = (1, 5, 10, 32), hits_ks: Sequence[int] = (5,)) -> dict[str, list[float]]:
    """``{"recall@k", "hits@k" for each k, "mrr@10", "ndcg@10": one value per query}``: the inputs of paired
    intervals; their means are :func:`ranking_metrics`' and :func:`hits_at_k`'s figures."""
    for _ in _pairs(rankings, relevant, 1):  # checks the inputs before the per-query calls below
        pass
    metrics = {f"recall@{k}": [recall_at_k([r], [g], k) for r, g in zip(rankings, relevant)] for k in recall_ks}
    metrics.update({f"hits@{k}": [hits_at_k([r], [g], k) for r, g in zip(rankings, relevant)] for k in hits_ks})
    metrics["mrr@10"] = reciprocal_ranks(rankings, relevant, 10)
    metrics["ndcg@10"] = [ndcg_at_k([r], [g], 10) for r, g in zip(rankings, relevant)]
    return metrics


def recall_at_k(rankings: Sequence[Sequence[Hashable]], relevant: Sequence[Relevant], k: int) -> float:
    """Mean over queries of the share of relevant ids found in the top ``k``."""
    return _mean(len(gold & set(ranking[:k])) / len(gold) for ranking, gold in _pairs(rankings, relevant, k))


def hits_at_k(rankings: Sequence[Sequence[Hashable]], relevant: Sequence[Relevant], k: int) -> float:
    """Mean over queries of 1 if any relevant id is in the top ``k``, else 0."""
    return _mean(float(bool(gold & set(ranking[:k]))) for ranking, gold in _pairs(rankings, relevant, k))


def ndcg_at_k(rankings: Sequence[Sequence[Hashable]], relevant: Sequence[Relevant], k: int = 10) -> float:
    """Mean over queries of DCG@k / ideal DCG@k with binary gains and a log2(rank + 1) discount."""

    def ndcg(ranking: Sequence[Hashable], gold: set) -> float:
        dcg = sum(1.0 / math.log2(rank + 1) for rank, doc in enumerate(ranking[:k], 1) if doc in gold)
        ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(k, len(gold)) + 1))
        return dcg / ideal

    return _mean(ndcg(ranking, gold) for ranking, gold in _pairs(rankings, relevant, k))


def ranking_metrics(
    rankings: Sequence[Sequence[Hashable]], relevant: Sequence[Relevant], recall_ks: Sequence[int] = (5, 20, 100)
) -> dict[str, float]:
    """MRR@10, nDCG@10 and Recall@k for each k, as one flat dict (the report's row)."""
    metrics = {"mrr@10": mrr_at_k(rankings, relevant, 10), "ndcg@10": ndcg_at_k(rankings, relevant, 10)}
    metrics.update({f"recall@{k}": recall_at_k(rankings, relevant, k) for k in recall_ks})
    return metrics


def _pairs(rankings, relevant, k: int):
    k = as_int(k, "k", minimum=1)
    if isinstance(rankings, str) or isinstance(relevant, str):
        raise TypeError("rankings and relevant must be one entry per query (lists), not a string")
    if len(rankings) != len(relevant):
        raise ValueError(
            f"got {len(rankings)} rankings but {len(relevant)} relevance entries; pass one of each per query"
        )
    if not rankings:
        raise ValueError("no queries: pass at least one ranking")
    for ranking, gold in zip(rankings, relevant):
        gold = set(gold) if isinstance(gold, (set, frozenset, list, tuple)) else {gold}
        if not gold:
            raise ValueError("a query has no relevant id; drop it or give its relevant ids")
        yield ranking, gold


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)
