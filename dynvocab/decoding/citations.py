"""Citations by construction: the spans of a continuation that stand verbatim in one of its documents.

Grounded decoding copies from the documents it reads; ``cite`` finds every run of at least ``min_tokens`` tokens of
the continuation that occurs in a document (the longest run first, the best-ranked document on a tie) and reports
the document and the character offset there. Each span is checked against the document's text before it is
reported, so a citation is never a near miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Citation", "cite", "cited_share"]


@dataclass(frozen=True)
class Citation:
    """``text`` is ``continuation[start:end]`` and ``documents[document][document_start:document_start + len(text)]``."""

    start: int
    end: int
    document: int
    document_start: int
    text: str


def cite(token_ids: Sequence[int], documents: Sequence[str], tokenizer, min_tokens: int = 4) -> list[Citation]:
    """The cited spans of the continuation ``token_ids`` (LM tokens) in ``documents`` (texts, best first).

    Walks the continuation left to right; where its next ``min_tokens`` tokens stand in a document, the longest run
    that goes on matching there is one citation and the walk resumes after it. Offsets are characters of
    ``tokenizer.decode(token_ids)`` and of the document's text; whitespace at a span's edges is left out.
    """
    if min_tokens < 1:
        raise ValueError(f"min_tokens={min_tokens} must be >= 1 (4: a span of at least four tokens is cited)")
    ids = list(token_ids)
    if len(ids) < min_tokens or not documents:
        return []
    encoded = tokenizer(list(documents), add_special_tokens=False, return_offsets_mapping=True)
    document_ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    starts: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for d, doc in enumerate(document_ids):
        for p in range(len(doc) - min_tokens + 1):
            starts.setdefault(tuple(doc[p : p + min_tokens]), []).append((d, p))
    text = tokenizer.decode(ids)
    at = [len(tokenizer.decode(ids[:i])) for i in range(len(ids) + 1)]  # character where token i starts
    citations, i = [], 0
    while i <= len(ids) - min_tokens:
        best = None  # (length, document, position)
        for d, p in starts.get(tuple(ids[i : i + min_tokens]), ()):
            length = min_tokens
            doc = document_ids[d]
            while i + length < len(ids) and p + length < len(doc) and ids[i + length] == doc[p + length]:
                length += 1
            if best is None or length > best[0]:
                best = (length, d, p)
        if best is None:
            i += 1
            continue
        length, d, p = best
        found = _located(text, at[i], at[i + length], documents[d], offsets[d][p][0], d)
        if found is not None:
            citations.append(found)
        i += length
    return citations


def cited_share(citations: Sequence[Citation], text: str) -> float:
    """The share of ``text``'s non-space characters inside ``citations``."""
    total = sum(not c.isspace() for c in text)
    cited = sum(sum(not ch.isspace() for ch in c.text) for c in citations)
    return cited / total if total else 0.0


def _located(text: str, start: int, end: int, document: str, near: int, index: int) -> Citation | None:
    """The citation of ``text[start:end]`` without its edge whitespace, found in ``document`` at or just around
    character ``near``; None when the decoded span is not the document's text there."""
    span = text[start:end]
    stripped = span.strip()
    if not stripped:
        return None
    start += len(span) - len(span.lstrip())
    where = document.find(stripped, max(0, near - 2))
    if where < 0 or where > near + 2:
        return None
    return Citation(start, start + len(stripped), index, where, stripped)
