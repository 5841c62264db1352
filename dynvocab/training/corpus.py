"""Training texts one at a time, from any source ``dynvocab.data.sources`` reads (``iter_texts``), and the offline
Wikipedia stand-in split into train and held-out (``wikipedia_split``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from ..data.corpora import WIKIPEDIA_HELD_OUT, split_documents
from ..data.sources import iter_records

__all__ = ["iter_texts", "wikipedia_split"]


def iter_texts(
    source: str | os.PathLike | Iterable[str],
    text_field: str = "text",
    streaming: bool = True,
    *,
    split: str = "train",
    name: str | None = None,
    paragraphs: bool | None = None,
) -> Iterator[str]:
    """Yield the non-empty texts of ``source`` one by one, stripped of surrounding whitespace.

    ``source`` is anything ``dynvocab.data.sources.iter_records`` reads (a JSONL or text file, a ``datasets`` folder,
    a Hub dataset name, a ``datasets`` object, an iterable of strings); a large corpus is never loaded whole. A
    missing path raises ``ValueError`` at the call; a bad record raises when it is reached.
    """
    records = iter_records(source, text_field, streaming=streaming, split=split, name=name, paragraphs=paragraphs)
    return _non_empty(record.text(text_field) for record in records)


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        text = text.strip()
        if text:
            yield text


def wikipedia_split(held_out: float = WIKIPEDIA_HELD_OUT, seed: int = 0) -> tuple[list[str], list[str]]:
    """(train, held-out) texts of the offline Wikipedia leads (``dynvocab.data.assets.wikipedia_leads``)."""
    from dynvocab.data.assets import wikipedia_leads

    train, heldout = split_documents(wikipedia_leads(), held_out, seed)
    return [d["text"] for d in train], [d["text"] for d in heldout]
