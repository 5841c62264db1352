"""The phrase vocabulary: the phrase encoder, the table of phrase ids past the LM's vocabulary, phrase vectors kept
across sets and stored on disk, and text to mixed ids and back."""

from .cache import PhraseVectorCache
from .encoder import PhraseEncoder
from .mixed_ids import PhraseAwareDecoder, Segment
from .store import PhraseVectorStore
from .table import Phrase, PhraseTable

__all__ = [
    "Phrase",
    "PhraseAwareDecoder",
    "PhraseEncoder",
    "PhraseTable",
    "PhraseVectorCache",
    "PhraseVectorStore",
    "Segment",
]
