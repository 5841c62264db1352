"""Load a corpus into a list of ``{"id", "title", "text"}`` dicts.

Sources: a list of str or dicts, a JSONL file, a plain text file (one document per
line, or per blank-line separated paragraph) or a ``datasets.Dataset``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from dynvocab.jsonl import iter_jsonl

logger = logging.getLogger(__name__)

TextSplit = Literal["auto", "lines", "paragraphs"]

_BLANK_LINE = re.compile(r"\n[ \t]*\n")


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
        source: list of str/dicts, path to a ``.jsonl`` (one JSON object or string a
            line) or plain text file, or a ``datasets.Dataset``.
        text_field, title_field, id_field: keys (or columns) to read; a missing title is
            ``""`` and a missing id is the document's position.
        split: for plain text files: ``"lines"`` (one document a line),
            ``"paragraphs"`` (blank-line separated) or ``"auto"`` (paragraphs when the
            file has a blank line, else lines).
    """
    if split not in ("auto", "lines", "paragraphs"):
        raise ValueError(f"split={split!r} is not supported; use 'auto', 'lines' or 'paragraphs'")
    if isinstance(source, (str, os.PathLike)):
        records = _read_file(Path(source), split)
    elif _is_dataset(source):
        records = _dataset_records(source, text_field, title_field, id_field)
    elif isinstance(source, Iterable) and not isinstance(source, (bytes, Mapping)):
        records = list(source)
    else:
        raise TypeError(
            f"source is {type(source).__name__}; pass a list of str/dicts, a file path or a datasets.Dataset"
        )
    documents = [_document(record, i, text_field, title_field, id_field) for i, record in enumerate(records)]
    _check_unique_ids(documents)
    return documents


def _read_file(path: Path, split: TextSplit) -> list[Any]:
    if not path.is_file():
        raise ValueError(f"document file {str(path)!r} does not exist; pass an existing .jsonl or .txt path")
    if path.suffix in (".jsonl", ".ndjson"):
        return [record for _, record in iter_jsonl(path, fix="write one JSON object a line")]
    text = path.read_text(encoding="utf-8")
    if split == "paragraphs" or (split == "auto" and _BLANK_LINE.search(text.strip())):
        chunks = _BLANK_LINE.split(text)
    else:
        chunks = text.splitlines()
    return [chunk.strip() for chunk in chunks if chunk.strip()]


def _is_dataset(source: Any) -> bool:
    # Import-free check: a user holding a Dataset has already imported `datasets`.
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(source, datasets.Dataset)


def _dataset_records(dataset: Any, text_field: str, title_field: str, id_field: str) -> list[dict]:
    columns = dataset.column_names
    if text_field not in columns:
        raise ValueError(f"text_field={text_field!r} is not a column of the dataset {columns}; pass text_field=")
    wanted = [name for name in (text_field, title_field, id_field) if name in columns]
    values = {name: list(dataset[name]) for name in wanted}
    return [{name: values[name][i] for name in wanted} for i in range(len(dataset))]


def _document(record: Any, position: int, text_field: str, title_field: str, id_field: str) -> dict[str, str]:
    if isinstance(record, str):
        record = {text_field: record}
    if not isinstance(record, Mapping):
        raise TypeError(f"document {position} is {type(record).__name__}; documents are str or dicts")
    text = record.get(text_field)
    if not isinstance(text, str):
        raise ValueError(
            f"document {position} has no str field {text_field!r} (keys: {sorted(record)}); pass text_field="
        )
    doc_id = record.get(id_field)
    title = record.get(title_field)
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
