"""Phrase vocabularies that change at run time for Hugging Face causal LMs."""

from .config import DynamicVocabConfig
from .model import DynamicVocabLM
from .phrase_encoder import PhraseEncoder
from .phrase_table import Phrase, PhraseTable
from .scoring import DotProductScorer
from .text import Segment

__all__ = [
    "DotProductScorer",
    "DynamicVocabConfig",
    "DynamicVocabLM",
    "Phrase",
    "PhraseEncoder",
    "PhraseTable",
    "Segment",
]
