"""Drafts for verified decoding: what followed the text's last tokens in the documents, or earlier in the text.

Retrieved documents hold spans that the LM itself would write next (LLMA, Yang et al. 2023; REST, He et al.
2023), and so does the text so far (prompt-lookup decoding). ``DocumentDrafter`` finds the longest run of the
text's last ``context_tokens`` tokens (down to ``min_context``) that stood earlier in the text or in one of the
documents, and proposes the tokens that followed it there. ``dynvocab.verification.generate_verified`` reads a
draft back in the same forward call as the token before it and keeps it as far as the LM agrees, so with
``accept_top_k=1`` the text is the bare LM's own and only the number of steps changes.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DocumentDrafter"]


class DocumentDrafter:
    """Drafts up to ``draft_tokens`` tokens after the longest matching context in the text or ``documents``.

    ``documents`` are token-id sequences, best first: at equal context length, the text so far (its latest
    occurrence) is preferred, then the earliest occurrence in the best-ranked document. With
    ``no_repeat_ngram_size=n`` a draft stops before the first token that would repeat an n-gram of the text (the guard
    would refuse it), and a draft left empty gives way to the next candidate.
    """

    def __init__(self, documents: Sequence[Sequence[int]], draft_tokens: int = 8, context_tokens: int = 3,
                 min_context: int = 2, no_repeat_ngram_size: int = 0) -> None:
        if not 1 <= min_context <= context_tokens or draft_tokens < 1 or no_repeat_ngram_size < 0:
            raise ValueError(f"draft_tokens={draft_tokens} must be >= 1, 1 <= min_context={min_context} <= "
                             f"context_tokens={context_tokens} and no_repeat_ngram_size={no_repeat_ngram_size} >= 0")
        self.draft_tokens, self.sizes = draft_tokens, range(context_tokens, min_context - 1, -1)
        self.no_repeat = no_repeat_ngram_size
        self._documents = [list(ids) for ids in documents]
        self._followers: dict[tuple[int, ...], tuple[int, int]] = {}  # context -> (document, where its follower is)
        for d, ids in reversed(list(enumerate(self._documents))):  # the best document's occurrence written last
            for n in self.sizes:
                for end in range(len(ids) - 1, n - 1, -1):  # each document's earliest occurrence written last
                    self._followers[tuple(ids[end - n : end])] = (d, end)
        self._text: list[int] = []
        self._seen: dict[tuple[int, ...], int] = {}  # context -> where its latest follower in the text is
        self._grams: set[tuple[int, ...]] = set()  # the text's n-grams, n = no_repeat_ngram_size

    def draft(self, ids: Sequence[int]) -> list[int]:
        """The tokens proposed to follow ``ids`` (the whole text so far, prompt included, as token ids); [] when no
        context of at least ``min_context`` tokens matches. Successive calls may only extend ``ids``."""
        ids = list(ids)
        self._index_text(ids)
        for n in self.sizes:
            if len(ids) < n:
                continue
            context = tuple(ids[-n:])
            candidates = []
            if context in self._seen:
                start = self._seen[context]
                candidates.append(self._text[start : start + self.draft_tokens])
            if context in self._followers:
                d, start = self._followers[context]
                candidates.append(self._documents[d][start : start + self.draft_tokens])
            for candidate in candidates:
                proposed = self._unrepeated(ids, candidate)
                if proposed:
                    return proposed
        return []

    def _unrepeated(self, ids: list[int], draft: list[int]) -> list[int]:
        """``draft`` up to the first token that would repeat an n-gram of ``ids`` or of the draft before it."""
        n = self.no_repeat
        if not n:
            return draft
        text, grams = ids + draft, set()
        for j in range(len(draft)):
            end = len(ids) + j + 1
            gram = tuple(text[end - n : end]) if end >= n else None
            if gram is not None and (gram in self._grams or gram in grams):
                return draft[:j]
            grams.add(gram)
        return draft

    def _index_text(self, ids: list[int]) -> None:
        """Index the contexts of ``ids`` that have a follower inside ``ids``, and its n-grams (each once, as ``ids``
        grows)."""
        known = len(self._text)
        if ids[:known] != self._text:
            raise ValueError("DocumentDrafter.draft: ids must extend the text of the previous call; "
                             "make a new drafter for a new text")
        self._text = list(ids)
        for end in range(max(known, 1), len(ids)):  # a context ending at ``end`` is followed by ids[end]
            for n in self.sizes:
                if end >= n:
                    self._seen[tuple(ids[end - n : end])] = end
        if self.no_repeat:
            n = self.no_repeat
            self._grams.update(tuple(ids[end - n : end]) for end in range(max(known + 1, n), len(ids) + 1))
