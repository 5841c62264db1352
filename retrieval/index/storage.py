"""Index folders on disk: ``index.faiss`` plus ``metadata.json``, written atomically, read with checks."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from dynvocab.io.atomic import atomic_directory, file_sha256, recover

logger = logging.getLogger(__name__)

INDEX_FILE = "index.faiss"
METADATA_FILE = "metadata.json"
FORMAT = "dynvocab.DocumentIndex"
FORMAT_VERSION = 1
#: Encoded once at build and again at load: the same encoder gives (nearly) the same vector.
PROBE_TEXT = "dynvocab encoder fingerprint: the quick brown fox jumps over the lazy dog."
#: the same encoder under bf16 autocast and in float32 gives cosine 0.99999 on the probe; MiniLM and the default
#: retriever fine-tuned from it (``minilm-wikipedia``) give 0.995, so a looser bound took one for the other
PROBE_MIN_COSINE = 0.999


def folder_beside(index: Any, name: str) -> Path:
    """``<index folder>/<name>``: where what is computed from an index's documents is kept beside it."""
    folder = getattr(index, "directory", None)
    if folder is None:
        raise ValueError("this index was not loaded from a folder; save it (index.save(path)) and load it, "
                         f"or pass directory= for its {name.replace('_', ' ')}")
    return Path(folder) / name


def encoder_record(encoder: Any) -> dict[str, Any]:
    """What the metadata records about an encoder: name, dim, pooling, normalisation and a probe vector."""
    probe = np.asarray(encoder.encode([PROBE_TEXT], show_progress_bar=False), dtype=np.float32)[0]
    config = getattr(encoder, "config", None)
    return {
        "name": encoder.name,
        "dim": int(encoder.dim),
        "pooling": getattr(encoder, "pooling", None),
        "normalize": getattr(encoder, "normalize", None),
        "max_length": getattr(config, "max_length", None),
        "amp_dtype": getattr(config, "amp_dtype", None),
        "probe": [round(float(x), 6) for x in probe],
    }


def write_index_dir(target: Path, index: faiss.Index, metadata: dict[str, Any]) -> Path:
    """Write to a temporary sibling folder, then swap it in (``dynvocab.io.atomic``): a failed save leaves ``target`` as it was."""
    if target.exists() and not target.is_dir():
        raise ValueError(f"cannot save an index to {str(target)!r}: it is a file; pass a folder path")
    if target.is_dir() and any(target.iterdir()) and not (target / METADATA_FILE).exists():
        raise ValueError(
            f"refusing to overwrite {str(target)!r}: it is a non-empty folder that holds no saved index; "
            "pass a new or empty folder"
        )
    with atomic_directory(target) as staging:
        index_path = staging / INDEX_FILE
        faiss.write_index(index, os.fspath(index_path))
        record = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "faiss_version": faiss.__version__,
            "index_file": INDEX_FILE,
            "index_bytes": index_path.stat().st_size,
            "index_sha256": file_sha256(index_path),
            **metadata,
        }
        with open(staging / METADATA_FILE, "w", encoding="utf-8") as handle:
            json.dump(record, handle, ensure_ascii=False)
    logger.info("saved the index to %s", target)
    return target


def read_index_dir(directory: Path, encoder: Any = None) -> tuple[faiss.Index, dict[str, Any]]:
    """Read and check a saved index folder; returns the CPU faiss index and the metadata."""
    recover(directory)
    metadata = _read_metadata(directory)
    index = _read_faiss(directory, metadata)
    check_encoder(metadata, encoder, directory)
    return index, metadata


def _read_metadata(directory: Path) -> dict[str, Any]:
    path = directory / METADATA_FILE
    if not path.is_file():
        raise ValueError(
            f"no saved index at {str(directory)!r} ({METADATA_FILE} is missing); "
            "build one with DocumentIndex.build(...) and .save(path)"
        )
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path} is truncated or corrupted ({error}); rebuild the index and save it again"
        ) from error
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"{path} was not written by DocumentIndex.save; load a folder that DocumentIndex.save wrote")
    if metadata.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path} has format version {metadata['format_version']}, newer than this library reads "
            f"({FORMAT_VERSION}); upgrade dynvocab"
        )
    missing = [key for key in REQUIRED_KEYS if key not in metadata]
    if missing:
        raise ValueError(f"{path} lacks {missing}: it was edited or cut short after saving; rebuild the index and save "
                         "it again (or restore the folder from a backup)")
    return metadata


#: what _read_faiss and the loaders read from the metadata
REQUIRED_KEYS = ("index_file", "index_bytes", "index_sha256", "dimension", "num_documents", "documents")


def _read_faiss(directory: Path, metadata: dict[str, Any]) -> faiss.Index:
    path = directory / metadata["index_file"]
    fix = "rebuild the index and save it again (or restore the folder from a backup)"
    if not path.is_file():
        raise ValueError(f"{path} is missing; {fix}")
    size = path.stat().st_size
    if size != metadata["index_bytes"]:
        raise ValueError(f"{path} is truncated or altered: {size} bytes, {metadata['index_bytes']} expected; {fix}")
    if file_sha256(path) != metadata["index_sha256"]:
        raise ValueError(f"{path} is corrupted: its sha256 does not match {METADATA_FILE}; {fix}")
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as error:
        raise ValueError(f"faiss {faiss.__version__} cannot read {path} ({error}); {fix}") from error
    expected = (metadata["dimension"], metadata["num_documents"], len(metadata["documents"]["ids"]))
    if (index.d, index.ntotal, index.ntotal) != expected:
        raise ValueError(
            f"{path} holds {index.ntotal} vectors of dimension {index.d}, but {METADATA_FILE} lists "
            f"{expected[2]} documents of dimension {expected[0]}; {fix}"
        )
    return index


def check_encoder(metadata: dict[str, Any], encoder: Any, directory: Path) -> None:
    """Raise ``ValueError`` when ``encoder`` is not the one that built the index."""
    if encoder is None:
        return
    saved = metadata.get("encoder")
    if encoder.dim != metadata["dimension"]:
        built_by = f"encoder {saved['name']!r}" if saved else "precomputed vectors"
        raise ValueError(
            f"the index at {str(directory)!r} holds {metadata['dimension']}-dim vectors from {built_by}, but "
            f"encoder {encoder.name!r} gives {encoder.dim}-dim vectors; load it with the encoder that built it "
            "or rebuild the index with this encoder"
        )
    if saved is None:
        logger.warning("the index at %s was built from precomputed vectors; cannot check encoder %r", directory,
                       encoder.name)
        return
    fix = (f"load it with the encoder that built it (DenseEncoder({saved['name']!r}, ...); on the command line "
           f"--encoder {saved['name']}), or rebuild the index with this encoder")
    for setting in ("pooling", "normalize"):
        ours = getattr(encoder, setting, None)
        if saved.get(setting) is not None and ours is not None and ours != saved[setting]:
            raise ValueError(
                f"the index at {str(directory)!r} was built with {setting}={saved[setting]!r}, but the encoder "
                f"passed uses {setting}={ours!r}; {fix}"
            )
    same_name = encoder.name == saved["name"]
    if saved.get("probe") is None:
        if not same_name:
            raise ValueError(f"the index at {str(directory)!r} was built by encoder {saved['name']!r}, "
                             f"not {encoder.name!r}; {fix}")
        return
    cosine = _probe_cosine(encoder, np.asarray(saved["probe"], dtype=np.float32))
    if cosine < PROBE_MIN_COSINE:
        what = "a different encoder" if not same_name else "an encoder of the same name with different weights"
        raise ValueError(
            f"the index at {str(directory)!r} was built by encoder {saved['name']!r}; {encoder.name!r} is {what} "
            f"(its vectors differ: cosine {cosine:.3f} on a probe text); {fix}"
        )
    if not same_name:
        logger.warning("encoder %r gives the same vectors as %r, which built the index; accepting it",
                       encoder.name, saved["name"])


def _probe_cosine(encoder: Any, saved: np.ndarray) -> float:
    probe = np.asarray(encoder.encode([PROBE_TEXT], show_progress_bar=False), dtype=np.float32)[0]
    denominator = float(np.linalg.norm(probe) * np.linalg.norm(saved)) or 1.0
    return float(probe @ saved) / denominator
