"""Decoding with phrases: the phrase rules as logits processors, token read-back, one step's sampling, verified and
grounded decoding with drafts (rows joining a running batch), citations of copied spans, batched generation with
character budgets, and the KV-cache row moves of continuous batching."""

from .agreement import FirstTokenMass, PhraseAgreement, PhraseBias
from .citations import Citation, cite, cited_share
from .context_gate import PhraseContextGate, left_contexts
from .drafting import CorpusDrafts, DocumentDrafter
from .generation import generate_continuations
from .repetition import PhraseMaxUses, PhraseNoRepeatNGram, PhraseRepetitionPenalty
from .sampling import choose, sampling_warpers
from .stopping import CharacterBudget
from .verification import VerifiedBatch, VerifiedOutput, VerifiedRow, generate_grounded, generate_verified, \
    generate_verified_batch, grounded_fill, grounded_proposers, grounded_relax

__all__ = [
    "CharacterBudget",
    "Citation",
    "CorpusDrafts",
    "DocumentDrafter",
    "FirstTokenMass",
    "PhraseAgreement",
    "PhraseBias",
    "PhraseContextGate",
    "PhraseMaxUses",
    "PhraseNoRepeatNGram",
    "PhraseRepetitionPenalty",
    "VerifiedBatch",
    "VerifiedOutput",
    "VerifiedRow",
    "choose",
    "cite",
    "cited_share",
    "generate_continuations",
    "generate_grounded",
    "generate_verified",
    "generate_verified_batch",
    "grounded_fill",
    "grounded_proposers",
    "grounded_relax",
    "left_contexts",
    "sampling_warpers",
]
