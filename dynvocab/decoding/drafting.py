"""Drafts for verified decoding: what followed the text's last tokens in the documents, or earlier in the text.

Retrieved documents hold spans that the LM itself would write next (LLMA, Yang et al. 2023; REST, He et al.
2023), and so does the text so far (prompt-lookup decoding). ``DocumentDrafter`` finds the runs of the text's last
``context_tokens`` tokens (down to ``min_context``) that stood earlier in the text or in one of the documents, and
proposes the tokens that followed one of them. ``dynvocab.decoding.verification.generate_verified`` reads a draft back in
the same forward call as the token before it and keeps it as far as the LM agrees, so with ``accept_top_k=1`` the
text is the bare LM's own and only the number of steps changes.

A forward call over a token and its draft costs more than one over the token alone where the LM's step is
compute-bound (about 1.3x on a 2-core CPU with prepacked linear layers, 1.6x without; near 1x expected on a
GPU, not measured: ``dynvocab.decoding.verification.draft_step_cost``; a fixed value wherever a kept draft can change
the text, so that it does not depend on a timing). So the drafter keeps count, per source (the text or
the documents, and the context length), of how many tokens its proposals would have kept: each proposal is judged
against the text once the text has grown past it, whether it was drafted or not. It drafts from the source expected
to keep most, and only when that is more than ``step_cost``.

Where neither the text nor the documents hold the text's last tokens, ``CorpusDrafts`` (REST, He et al. 2023) still
knows what most often followed them across a whole corpus (an index's every document): the drafter's ``fill``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["CorpusDrafts", "DocumentDrafter"]

#: a source nobody has judged yet counts as one proposal that kept this many tokens
PRIOR_KEPT = 1.0


class CorpusDrafts:
    """What most often followed each context of ``context_tokens`` tokens (down to ``min_context``) in ``documents``
    (token-id sequences, a whole corpus): an n-gram model's greedy continuation, drafted where the documents at hand
    hold nothing (REST-style). Each context length keeps sorted ``(N,)`` int64 context keys beside their most
    frequent follower (ties: the smaller id); a draft looks its tokens up one by one, the longest context first."""

    def __init__(self, documents: Sequence[Sequence[int]], context_tokens: int = 3, min_context: int = 2) -> None:
        if not 1 <= min_context <= context_tokens:
            raise ValueError(f"1 <= min_context={min_context} <= context_tokens={context_tokens} is needed")
        arrays = [np.asarray(ids, dtype=np.int64) for ids in documents if len(ids) > min_context]
        self.base = int(max((a.max() for a in arrays), default=0)) + 1
        if self.base ** context_tokens >= 2**62:
            raise ValueError(f"a context of {context_tokens} ids below {self.base} does not fit one int64 key: "
                             "pass a smaller context_tokens")
        self.sizes = range(context_tokens, min_context - 1, -1)
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for n in self.sizes:
            keys = [self._keys(a, n) for a in arrays if len(a) > n]
            followers = [a[n:] for a in arrays if len(a) > n]
            self.tables[n] = _most_frequent(np.concatenate(keys or [np.zeros(0, np.int64)]),
                                            np.concatenate(followers or [np.zeros(0, np.int64)]))

    def __len__(self) -> int:
        """Contexts of the longest size with a follower."""
        return len(self.tables[self.sizes[0]][0])

    def _keys(self, ids: np.ndarray, n: int) -> np.ndarray:
        """The key of every context of ``n`` ids of ``ids`` that has a follower: ``(len(ids) - n,)``."""
        keys = np.zeros(len(ids) - n, dtype=np.int64)
        for j in range(n):
            keys = keys * self.base + ids[j : len(ids) - n + j]
        return keys

    def follower(self, ids: Sequence[int]) -> int | None:
        """The token that most often followed the last tokens of ``ids`` (the longest context found), or None."""
        for n in self.sizes:
            if len(ids) < n or any(t >= self.base for t in ids[-n:]):
                continue
            key = 0
            for token in ids[-n:]:
                key = key * self.base + int(token)
            keys, followers = self.tables[n]
            at = int(np.searchsorted(keys, key))
            if at < len(keys) and keys[at] == key:
                return int(followers[at])
        return None

    def draft(self, ids: Sequence[int], max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens to follow ``ids``, each the most frequent follower of the text before it."""
        text, drafted = list(ids), []
        while len(drafted) < max_tokens and (token := self.follower(text)) is not None:
            drafted.append(token)
            text.append(token)
        return drafted


def _most_frequent(keys: np.ndarray, followers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique ``keys`` and, for each, the follower seen most often with it (ties: the smaller)."""
    if not len(keys):
        return keys, followers
    order = np.lexsort((followers, keys))
    keys, followers = keys[order], followers[order]
    starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (followers[1:] != followers[:-1])])
    counts = np.diff(np.r_[starts, len(keys)])
    keys, followers = keys[starts], followers[starts]
    best = np.lexsort((-counts, keys))  # stable: among equal counts the smaller follower stays first
    keys, followers = keys[best], followers[best]
    first = np.r_[True, keys[1:] != keys[:-1]]
    return keys[first], followers[first]


class DocumentDrafter:
    """Drafts up to ``draft_tokens`` tokens after a matching context in the text or ``documents``.

    ``documents`` are token-id sequences, best first; a context's follower is taken from its latest occurrence in
    the text, or else from its earliest in the best-ranked document. Among the sources that have a follower, the one
    whose proposals kept most tokens so far is drafted from (ties: the longer context, then the text), if that is
    more than ``step_cost`` (in one-token forward calls; 0 drafts whenever a context matches). With
    ``no_repeat_ngram_size=n`` a draft stops before the first token that would repeat an n-gram of the text (the guard
    would refuse it). ``corpus`` drafts up to ``fill_tokens`` tokens for ``fill``, where no source here has any.
    """

    def __init__(self, documents: Sequence[Sequence[int]], draft_tokens: int = 8, context_tokens: int = 3,
                 min_context: int = 2, no_repeat_ngram_size: int = 0, step_cost: float = 0.0,
                 corpus: CorpusDrafts | None = None, fill_tokens: int = 4) -> None:
        if not 1 <= min_context <= context_tokens or draft_tokens < 1 or (corpus is not None and fill_tokens < 1) \
                or no_repeat_ngram_size < 0 or step_cost < 0:
            raise ValueError(f"draft_tokens={draft_tokens} must be >= 1 (and fill_tokens={fill_tokens} with a corpus), "
                             f"1 <= min_context={min_context} <= context_tokens={context_tokens}, no_repeat_ngram_size="
                             f"{no_repeat_ngram_size} >= 0 and step_cost={step_cost} >= 0")
        self.draft_tokens, self.sizes = draft_tokens, range(context_tokens, min_context - 1, -1)
        self.no_repeat, self.step_cost = no_repeat_ngram_size, step_cost
        self.corpus, self.fill_tokens = corpus, fill_tokens
        self._documents = [list(ids) for ids in documents]
        self._followers: dict[tuple[int, ...], tuple[int, int]] = {}  # context -> (document, where its follower is)
        for d, ids in reversed(list(enumerate(self._documents))):  # the best document's occurrence written last
            for n in self.sizes:
                for end in range(len(ids) - 1, n - 1, -1):  # each document's earliest occurrence written last
                    self._followers[tuple(ids[end - n : end])] = (d, end)
        self._text: list[int] = []
        self._seen: dict[tuple[int, ...], int] = {}  # context -> where its latest follower in the text is
        self._grams: set[tuple[int, ...]] = set()  # the text's n-grams, n = no_repeat_ngram_size
        self.kept: dict[tuple[str, int], list[int]] = {}  # (source, context length) -> [proposals judged, tokens kept]
        self._pending: list[tuple[int, tuple[str, int], list[int]]] = []  # (where, source, proposal) not yet judged
        self._last: tuple[int, int] | None = None  # (document, where) the last draft was taken from, if a document
        self._drafted: list[int] = []  # the last draft
        self._occurrences: dict[int, dict[tuple[int, ...], list[tuple[int, int]]]] = {}  # n -> n-gram -> (doc, end)

    def draft(self, ids: Sequence[int]) -> list[int]:
        """The tokens proposed to follow ``ids`` (the whole text so far, prompt included, as token ids); [] when no
        context of at least ``min_context`` tokens matches or none is worth a draft. Successive calls may only extend
        ``ids``."""
        ids = list(ids)
        self._index_text(ids)
        self._judge(ids)
        proposals = self._proposals(ids)
        self._pending += [(len(ids), source, proposal) for source, proposal in proposals]
        if not proposals:
            return []
        gains = [min(self.expected(source), len(proposal)) for source, proposal in proposals]
        best = gains.index(max(gains))  # the first of the best
        self._last, self._drafted = None, []
        if self.step_cost and gains[best] <= self.step_cost:
            return []
        if proposals[best][0][0] == "documents":
            self._last = self._followers[tuple(ids[-proposals[best][0][1] :])]
        self._drafted = proposals[best][1]
        return self._drafted

    def proposals(self, ids: Sequence[int]) -> list[tuple[tuple[str, int], list[int]]]:
        """Every source's draft after ``ids`` (same rules as ``draft``), as ``(source, tokens)``, whatever each is
        expected to keep; nothing is counted for the sources. ``draft`` proposes the one expected to keep most."""
        ids = list(ids)
        self._index_text(ids)
        return self._proposals(ids)

    def _proposals(self, ids: list[int]) -> list[tuple[tuple[str, int], list[int]]]:
        proposals = []
        for n in self.sizes:
            if len(ids) < n:
                continue
            context = tuple(ids[-n:])
            if context in self._seen:
                start = self._seen[context]
                proposals.append((("text", n), self._text[start : start + self.draft_tokens]))
            if context in self._followers:
                d, start = self._followers[context]
                proposals.append((("documents", n), self._documents[d][start : start + self.draft_tokens]))
        return [(source, trimmed) for source, draft in proposals if (trimmed := self._unrepeated(ids, draft))]

    def proposes(self, ids: Sequence[int]) -> bool:
        """Whether a context of ``ids`` has a follower in the text or the documents, so that ``draft`` may propose or
        count something there; unlike ``draft``, ``ids`` need not extend the text of earlier calls and nothing is
        indexed. (A follower the n-gram guard would cut away counts too.)"""
        ids, known = list(ids), len(self._text)
        indexed = ids[:known] == self._text
        for n in self.sizes:
            if len(ids) < n:
                continue
            context = tuple(ids[-n:])
            if context in self._followers or (indexed and context in self._seen):
                return True
            start = n if not indexed else max(known, n)  # contexts that the index has not seen
            if any(tuple(ids[end - n : end]) == context for end in range(start, len(ids))):
                return True
        return False

    def fill(self, ids: Sequence[int]) -> list[int]:
        """The corpus's draft after ``ids`` (up to ``fill_tokens``, cut where the n-gram guard would refuse it), or []
        without a corpus. Like ``draft``, successive calls may only extend ``ids``; nothing is counted."""
        if self.corpus is None:
            return []
        ids = list(ids)
        self._index_text(ids)
        return self._unrepeated(ids, self.corpus.draft(ids, self.fill_tokens))

    def anchored(self, ids: Sequence[int]) -> int:
        """How many of the last tokens of ``ids`` (the text the last draft was made for) stand verbatim just before
        that draft in its document: 0 when it came from the text or nothing was drafted. A long run says the document
        holds the text being written (a copy under way), a short one that a common phrase matched."""
        if self._last is None:
            return 0
        document, where = self._last
        source, run = self._documents[document], 0
        while run < min(len(ids), where) and ids[len(ids) - 1 - run] == source[where - 1 - run]:
            run += 1
        return run

    def agreed(self, ids: Sequence[int], anchor: int) -> int:
        """How many tokens of the last draft (made for ``ids``) every document occurrence of the text's last
        ``anchor`` tokens goes on with: the draft up to where the documents holding that anchor disagree on what
        follows (an occurrence that ends sooner agrees). 0 when the last draft came from the text or nothing was
        drafted. Where documents disagree, the anchor does not say which of them the text is copying."""
        if anchor < 1:
            raise ValueError(f"anchor={anchor} must be >= 1: the text's last tokens that documents must hold to agree")
        if self._last is None or len(ids) < anchor:
            return 0
        if anchor not in self._occurrences:
            grams = self._occurrences[anchor] = {}
            for d, document in enumerate(self._documents):
                for end in range(anchor, len(document)):
                    grams.setdefault(tuple(document[end - anchor : end]), []).append((d, end))
        agreed = len(self._drafted)
        for d, end in self._occurrences[anchor].get(tuple(ids[len(ids) - anchor :]), []):
            follower = self._documents[d][end : end + agreed]
            agreed = next((j for j, (a, b) in enumerate(zip(follower, self._drafted)) if a != b), agreed)
        return agreed

    def expected(self, source: tuple[str, int]) -> float:
        """Tokens a proposal from ``source`` (``("text" | "documents", context length)``) kept on average so far."""
        judged, kept = self.kept.get(source, (0, 0))
        return (kept + PRIOR_KEPT) / (judged + 1)

    def _judge(self, ids: list[int]) -> None:
        """Count each pending proposal's tokens that the text ``ids`` went on with, once the text shows them all."""
        pending = []
        for where, source, proposal in self._pending:
            written = ids[where : where + len(proposal)]
            kept = next((j for j, (a, b) in enumerate(zip(proposal, written)) if a != b), len(written))
            if kept < len(written) or len(written) == len(proposal):
                counts = self.kept.setdefault(source, [0, 0])
                counts[0] += 1
                counts[1] += kept
            else:
                pending.append((where, source, proposal))
        self._pending = pending

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
