"""Sequences of token ids: padding, n-gram mining, forward maximum matching over a set of id tuples."""

from .ngrams import SuccessorIndex, mine_ngram_counts, mine_ngrams
from .padding import first_token_index, last_token_index, pad_id, pad_sequences, position_ids_from_mask
from .segmentation import forward_max_match

__all__ = [
    "SuccessorIndex",
    "first_token_index",
    "forward_max_match",
    "last_token_index",
    "mine_ngram_counts",
    "mine_ngrams",
    "pad_id",
    "pad_sequences",
    "position_ids_from_mask",
]
