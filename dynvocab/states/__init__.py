"""The LM's hidden states over documents, and the state gate they key: a phrase competes only where the LM's state is
close to its state before the phrase in a document."""

from .keys import StateGatedScorer, StateKeys, row_state_keys, state_keys
from .store import DocumentStates, DocumentStateStore, write_document_states

__all__ = [
    "DocumentStateStore",
    "DocumentStates",
    "StateGatedScorer",
    "StateKeys",
    "row_state_keys",
    "state_keys",
    "write_document_states",
]
