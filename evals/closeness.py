"""Closeness to what the author wrote next: ROUGE-1/2/L per text, and paired bootstrap intervals between systems.

ROUGE comes from Google's ``rouge-score`` (the reference implementation the summarization literature reports),
F-measure with Porter stemming. Two systems are compared on the same prompts: the bootstrap resamples prompts, so
the interval of the mean difference carries the prompts' spread, not two independent ones.
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
                     seed: int = 0) -> PairedDifference:
    """The mean difference ``a - b`` of paired figures (one per prompt) with a percentile bootstrap interval over
    ``samples`` resamplings of the prompts."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired_bootstrap needs two equal, non-empty lists of figures, got {a.shape} and {b.shape}")
    differences = a - b
    rng = np.random.default_rng(seed)
    means = differences[rng.integers(0, len(differences), (samples, len(differences)))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return PairedDifference(float(differences.mean()), float(low), float(high), confidence, samples)
