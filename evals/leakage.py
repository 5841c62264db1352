"""The leak check: how many held-out continuations a system could read verbatim in the index it retrieves from.

A held-out document's twin in the index (a licence variant, a page copied into another) lets retrieval hand a system
the very text it must write, and closeness to the author then measures copying. ``leak_check`` reports, with every
evaluation, the share of the references found whole in an indexed document, and the share whose first 32 words are,
both after collapsing whitespace.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["leak_check", "verbatim_share"]


def verbatim_share(references: Sequence[str], documents: Sequence[str], words: int | None = None) -> float:
    """The share of ``references`` (their first ``words`` words; None: whole) that stand verbatim, whitespace
    collapsed, in one of ``documents``."""
    if not references:
        return 0.0
    corpus = "\x00".join(" ".join(text.split()) for text in documents)  # no match runs across two documents
    found = 0
    for reference in references:
        cut = reference.split()[:words] if words is not None else reference.split()
        found += bool(cut) and " ".join(cut) in corpus
    return found / len(references)


def leak_check(references: Sequence[str], documents: Sequence[str]) -> dict:
    """``{"references", "whole", "first_32_words"}``: how many references, and the shares leaked whole and in part."""
    return {"references": len(references), "whole": verbatim_share(references, documents),
            "first_32_words": verbatim_share(references, documents, words=32)}
