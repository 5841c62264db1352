"""Phrase vocabularies that change at run time for Hugging Face causal LMs."""

from .config import DynamicVocabConfig
from .decoding.agreement import PhraseAgreement
from .decoding.context_gate import PhraseContextGate, left_contexts
from .decoding.repetition import PhraseNoRepeatNGram, PhraseRepetitionPenalty
from .decoding.verification import VerifiedOutput, VerifiedRow, generate_grounded, generate_verified, generate_verified_batch
from .hardware.packed_linear import pack_linear_layers, unpack_linear_layers
from .model import DynamicVocabLM
from .phrases.encoder import PhraseEncoder
from .phrases.mixed_ids import Segment
from .phrases.table import Phrase, PhraseTable
from .scoring.dot_product import DotProductScorer
from .scoring.shortlist_head import ShortlistConfig, ShortlistHead
from .scoring.shortlist_scorer import ShortlistScorer
from .states.keys import StateKeys, state_keys
from .states.store import DocumentStates

__all__ = [
    "DocumentStates",
    "DotProductScorer",
    "DynamicVocabConfig",
    "DynamicVocabLM",
    "Phrase",
    "PhraseAgreement",
    "PhraseContextGate",
    "PhraseEncoder",
    "PhraseNoRepeatNGram",
    "PhraseRepetitionPenalty",
    "PhraseTable",
    "Segment",
    "ShortlistConfig",
    "ShortlistHead",
    "ShortlistScorer",
    "StateKeys",
    "VerifiedOutput",
    "VerifiedRow",
    "generate_grounded",
    "generate_verified",
    "generate_verified_batch",
    "left_contexts",
    "pack_linear_layers",
    "state_keys",
    "unpack_linear_layers",
]
