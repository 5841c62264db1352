"""A phrase may continue the text only the way its source documents continue the same words.

The phrase head scores one context-free vector per phrase against the LM's state, and
on held-out text it cannot tell where a phrase fits (the calibration report). The
documents a phrase was cut from can: where the last ``n`` tokens of the text so far are
the ``n`` tokens that stood before the phrase in a document, the phrase is a plausible
continuation (the rule of copy mechanisms and of prompt-lookup decoding). ``PhraseContextGate``
sets every other phrase's score to ``-inf``; the head and the other rules still choose
among the phrases it lets through, and against the LM's tokens.

``generate(..., phrase_contexts=contexts)`` on a ``DynamicVocabLM`` adds it. ``contexts``
maps each ``n``-token left context to the phrases (as token ids) seen right after it:
one mapping shared by every row, or a list with one per row (``None``: that row is not
gated). ``left_contexts`` builds such a mapping from tokenized documents.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

import torch
from transformers import LogitsProcessor

__all__ = ["PhraseContextGate", "PhraseContexts", "context_size", "left_contexts", "phrase_starts", "spelled_tail"]

#: ``n`` tokens of left context -> the phrases (their token ids) that follow those tokens in some document
PhraseContexts = Mapping[tuple[int, ...], Collection[tuple[int, ...]]]


def left_contexts(documents: Iterable[Sequence[int]], phrases: Collection[tuple[int, ...]], n: int) -> dict:
    """``{n tokens: {phrases that follow them}}`` over every place a phrase's tokens occur in ``documents``.

    ``documents`` are token-id sequences and ``phrases`` tuples of at least 2 token ids (as in a
    phrase table); a phrase in its document's first ``n`` tokens has no full left context and
    is not recorded there.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"a left context is at least 1 token, got n={n!r}")
    documents = [list(ids) for ids in documents]
    contexts: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
    for number, start, span in phrase_starts(documents, phrases):
        if start >= n:
            contexts.setdefault(tuple(documents[number][start - n : start]), set()).add(span)
    return contexts


def phrase_starts(documents: Iterable[Sequence[int]],
                  phrases: Collection[tuple[int, ...]]) -> Iterator[tuple[int, int, tuple[int, ...]]]:
    """Every place one of ``phrases`` (tuples of at least 2 token ids) occurs in ``documents`` (token-id
    sequences): ``(the document's number, the phrase's first position there, the phrase)``, in document order."""
    phrases = set(phrases)
    lengths_after: dict[tuple[int, ...], set[int]] = {}  # a phrase's first two tokens -> the lengths of such phrases
    for phrase in phrases:
        if len(phrase) < 2:
            raise ValueError(f"phrase {phrase!r} has fewer than 2 tokens; a phrase table holds phrases of 2 or more")
        lengths_after.setdefault(phrase[:2], set()).add(len(phrase))
    for number, ids in enumerate(documents):
        for start in range(len(ids) - 1):
            for length in lengths_after.get(tuple(ids[start : start + 2]), ()):
                span = tuple(ids[start : start + length])
                if len(span) == length and span in phrases:  # near the end a slice is shorter: not this phrase
                    yield number, start, span


def context_size(contexts: PhraseContexts) -> int:
    """The ``n`` of a contexts mapping: every key must be a tuple of ``n`` token ids."""
    sizes = {len(key) if isinstance(key, tuple) else -1 for key in contexts}
    if len(sizes) != 1 or min(sizes) < 1:
        raise ValueError(
            "phrase_contexts must map tuples of n token ids (one n for all, n >= 1) to the phrases that follow them, "
            f"got keys of lengths {sorted(sizes)}; build it with dynvocab.decoding.context_gate.left_contexts"
        )
    return sizes.pop()


def spelled_tail(ids: Sequence[int], n: int, vocab_size: int, phrase_token_ids: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The last ``n`` LM tokens that the mixed ids ``ids`` spell (a phrase id counts as its tokens)."""
    tail: list[int] = []
    for item in reversed(ids):
        tail[:0] = phrase_token_ids[item - vocab_size] if item >= vocab_size else (item,)
        if len(tail) >= n:
            break
    return tuple(tail[-n:])


class PhraseContextGate(LogitsProcessor):
    """Sets a phrase's score to ``-inf`` unless the text so far ends with a left context it was seen after.

    Args:
        contexts: one ``PhraseContexts`` per prompt (or a single one for all rows), with table
            indices instead of token ids: ``{n tokens: (P_c,) long tensor of phrase indices}``;
            ``None`` leaves that prompt's phrases ungated. Prompts may use different ``n``.
        vocab_size: ``V``; columns ``>= V`` of the scores are phrases.
        phrase_token_ids: every phrase's tokens, in table order (to spell emitted phrases).
    """

    def __init__(self, contexts: Sequence[Mapping[tuple[int, ...], torch.Tensor] | None], vocab_size: int,
                 phrase_token_ids: list[tuple[int, ...]]) -> None:
        self.contexts = list(contexts)
        self.sizes = [context_size(row) if row else 0 for row in self.contexts]
        self.vocab_size, self.phrase_token_ids = vocab_size, phrase_token_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """``(B, L)`` mixed ids, ``(B, V + P)`` scores -> the same scores, phrases out of context at ``-inf``."""
        batch, phrases = scores.shape[0], scores.shape[1] - self.vocab_size
        if batch % len(self.contexts):
            raise ValueError(f"phrase_contexts has {len(self.contexts)} rows but the batch has {batch}; give one "
                             "mapping per prompt (beams and return sequences follow their prompt)")
        per_prompt = batch // len(self.contexts)
        allowed = torch.zeros(batch, phrases, dtype=torch.bool)
        for row in range(batch):
            contexts, n = self.contexts[row // per_prompt], self.sizes[row // per_prompt]
            if contexts is None:
                allowed[row] = True
            elif n:
                tail = spelled_tail(input_ids[row, -n:].tolist(), n, self.vocab_size, self.phrase_token_ids)
                columns = contexts.get(tail)
                if columns is not None:
                    allowed[row, columns[columns < phrases]] = True
        gated = scores[:, self.vocab_size :].masked_fill(~allowed.to(scores.device), float("-inf"))
        return torch.cat([scores[:, : self.vocab_size], gated], dim=1)
