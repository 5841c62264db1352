"""Hybrid index folders: ``dense.faiss``, ``sparse.safetensors`` and ``metadata.json``, written atomically.

The same safety as ``DocumentIndex`` folders (:mod:`retrieval.index.storage`): the folder is swapped in
whole (``dynvocab.io.atomic``), each data file's size and sha256 are recorded and checked on load with
an error naming the file, NaN/Inf is refused, and the encoder passed at load must give the vectors
the index was built with.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from dynvocab.io.atomic import atomic_directory, file_sha256, recover
from encoders.hybrid import REPRESENTATIONS, HybridVectors, hybrid_scores

from .sparse import SparseIndex
from .storage import METADATA_FILE, PROBE_TEXT

#: the hybrid check keeps the bound it had: its probe mixes the dense cosine with the top-k sparse part, whose bf16
#: and float32 versions were not compared (the dense check is tighter, `storage.PROBE_MIN_COSINE`)
HYBRID_PROBE_MIN_COSINE = 0.99

__all__ = ["DENSE_FILE", "FORMAT", "SPARSE_FILE", "encoder_record", "read_hybrid_dir", "saved_representation",
           "write_hybrid_dir"]

logger = logging.getLogger(__name__)

DENSE_FILE = "dense.faiss"
SPARSE_FILE = "sparse.safetensors"
FORMAT = "dynvocab.HybridIndex"
FORMAT_VERSION = 2
FIX = "rebuild the index and save it again (or restore the folder from a backup)"


def encoder_record(encoder: Any) -> dict[str, Any]:
    """Name, representation and a probe encoding of ``encoder``, checked again at load."""
    probe = encoder.encode([PROBE_TEXT], show_progress_bar=False)
    return {"name": encoder.name, "label": encoder.config.label, "dense_dim": encoder.dim,
            "sparse_k": encoder.config.sparse_k, "max_length": encoder.config.max_length,
            "probe": {"dense": [round(float(x), 6) for x in probe.dense[0]], "ids": probe.ids[0].tolist(),
                      "values": [round(float(x), 6) for x in probe.values[0]]}}


def write_hybrid_dir(target: Path, dense: faiss.Index | None, sparse: SparseIndex | None, metadata: dict[str, Any]) -> Path:
    """Write into a temporary sibling folder, then swap it in: a failed save leaves ``target`` as it was."""
    if target.exists() and not target.is_dir():
        raise ValueError(f"cannot save an index to {str(target)!r}: it is a file; pass a folder path")
    if target.is_dir() and any(target.iterdir()) and not (target / METADATA_FILE).exists():
        raise ValueError(f"refusing to overwrite {str(target)!r}: it is a non-empty folder that holds no saved index; "
                         "pass a new or empty folder")
    with atomic_directory(target) as staging:
        files = {}
        if dense is not None:
            faiss.write_index(dense, os.fspath(staging / DENSE_FILE))
            files[DENSE_FILE] = {"dimension": int(dense.d)}
        if sparse is not None:
            save_file({"ids": sparse.ids, "values": sparse.values}, staging / SPARSE_FILE)
            files[SPARSE_FILE] = {"vocab_size": sparse.vocab_size, "posting_terms": sparse.posting_terms}
        for name, record in files.items():
            record.update(bytes=(staging / name).stat().st_size, sha256=file_sha256(staging / name))
        record = {"format": FORMAT, "format_version": FORMAT_VERSION, "faiss_version": faiss.__version__,
                  "files": files, **metadata}
        (staging / METADATA_FILE).write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    logger.info("saved the hybrid index to %s", target)
    return target


def read_hybrid_dir(directory: Path, encoder: Any = None) -> tuple[faiss.Index | None, SparseIndex | None, dict[str, Any]]:
    """Read and check a folder written by :func:`write_hybrid_dir`: ``(dense, sparse, metadata)``."""
    recover(directory)
    metadata = _read_metadata(directory)
    files, n = metadata["files"], metadata["num_documents"]
    for name in files:
        _check_file(directory / name, files[name])
    dense = sparse = None
    if DENSE_FILE in files:
        try:
            dense = faiss.read_index(os.fspath(directory / DENSE_FILE))
        except RuntimeError as error:
            raise ValueError(f"faiss {faiss.__version__} cannot read {directory / DENSE_FILE} ({error}); {FIX}") from error
        if (dense.ntotal, dense.d) != (n, files[DENSE_FILE]["dimension"]):
            raise ValueError(f"{directory / DENSE_FILE} holds {dense.ntotal} vectors of dimension {dense.d}, but "
                             f"{METADATA_FILE} lists {n} of dimension {files[DENSE_FILE]['dimension']}; {FIX}")
    if SPARSE_FILE in files:
        sparse = _read_sparse(directory / SPARSE_FILE, n, files[SPARSE_FILE])
    _check_encoder(metadata, encoder, directory)
    return dense, sparse, metadata


def saved_representation(directory: Path) -> str:
    """The representation name (``cls``, ``ot``, ``both``, ``both-260``) a saved hybrid index was built with."""
    saved = _read_metadata(directory).get("encoder") or {}
    for name, (use_dense, sparse_k) in REPRESENTATIONS.items():
        if (saved.get("dense_dim", 0) > 0) == use_dense and saved.get("sparse_k") == sparse_k:
            return name
    raise ValueError(f"the index at {str(directory)!r} records no known representation ({saved.get('label')!r}); "
                     f"rebuild it with one of {sorted(REPRESENTATIONS)}")


def _read_metadata(directory: Path) -> dict[str, Any]:
    path = directory / METADATA_FILE
    if not path.is_file():
        raise ValueError(f"no saved index at {str(directory)!r} ({METADATA_FILE} is missing); "
                         "build one with HybridIndex.build(...) and .save(path)")
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is truncated or corrupted ({error}); {FIX}") from error
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ValueError(f"{path} was not written by HybridIndex.save (a DocumentIndex folder loads with "
                         "DocumentIndex.load); load a folder that HybridIndex.save wrote")
    if metadata.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"{path} has format version {metadata['format_version']}, newer than this library reads "
                         f"({FORMAT_VERSION}); upgrade dynvocab")
    if metadata.get("format_version", 0) < FORMAT_VERSION:
        raise ValueError(f"{path} has format version {metadata.get('format_version')}, whose sparse part (a scipy CSC "
                         f"matrix) this library no longer reads; rebuild the index from its documents with this version "
                         "(`dynvocab index ... --encoder PATH`); the old folder is left as it is")
    return metadata


def _check_file(path: Path, record: dict[str, Any]) -> None:
    if not path.is_file():
        raise ValueError(f"{path} is missing; {FIX}")
    if path.stat().st_size != record["bytes"]:
        raise ValueError(f"{path} is truncated or altered: {path.stat().st_size} bytes, {record['bytes']} expected; {FIX}")
    if file_sha256(path) != record["sha256"]:
        raise ValueError(f"{path} is corrupted: its sha256 does not match {METADATA_FILE}; {FIX}")


def _read_sparse(path: Path, n: int, record: dict[str, Any]) -> SparseIndex:
    try:
        arrays = load_file(path)
    except (SafetensorError, OSError) as error:
        raise ValueError(f"cannot read {path} ({error}); {FIX}") from error
    if set(arrays) != {"ids", "values"} or arrays["ids"].shape != arrays["values"].shape or len(arrays["ids"]) != n:
        raise ValueError(f"{path} does not hold the ({n}, k) ids and values of a sparse part; {FIX}")
    try:
        return SparseIndex(arrays["ids"], arrays["values"], record["vocab_size"], record["posting_terms"])
    except ValueError as error:
        raise ValueError(f"{path}: {error}; {FIX}") from error


def _check_encoder(metadata: dict[str, Any], encoder: Any, directory: Path) -> None:
    """Raise ``ValueError`` when ``encoder`` is not the one (and representation) that built the index."""
    saved = metadata.get("encoder")
    if encoder is None:
        return
    if saved is None:
        logger.warning("the index at %s was built from precomputed vectors; cannot check encoder %r", directory,
                       encoder.name)
        return
    fix = f"load it with HybridEncoder.from_pretrained({saved['name']!r}, ...) as built, or rebuild the index"
    if encoder.config.label != saved["label"]:
        raise ValueError(f"the index at {str(directory)!r} holds {saved['label']} vectors, but the encoder passed gives "
                         f"{encoder.config.label}; {fix}")
    probe = saved["probe"]
    old = HybridVectors(np.asarray([probe["dense"]], dtype=np.float32).reshape(1, -1),
                        np.asarray([probe["ids"]], dtype=np.int64).reshape(1, -1),
                        np.asarray([probe["values"]], dtype=np.float32).reshape(1, -1))
    new = encoder.encode([PROBE_TEXT], show_progress_bar=False)
    cross, own, ours = (float(hybrid_scores(a, b)[0, 0]) for a, b in ((new, old), (old, old), (new, new)))
    cosine = cross / (max(own, 1e-12) * max(ours, 1e-12)) ** 0.5
    if cosine < HYBRID_PROBE_MIN_COSINE:
        raise ValueError(f"the index at {str(directory)!r} was built by encoder {saved['name']!r}; {encoder.name!r} gives "
                         f"different vectors (cosine {cosine:.3f} on a probe text); {fix}")
