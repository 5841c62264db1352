"""Closeness to what the author wrote next: ROUGE-1/2/L per text, and paired bootstrap intervals between systems.

ROUGE comes from Google's ``rouge-score`` (the reference implementation the summarization literature reports),
F-measure with Porter stemming. Two systems are compared on the same prompts: the bootstrap resamples prompts, so
the interval of the mean difference carries the prompts' spread, not two independent ones. Prompts cut from one
document (several windows of it) are resampled together, as one cluster: their differences are not independent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["ROUGE_TYPES", "PairedDifference", "paired_bootstrap", "rouge_scores"]

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge_scores(texts: Sequence[str], references: Sequence[str]) -> dict[str, list[float]]:
    """ROUGE-1/2/L F-measures ×100 of each text against its reference: ``{"rouge1": [...], ...}``."""
    from rouge_score.rouge_scorer import RougeScorer

    if len(texts) != len(references):
        raise ValueError(f"{len(texts)} texts against {len(references)} references: pass one reference per text")
    scorer = RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    scores = [scorer.score(reference, text) for text, reference in zip(texts, references)]
    return {kind: [100 * s[kind].fmeasure for s in scores] for kind in ROUGE_TYPES}


@dataclass(frozen=True)
class PairedDifference:
    """The mean of ``a - b`` over paired items and its bootstrap interval (``confidence``, percentile)."""

    mean: float
    low: float
    high: float
    confidence: float
    samples: int

    def cell(self) -> str:
        return f"{self.mean:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def paired_bootstrap(a: Sequence[float], b: Sequence[float], samples: int = 2000, confidence: float = 0.95,
                     seed: int = 0, groups: Sequence[str] | None = None) -> PairedDifference:
    """The mean difference ``a - b`` of paired figures (one per prompt) with a percentile bootstrap interval over
    ``samples`` resamplings of the prompts; with ``groups`` (one label per prompt, e.g. its document), of the groups,
    each drawn with all its prompts (a cluster bootstrap)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired_bootstrap needs two equal, non-empty lists of figures, got {a.shape} and {b.shape}")
    if groups is not None and len(groups) != len(a):
        raise ValueError(f"{len(groups)} group labels for {len(a)} paired figures: pass one label per prompt")
    differences = a - b
    cluster = np.arange(len(a)) if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    sums = np.bincount(cluster, weights=differences)
    counts = np.bincount(cluster).astype(np.float64)
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, len(sums), (samples, len(sums)))
    means = sums[drawn].sum(axis=1) / counts[drawn].sum(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return PairedDifference(float(differences.mean()), float(low), float(high), confidence, samples)
