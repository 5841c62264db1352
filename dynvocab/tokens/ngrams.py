"""Frequent n-grams of a support corpus, and where phrases occur in it.

:func:`mine_ngrams` counts token n-grams level by level (Apriori pruning: an n-gram
can only be frequent when both of its (n-1)-grams are), with numpy so that a corpus
of about a million tokens takes seconds. :class:`SuccessorIndex` finds the
occurrences of a phrase and what follows it there (the paper's corpus-retrieval
negatives).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["SuccessorIndex", "mine_ngram_counts", "mine_ngrams", "word_boundaries", "word_start_flags"]

logger = logging.getLogger(__name__)

_SEPARATOR = -1


def _concatenate(token_sequences: Iterable[Sequence[int]]) -> np.ndarray:
    """All sequences in one int64 array, each followed by a ``-1`` separator. Shape ``(total + n_seqs,)``."""
    parts: list[np.ndarray] = []
    for sequence in token_sequences:
        if len(sequence):
            parts.append(np.asarray(sequence, dtype=np.int64))
            parts.append(np.array([_SEPARATOR], dtype=np.int64))
    if not parts:
        return np.zeros(0, dtype=np.int64)
    flat = np.concatenate(parts)
    if flat.min() < _SEPARATOR or (flat[flat != _SEPARATOR] < 0).any():
        raise ValueError("token_sequences contain a negative token id; pass the tokenizer's ids (>= 0)")
    return flat


def word_start_flags(tokenizer: PreTrainedTokenizerBase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per vocabulary id: (starts with whitespace, first char alphanumeric, last char alphanumeric).

    Shapes ``(vocab,)`` bool. Works for byte-level BPE (``Ġ``) and SentencePiece (``▁``)
    vocabularies; a token that decodes to a partial UTF-8 character counts as alphanumeric.
    """
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    texts = tokenizer.batch_decode([[i] for i in range(size)])
    markers = ("Ġ", "▁", "Ċ", "ĉ")  # byte-level space, SentencePiece space, byte-level newline and tab
    space = np.array([str(p or "").startswith(markers) or t[:1].isspace() for p, t in zip(pieces, texts)])
    first = np.array([(t.strip()[:1] or " ").isalnum() or "\ufffd" in t.strip()[:1] for t in texts])
    last = np.array([(t.strip()[-1:] or " ").isalnum() or "\ufffd" in t.strip()[-1:] for t in texts])
    return space, first, last


def word_boundaries(flat: np.ndarray, flags: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """``out[i]`` is true when a word boundary lies just before position ``i`` of ``flat``. Shape ``(len(flat)+1,)``.

    ``flat`` holds token ids, sequences separated by ``-1``; ``flags`` come from
    :func:`word_start_flags`.
    """
    space, first, last = flags
    ids = np.where(flat == _SEPARATOR, 0, flat)
    if ids.size and ids.max() >= space.size:
        raise ValueError(
            f"token id {int(ids.max())} is outside the tokenizer's vocabulary of {space.size}; "
            "pass the tokenizer that produced token_sequences"
        )
    is_sep = flat == _SEPARATOR
    previous_sep = np.concatenate([[True], is_sep[:-1]])
    previous_last = np.concatenate([[False], last[ids][:-1]])
    boundary = is_sep | previous_sep | space[ids] | ~first[ids] | ~previous_last
    return np.concatenate([boundary, [True]])


def mine_ngram_counts(
    token_sequences: Iterable[Sequence[int]],
    min_n: int = 2,
    max_n: int = 8,
    min_count: int = 5,
    top_k: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> list[tuple[tuple[int, ...], int]]:
    """Like :func:`mine_ngrams` but returns ``(ngram, count)`` pairs."""
    if not 1 <= min_n <= max_n:
        raise ValueError(f"min_n={min_n}, max_n={max_n}: need 1 <= min_n <= max_n; e.g. min_n=2, max_n=8")
    if min_count < 1:
        raise ValueError(f"min_count={min_count} must be >= 1 occurrences; pass e.g. 5")
    flat = _concatenate(token_sequences)
    boundary = word_boundaries(flat, word_start_flags(tokenizer)) if tokenizer is not None else None
    found: list[tuple[tuple[int, ...], int]] = []
    positions = np.flatnonzero(flat != _SEPARATOR)
    ids = flat[positions]  # id of the n-gram starting at each position, at the current level
    base = int(flat.max()) + 1 if flat.size else 1
    for n in range(1, max_n + 1):
        if n > 1:  # the n-gram's id combines its (n-1)-gram's id and its last token
            ids = ids * base + flat[positions + n - 1]
        if positions.size == 0:
            break
        unique, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
        frequent = counts[inverse] >= min_count
        positions, ids = positions[frequent], inverse[frequent]
        if n >= min_n:
            found.extend(_collect(flat, positions, ids, counts, n, boundary))
        # Apriori: an (n+1)-gram at p needs frequent n-grams at p and at p + 1.
        is_frequent = np.zeros(flat.size + 1, dtype=bool)
        is_frequent[positions] = True
        follow = is_frequent[positions + 1]
        positions, ids = positions[follow], ids[follow]
        logger.debug("n=%d: %d frequent positions", n, positions.size)
    found.sort(key=lambda item: (-item[1], -len(item[0]), item[0]))
    return found[:top_k] if top_k is not None else found


def _collect(flat, positions, ids, counts_by_unique, n, boundary) -> list[tuple[tuple[int, ...], int]]:
    """One ``(ngram, count)`` per distinct frequent n-gram, optionally only whole-word ones."""
    if boundary is not None:
        whole = boundary[positions] & boundary[positions + n]
        positions, ids = positions[whole], ids[whole]
    distinct, first = np.unique(ids, return_index=True)
    starts = positions[first]
    grams = flat[starts[:, None] + np.arange(n)]
    return [(tuple(int(t) for t in gram), int(c)) for gram, c in zip(grams, counts_by_unique[distinct])]


def mine_ngrams(
    token_sequences: Iterable[Sequence[int]],
    min_n: int = 2,
    max_n: int = 8,
    min_count: int = 5,
    top_k: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> list[tuple[int, ...]]:
    """Frequent n-grams (``min_n``..``max_n`` tokens, seen >= ``min_count`` times), most frequent first.

    Ties break by longer first, then by token ids. ``top_k`` keeps the first ``top_k``.
    With a ``tokenizer``, only n-grams that start and end on word boundaries are returned
    (a boundary is whitespace before a token, or punctuation on either side); counting
    still uses all occurrences. N-grams never cross the end of a sequence. The corpus is
    held as one int64 array (8 bytes a token); about a million tokens take a second or two.
    """
    return [gram for gram, _ in mine_ngram_counts(token_sequences, min_n, max_n, min_count, top_k, tokenizer)]


class SuccessorIndex:
    """Occurrences of every token bigram in a support corpus, for fast phrase look-up.

    Positions are sorted by (token, next token), so the occurrences of a phrase's first
    two tokens form one contiguous block found by binary search; the rest of the phrase
    is checked with one vectorised comparison. Memory: three int64 arrays of corpus size.
    """

    def __init__(self, token_sequences: Iterable[Sequence[int]]) -> None:
        self.flat = _concatenate(token_sequences)
        self._base = int(self.flat.max()) + 2 if self.flat.size else 1
        positions = np.flatnonzero(self.flat != _SEPARATOR)
        keys = self._key(self.flat[positions], self.flat[positions + 1])  # the last entry is always a separator
        order = np.argsort(keys, kind="stable")
        self.positions, self.keys = positions[order], keys[order]
        logger.info("SuccessorIndex over %d tokens", positions.size)

    def _key(self, first, second):
        return np.asarray(first, dtype=np.int64) * self._base + (np.asarray(second, dtype=np.int64) + 1)

    def __len__(self) -> int:
        """Number of corpus tokens indexed."""
        return int(self.positions.size)

    def occurrences(self, phrase: Sequence[int], max_occurrences: int | None = None) -> np.ndarray:
        """Start positions (in corpus order, first ``max_occurrences``) where ``phrase`` occurs. Shape ``(k,)``."""
        if len(phrase) == 0:
            raise ValueError("phrase is empty; pass at least one token id")
        if max(phrase) + 2 > self._base or min(phrase) < 0:
            return np.zeros(0, dtype=np.int64)
        if len(phrase) == 1:
            low, high = self._key(phrase[0], -1), self._key(phrase[0], self._base - 2)
        else:
            low = high = self._key(phrase[0], phrase[1])
        block = self.positions[np.searchsorted(self.keys, low) : np.searchsorted(self.keys, high, side="right")]
        if len(phrase) > 2 and block.size:
            ends = np.minimum(block[:, None] + np.arange(2, len(phrase)), self.flat.size - 1)
            window = self.flat[ends]  # clipped reads land on the final separator, which never matches
            block = block[(window == np.asarray(phrase[2:], dtype=np.int64)).all(axis=1)]
        block = np.sort(block)
        return block[:max_occurrences] if max_occurrences is not None else block

    def successors(self, phrase: Sequence[int], n: int = 3, max_occurrences: int = 16) -> list[tuple[int, ...]]:
        """``phrase`` extended by the next 1..``n`` tokens at its first ``max_occurrences`` occurrences.

        Distinct results in order of first appearance; extensions stop at a sequence end.
        """
        if n < 1:
            raise ValueError(f"n={n} must be >= 1 extra tokens; pass e.g. 3")
        phrase = tuple(int(t) for t in phrase)
        found: dict[tuple[int, ...], None] = {}
        for start in self.occurrences(phrase, max_occurrences).tolist():
            tail = self.flat[start + len(phrase) : start + len(phrase) + n].tolist()
            for j, token in enumerate(tail, start=1):
                if token == _SEPARATOR:
                    break
                found[phrase + tuple(tail[:j])] = None
        return list(found)
