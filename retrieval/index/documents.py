"""A corpus as a list of ``{"id", "title", "text"}`` dicts, read by the core's one corpus reader
(``dynvocab.data.sources``): a list of str or dicts, a JSONL or text file, a ``datasets`` folder or object."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from dynvocab.data.sources import Record, iter_records

logger = logging.getLogger(__name__)

TextSplit = Literal["auto", "lines", "paragraphs"]
_PARAGRAPHS = {"auto": None, "lines": False, "paragraphs": True}


def load_documents(
    source: Any,
    *,
    text_field: str = "text",
    title_field: str = "title",
    id_field: str = "id",
    split: TextSplit = "auto",
) -> list[dict[str, str]]:
    """Normalise ``source`` into documents ``{"id": str, "title": str, "text": str}``.

    Args:
        source: list of str/dicts, path to a ``.jsonl`` (one JSON object or string a line) or plain text file, a
            ``datasets`` folder or ``datasets.Dataset`` (anything ``dynvocab.data.sources.iter_records`` reads).
        text_field, title_field, id_field: keys (or columns) to read; a missing title is ``""`` and a missing id is
            the document's position.
        split: for plain text files: ``"lines"`` (one document a line), ``"paragraphs"`` (blank-line separated) or
            ``"auto"`` (paragraphs when the file has a blank line, else lines).
    """
    if split not in _PARAGRAPHS:
        raise ValueError(f"split={split!r} is not supported; use 'auto', 'lines' or 'paragraphs'")
    if isinstance(source, (str, Path)) and not Path(source).expanduser().exists():
        raise ValueError(f"document file {str(source)!r} does not exist; pass an existing .jsonl or .txt path")
    records = iter_records(source, text_field, streaming=False, paragraphs=_PARAGRAPHS[split])
    documents = [_document(record, i, text_field, title_field, id_field) for i, record in enumerate(records)]
    _check_unique_ids(documents)
    return documents


def _document(record: Record, position: int, text_field: str, title_field: str, id_field: str) -> dict[str, str]:
    text = record.text(text_field).strip() if isinstance(record.value, str) else record.text(text_field)
    fields = record.value if isinstance(record.value, Mapping) else {}
    doc_id, title = fields.get(id_field), fields.get(title_field)
    return {
        "id": str(position) if doc_id is None else str(doc_id),
        "title": "" if title is None else str(title),
        "text": text,
    }


def _check_unique_ids(documents: list[dict[str, str]]) -> None:
    seen: set[str] = set()
    for position, document in enumerate(documents):
        if document["id"] in seen:
            raise ValueError(
                f"document id {document['id']!r} appears twice (again at position {position}); ids must be unique"
            )
        seen.add(document["id"])


def documents_record(documents: list[dict[str, str]]) -> dict[str, Any]:
    """What a file computed from an index's documents records of them: their count and the sha256 of their ids and
    texts, in order."""
    digest = hashlib.sha256()
    for document in documents:
        digest.update(f"{document.get('id')}\0{document['text']}\0".encode())
    return {"count": len(documents), "sha256": digest.hexdigest()}


def warn_if_other_documents(directory: Path, record: dict[str, Any], documents: list[dict[str, str]], what: str,
                            command: str) -> None:
    """Warn when the store in ``directory`` beside an index, whose ``record`` this is, was computed for other
    ``documents`` than the index holds; ``command`` rebuilds it."""
    if record.get("documents") != documents_record(documents):
        logger.warning("the %s in %s were computed for other documents than the index now holds: fewer will be found "
                       "there; run `%s --overwrite`", what, directory, command)
