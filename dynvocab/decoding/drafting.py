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
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DocumentDrafter"]

#: a source nobody has judged yet counts as one proposal that kept this many tokens
PRIOR_KEPT = 1.0


class DocumentDrafter:
    """Drafts up to ``draft_tokens`` tokens after a matching context in the text or ``documents``.

    ``documents`` are token-id sequences, best first; a context's follower is taken from its latest occurrence in
    the text, or else from its earliest in the best-ranked document. Among the sources that have a follower, the one
    whose proposals kept most tokens so far is drafted from (ties: the longer context, then the text), if that is
    more than ``step_cost`` (in one-token forward calls; 0 drafts whenever a context matches). With
    ``no_repeat_ngram_size=n`` a draft stops before the first token that would repeat an n-gram of the text (the guard
    would refuse it).
    """

    def __init__(self, documents: Sequence[Sequence[int]], draft_tokens: int = 8, context_tokens: int = 3,
                 min_context: int = 2, no_repeat_ngram_size: int = 0, step_cost: float = 0.0) -> None:
        if not 1 <= min_context <= context_tokens or draft_tokens < 1 or no_repeat_ngram_size < 0 or step_cost < 0:
            raise ValueError(f"draft_tokens={draft_tokens} must be >= 1, 1 <= min_context={min_context} <= "
                             f"context_tokens={context_tokens}, no_repeat_ngram_size={no_repeat_ngram_size} >= 0 and "
                             f"step_cost={step_cost} >= 0")
        self.draft_tokens, self.sizes = draft_tokens, range(context_tokens, min_context - 1, -1)
        self.no_repeat, self.step_cost = no_repeat_ngram_size, step_cost
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
