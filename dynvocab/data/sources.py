"""One reader for every corpus the library takes, for training and indexing alike: a JSONL or text file, a folder
written by ``datasets`` or of data files, a Hub dataset name, a ``datasets`` object, or an iterable of strings or
dicts. Records come one at a time: text files are read line by line, datasets folders and Hub names streamed."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..io.jsonl import iter_jsonl

logger = logging.getLogger(__name__)

_JSONL_SUFFIXES = {".jsonl", ".ndjson"}
_PATH_SUFFIXES = {".txt", ".text", ".md", ".jsonl", ".ndjson", ".json", ".csv", ".parquet", ".arrow"}
_SNIFF_CHARS = 1 << 20


@dataclass(frozen=True)
class Record:
    """One item of a corpus: a text, or a mapping that holds it (and perhaps a title and an id), and where it was read
    (``file:line``, ``row n``, ``item n``) for error messages."""

    value: str | Mapping[str, Any]
    where: str

    def text(self, text_field: str = "text") -> str:
        """The record's text: the string itself, or its ``text_field``; ``ValueError`` naming the record otherwise."""
        if isinstance(self.value, str):
            return self.value
        value = self.value.get(text_field)
        if not isinstance(value, str):
            found = f"it holds a {type(value).__name__}" if text_field in self.value else f"keys: {sorted(self.value)}"
            raise ValueError(f"{self.where} has no str field text_field={text_field!r} ({found}); pass text_field= "
                             "naming the field that holds the text")
        return value


def iter_records(source: str | os.PathLike | Iterable, text_field: str = "text", *, streaming: bool = True,
                 split: str = "train", name: str | None = None, paragraphs: bool | None = None) -> Iterator[Record]:
    """Yield the records of ``source`` one by one.

    ``source`` may be a ``.jsonl``/``.ndjson`` file (one JSON object or string a line); any other text file
    (paragraphs separated by blank lines with ``paragraphs=True``, one text a line with ``False``, and by default
    paragraphs when the first MiB holds a blank line); a folder written by ``Dataset.save_to_disk``, or a folder of
    data files or a Hub dataset name (``name`` its config) read with ``datasets.load_dataset(..., split=split,
    streaming=streaming)``; a ``datasets`` object (column ``text_field``); or an iterable of strings or dicts. A
    missing path raises ``ValueError`` at the call, a bad record when it is reached.
    """
    if isinstance(source, (str, os.PathLike)):
        return _path_or_hub(source, text_field, streaming, split, name, paragraphs)
    if _is_datasets_object(source):
        return _dataset(source, text_field, split)
    if isinstance(source, Iterable) and not isinstance(source, (bytes, Mapping)):
        return _items(source)
    raise TypeError(f"source={source!r} is a {type(source).__name__}; pass a path, a Hub dataset name, a "
                    "datasets.Dataset or an iterable of strings (or dicts with a text field)")


def _path_or_hub(source, text_field, streaming, split, name, paragraphs) -> Iterator[Record]:
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix.lower() in _JSONL_SUFFIXES:
            return (Record(value, f"{path}:{number}")
                    for number, value in iter_jsonl(path, fix="write one JSON object (or string) a line"))
        return (Record(text, f"{path}, text {number}") for number, text in enumerate(_text_file(path, paragraphs), 1))
    if path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            import datasets

            return _dataset(datasets.load_from_disk(str(path)), text_field, split)
        return _dataset(_load_dataset(str(path), name, split, streaming), text_field, split)
    if _looks_like_path(str(source)):
        raise ValueError(f"source={str(source)!r} does not exist; check the path (relative paths start from "
                         f"{os.getcwd()!r})")
    return _dataset(_load_dataset(str(source), name, split, streaming), text_field, split)


def _looks_like_path(source: str) -> bool:
    """A Hub id is ``name`` or ``org/name``; anything else that is missing on disk is a wrong path."""
    return (source.startswith(("/", ".", "~")) or source.count("/") > 1 or os.sep != "/" and os.sep in source
            or Path(source).suffix.lower() in _PATH_SUFFIXES)


def _load_dataset(source: str, name: str | None, split: str, streaming: bool):
    import datasets

    try:
        return datasets.load_dataset(source, name, split=split, streaming=streaming)
    except (ConnectionError, FileNotFoundError) as error:
        raise ValueError(f"source={source!r} is neither a local path nor a reachable Hub dataset ({error}); check the "
                         "path or name, or pass the texts as an iterable of strings") from error


def _text_file(path: Path, paragraphs: bool | None) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        if paragraphs is None:
            head = handle.read(_SNIFF_CHARS)
            paragraphs = any(not line.strip() for line in head.strip().splitlines())
            handle.seek(0)
            logger.debug("%s: reading %s", path, "paragraphs" if paragraphs else "one text per line")
        if not paragraphs:
            yield from (line for line in handle if line.strip())
            return
        lines: list[str] = []
        for line in handle:
            if line.strip():
                lines.append(line)
            elif lines:
                yield "".join(lines)
                lines = []
        if lines:
            yield "".join(lines)


def _is_datasets_object(source) -> bool:
    return (type(source).__module__ or "").startswith("datasets.")


def _dataset(dataset, text_field: str, split: str = "train") -> Iterator[Record]:
    if isinstance(dataset, dict):  # DatasetDict / IterableDatasetDict
        if split not in dataset:
            raise ValueError(f"split={split!r} is not in this DatasetDict (splits: {list(dataset)}); pass split=")
        dataset = dataset[split]
    columns = getattr(dataset, "column_names", None)
    if columns is not None and text_field not in columns:
        raise ValueError(f"text_field={text_field!r} is not a column (columns: {columns}); pass text_field=")
    return (Record(row, f"row {number}") for number, row in enumerate(dataset))


def _items(source: Iterable) -> Iterator[Record]:
    for number, item in enumerate(source):
        if not isinstance(item, (str, Mapping)):
            raise TypeError(f"item {number} of source is a {type(item).__name__}, not a string or a dict; pass an "
                            "iterable of strings (or a datasets.Dataset with text_field=)")
        yield Record(item, f"item {number}")
