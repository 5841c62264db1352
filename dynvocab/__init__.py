"""Phrase vocabularies that change at run time for Hugging Face causal LMs."""

from .agreement import PhraseAgreement
from .config import DynamicVocabConfig
from .context_gate import PhraseContextGate, left_contexts
from .model import DynamicVocabLM
from .packed_linear import pack_linear_layers, unpack_linear_layers
from .phrase_encoder import PhraseEncoder
from .phrase_table import Phrase, PhraseTable
from .repetition import PhraseNoRepeatNGram, PhraseRepetitionPenalty
from .scoring import DotProductScorer
from .shortlist import ShortlistConfig, ShortlistHead
from .shortlist_scorer import ShortlistScorer
from .state_keys import StateKeys, state_keys
from .state_store import DocumentStates
from .text import Segment
from .verification import VerifiedOutput, generate_grounded, generate_verified

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
    "generate_grounded",
    "generate_verified",
    "left_contexts",
    "pack_linear_layers",
    "state_keys",
    "unpack_linear_layers",
]
