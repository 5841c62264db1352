"""Reading training texts one at a time from files, ``datasets`` datasets or Python iterables.

:func:`iter_texts` never loads a large corpus whole: text and JSONL files are read
line by line, and Hub or local ``datasets`` folders are opened with ``streaming=True``.
:func:`wikipedia_split` gives the offline Wikipedia stand-in split into train and held-out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..corpora import WIKIPEDIA_HELD_OUT, split_documents
from ..jsonl import iter_jsonl

__all__ = ["iter_texts", "wikipedia_split"]

logger = logging.getLogger(__name__)

_JSONL_SUFFIXES = {".jsonl", ".ndjson"}
_PATH_SUFFIXES = {".txt", ".text", ".md", ".jsonl", ".ndjson", ".json", ".csv", ".parquet", ".arrow"}
_SNIFF_CHARS = 1 << 20


def iter_texts(
    source: str | os.PathLike | Iterable[str],
    text_field: str = "text",
    streaming: bool = True,
    *,
    split: str = "train",
    name: str | None = None,
    paragraphs: bool | None = None,
) -> Iterator[str]:
    """Yield the non-empty texts of ``source`` one by one.

    ``source`` may be:

    * a path to a ``.jsonl``/``.ndjson`` file: one JSON object per line, text in ``text_field``;
    * a path to any other text file: paragraphs separated by blank lines
      (``paragraphs=True``), one text per line (``paragraphs=False``), or, by default,
      paragraphs when the first MiB holds a blank line and lines otherwise;
    * a folder written by ``Dataset.save_to_disk`` (memory-mapped), or a folder of data
      files, read with ``datasets.load_dataset(folder, split=split, streaming=streaming)``;
    * a Hub dataset name (``name`` is its config), loaded the same way;
    * a ``datasets.Dataset``/``IterableDataset`` (column ``text_field``) or any iterable of strings.

    Texts are stripped of surrounding whitespace; empty ones are skipped. A missing
    path raises ``ValueError`` at the call; a bad JSONL line raises when it is reached.
    """
    if isinstance(source, (str, os.PathLike)):
        texts = _iter_path_or_hub(source, text_field, streaming, split, name, paragraphs)
    elif _is_datasets_object(source):
        texts = _iter_dataset(source, text_field)
    elif isinstance(source, Iterable):
        texts = _iter_strings(source)
    else:
        raise TypeError(
            f"source={source!r} is a {type(source).__name__}; pass a path, a Hub dataset name, "
            "a datasets.Dataset or an iterable of strings"
        )
    return _non_empty(texts)


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        text = text.strip()
        if text:
            yield text


def _iter_path_or_hub(source, text_field, streaming, split, name, paragraphs) -> Iterator[str]:
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix.lower() in _JSONL_SUFFIXES:
            return _iter_jsonl(path, text_field)
        return _iter_text_file(path, paragraphs)
    if path.is_dir():
        if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
            import datasets

            return _iter_dataset(datasets.load_from_disk(str(path)), text_field, split)
        return _iter_dataset(_load_dataset(str(path), name, split, streaming), text_field)
    if _looks_like_path(str(source)):
        raise ValueError(
            f"source={str(source)!r} does not exist; check the path (relative paths start from {os.getcwd()!r})"
        )
    return _iter_dataset(_load_dataset(str(source), name, split, streaming), text_field)


def _looks_like_path(source: str) -> bool:
    """A Hub id is ``name`` or ``org/name``; anything else that is missing on disk is a wrong path."""
    return (
        source.startswith(("/", ".", "~"))
        or source.count("/") > 1
        or os.sep != "/" and os.sep in source
        or Path(source).suffix.lower() in _PATH_SUFFIXES
    )


def _load_dataset(source: str, name: str | None, split: str, streaming: bool):
    import datasets

    try:
        return datasets.load_dataset(source, name, split=split, streaming=streaming)
    except (ConnectionError, FileNotFoundError) as error:
        raise ValueError(
            f"source={source!r} is neither a local path nor a reachable Hub dataset ({error}); "
            "check the path or name, or pass the texts as an iterable of strings"
        ) from error


def _iter_jsonl(path: Path, text_field: str) -> Iterator[str]:
    for number, record in iter_jsonl(path):
        if not isinstance(record, dict) or text_field not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"{path}:{number} has no field text_field={text_field!r} (found {keys}); "
                "pass text_field= naming the field that holds the text"
            )
        value = record[text_field]
        if not isinstance(value, str):
            raise ValueError(
                f"{path}:{number}: field {text_field!r} holds a {type(value).__name__}, not a string; "
                "pass text_field= naming a string field"
            )
        yield value


def _iter_text_file(path: Path, paragraphs: bool | None) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        if paragraphs is None:
            head = handle.read(_SNIFF_CHARS)
            paragraphs = any(not line.strip() for line in head.splitlines()[1:-1])
            handle.seek(0)
            logger.debug("%s: reading %s", path, "paragraphs" if paragraphs else "one text per line")
        if not paragraphs:
            yield from handle
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
    module = type(source).__module__ or ""
    return module.startswith("datasets.")


def _iter_dataset(dataset, text_field: str, split: str = "train") -> Iterator[str]:
    if isinstance(dataset, dict):  # DatasetDict / IterableDatasetDict
        if split not in dataset:
            raise ValueError(f"split={split!r} is not in this DatasetDict (splits: {list(dataset)}); pass split=")
        dataset = dataset[split]
    columns = getattr(dataset, "column_names", None)
    if columns is not None and text_field not in columns:
        raise ValueError(f"text_field={text_field!r} is not a column (columns: {columns}); pass text_field=")
    return _iter_rows(dataset, text_field)


def _iter_rows(dataset, text_field: str) -> Iterator[str]:
    for number, row in enumerate(dataset):
        if text_field not in row:
            raise ValueError(
                f"row {number} has no field text_field={text_field!r} (found {sorted(row)}); pass text_field="
            )
        yield row[text_field]


def _iter_strings(source: Iterable) -> Iterator[str]:
    for number, text in enumerate(source):
        if not isinstance(text, str):
            raise TypeError(
                f"item {number} of source is a {type(text).__name__}, not a string; "
                "pass an iterable of strings (or a datasets.Dataset with text_field=)"
            )
        yield text


def wikipedia_split(held_out: float = WIKIPEDIA_HELD_OUT, seed: int = 0) -> tuple[list[str], list[str]]:
    """(train, held-out) texts of the offline Wikipedia leads (``dynvocab.assets.wikipedia_leads``)."""
    from dynvocab.assets import wikipedia_leads

    train, heldout = split_documents(wikipedia_leads(), held_out, seed)
    return [d["text"] for d in train], [d["text"] for d in heldout]
