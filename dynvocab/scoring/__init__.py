"""Scoring the next id over tokens and phrases: every phrase by dot product, or a learned shortlist of them for huge
phrase tables."""

from .dot_product import DotProductScorer
from .shortlist_head import ShortlistConfig, ShortlistHead
from .shortlist_scorer import ShortlistScorer

__all__ = [
    "DotProductScorer",
    "ShortlistConfig",
    "ShortlistHead",
    "ShortlistScorer",
]
