"""A corpus encoded in shards, by several processes or machines, and the shards merged into one index.

Shard ``i`` of ``n`` is a contiguous block of the documents' rows. One process encodes it into its own folder,
``shard-00003-of-00008/`` (``vectors.npy``: float32 ``(rows, d)``; ``shard.json``: its rows, the documents' count
and sha256, the encoder's record), written atomically: a shard folder that exists is complete, so a killed run
resumes by encoding only the shards still missing. The merge checks that the shards were computed for these
documents, by the merging encoder, and tile the rows, then builds the index over their vectors.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from dynvocab.config import as_int
from dynvocab.io.atomic import atomic_directory, verify

from .ann import as_vectors
from .documents import documents_record
from .storage import check_encoder, encoder_record

logger = logging.getLogger(__name__)

SHARD_FORMAT = "dynvocab.IndexShard"
VECTORS_FILE = "vectors.npy"
SHARD_FILE = "shard.json"


def shard_rows(num_documents: int, shard: int, num_shards: int) -> range:
    """The rows of shard ``shard`` of ``num_shards``: contiguous, as equal as can be, together all ``num_documents``."""
    num_shards = as_int(num_shards, "num_shards", minimum=1)
    shard = as_int(shard, "shard", minimum=0)
    if shard >= num_shards:
        raise ValueError(f"shard {shard} does not exist in {num_shards} shards; shards are numbered 0..{num_shards - 1}")
    return range(num_documents * shard // num_shards, num_documents * (shard + 1) // num_shards)


def shard_path(directory: str | Path, shard: int, num_shards: int) -> Path:
    return Path(directory) / f"shard-{shard:05d}-of-{num_shards:05d}"


def encode_shard(
    documents: list[dict[str, str]],
    encoder: Any,
    directory: str | Path,
    shard: int,
    num_shards: int,
    *,
    batch_size: int = 32,
    show_progress_bar: bool | None = None,
) -> Path:
    """Encode shard ``shard`` of ``num_shards`` of ``documents`` into ``directory``; returns its folder.

    A shard already written for these documents by this encoder is kept as it is (resume); one written for other
    documents or by another encoder raises ``ValueError`` before anything is encoded.
    """
    path = shard_path(directory, shard, num_shards)
    rows = shard_rows(len(documents), shard, num_shards)
    record = documents_record(documents)
    if _is_written(path):
        _check_shard(path, record, encoder)
        logger.info("shard %d of %d is already in %s: kept", shard, num_shards, path)
        return path
    texts = [documents[row]["text"] for row in rows]
    vectors = (as_vectors(encoder.encode(texts, batch_size=batch_size, show_progress_bar=show_progress_bar),
                          dim=encoder.dim) if texts else np.empty((0, encoder.dim), dtype=np.float32))
    with atomic_directory(path) as staging:
        np.save(staging / VECTORS_FILE, vectors)
        (staging / SHARD_FILE).write_text(json.dumps({
            "format": SHARD_FORMAT, "shard": shard, "num_shards": num_shards, "rows": [rows.start, rows.stop],
            "documents": record, "dimension": int(encoder.dim), "encoder": encoder_record(encoder)}), encoding="utf-8")
    return path


def missing_shards(directory: str | Path, num_shards: int) -> list[int]:
    """The shards of ``num_shards`` with no complete folder in ``directory`` yet."""
    return [shard for shard in range(num_shards) if not _is_written(shard_path(directory, shard, num_shards))]


def read_shards(documents: list[dict[str, str]], directory: str | Path, num_shards: int,
                encoder: Any = None) -> np.ndarray:
    """The vectors ``(len(documents), d)`` of all ``num_shards`` shards in ``directory``, in document order.

    ``ValueError`` names a missing shard (and the command that writes it), or one computed for other documents,
    or by another encoder.
    """
    missing = missing_shards(directory, num_shards)
    if missing:
        raise ValueError(f"{len(missing)} of {num_shards} shards are not in {directory} yet (the first: shard "
                         f"{missing[0]}); encode them (dynvocab index ... --shards {directory} --num-shards "
                         f"{num_shards} --shard {missing[0]}) and merge again")
    record = documents_record(documents)
    parts = []
    for shard in range(num_shards):
        path = shard_path(directory, shard, num_shards)
        _check_shard(path, record, encoder)
        parts.append(np.load(path / VECTORS_FILE))  # its rows follow from the documents' count, checked above
    dims = {part.shape[1] for part in parts}
    if len(dims) > 1:
        raise ValueError(f"the shards in {directory} hold vectors of dimensions {sorted(dims)}: they were encoded by "
                         "different encoders; delete them and encode every shard with one encoder")
    return np.concatenate(parts)


def _is_written(path: Path) -> bool:
    """Whether the shard's folder is complete. Nothing is recovered here: another process may be writing it right now
    (its own ``atomic_directory`` recovers a killed save of it before writing)."""
    return (path / SHARD_FILE).is_file()


def _check_shard(path: Path, record: dict[str, Any], encoder: Any) -> None:
    verify(path)
    metadata = json.loads((path / SHARD_FILE).read_text(encoding="utf-8"))
    if metadata.get("format") != SHARD_FORMAT:
        raise ValueError(f"{path} is not a dynvocab index shard; point --shards at a folder `dynvocab index` wrote")
    if metadata["documents"] != record:
        raise ValueError(f"{path} was encoded for other documents ({metadata['documents']['count']} of them) than "
                         f"the {record['count']} given now; use another --shards folder, or delete this one")
    check_encoder(metadata, encoder, path)
