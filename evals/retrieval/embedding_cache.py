"""Corpus vectors cached on disk per encoder, so a rerun of an evaluation encodes only its queries.

An entry is ``<key>.npz`` (arrays) plus ``<key>.json`` (what was encoded, how long it took), written last: an entry
without its JSON is incomplete and is encoded again. The key hashes the encoder's identity (its name, settings and
the size and time of its weight files) and the texts, so retrained weights or another corpus never hit a stale entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from encoders.hybrid import HybridVectors

__all__ = ["cached_vectors", "weights_fingerprint"]

Vectors = np.ndarray | HybridVectors


def weights_fingerprint(folder: str | Path) -> list[list]:
    """``[[file name, bytes, modified ns], ...]`` of the weight files in ``folder`` (empty for a Hub name)."""
    path = Path(folder)
    if not path.is_dir():
        return []
    files = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".pt"))
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def _key(identity: dict, texts: list[str]) -> str:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()[:24]


def _arrays(vectors: Vectors) -> dict[str, np.ndarray]:
    if isinstance(vectors, HybridVectors):
        return {"dense": vectors.dense, "ids": vectors.ids, "values": vectors.values}
    return {"vectors": np.asarray(vectors, dtype=np.float32)}


def _vectors(arrays: dict[str, np.ndarray]) -> Vectors:
    if "vectors" in arrays:
        return arrays["vectors"]
    return HybridVectors(arrays["dense"], arrays["ids"], arrays["values"])


def cached_vectors(encode: Callable[[list[str]], Vectors], texts: list[str], identity: dict,
                   cache_dir: str | Path) -> tuple[Vectors, dict]:
    """``(encode(texts), record)``, read from ``cache_dir`` when an entry for ``identity`` and ``texts`` is complete.

    ``encode`` returns float32 ``(n, d)`` or :class:`HybridVectors`; ``record`` is ``{"cached", "seconds",
    "documents", "documents_per_s", "path"}``, the seconds being those of the run that encoded them.
    """
    if not isinstance(identity, dict) or not identity:
        raise ValueError(f"identity={identity!r} must be a non-empty dict naming the encoder and its settings")
    folder = Path(cache_dir)
    key = _key(identity, texts)
    meta, data = folder / f"{key}.json", folder / f"{key}.npz"
    if meta.is_file() and data.is_file():
        record = json.loads(meta.read_text(encoding="utf-8"))
        with np.load(data, allow_pickle=False) as arrays:
            return _vectors(dict(arrays)), {**record, "cached": True, "path": str(data)}
    start = time.perf_counter()
    vectors = encode(texts)
    seconds = time.perf_counter() - start
    if len(vectors) != len(texts):
        raise ValueError(f"encode gave {len(vectors)} vectors for {len(texts)} texts; it must return one per text")
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{key}.partial.npz"
    np.savez(partial, **_arrays(vectors))
    os.replace(partial, data)
    record = {"identity": identity, "documents": len(texts), "seconds": seconds,
              "documents_per_s": len(texts) / max(seconds, 1e-9)}
    meta.write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    return vectors, {**record, "cached": False, "path": str(data)}
