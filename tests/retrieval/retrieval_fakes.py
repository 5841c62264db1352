"""A model-free encoder for retrieval tests (imported by conftest and the tests)."""

from __future__ import annotations

import zlib

import numpy as np


class HashEncoder:
    """Deterministic bag-of-words encoder: each word is a fixed random vector (seeded by the word)."""

    def __init__(self, dim: int = 16, seed: int = 0, name: str = "hash-encoder", pooling: str = "mean") -> None:
        self.dim, self.seed, self.name, self.pooling, self.normalize = dim, seed, name, pooling, True

    def encode(self, texts, batch_size: int = 32, show_progress_bar=None) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row] += np.random.default_rng([zlib.crc32(word.encode()), self.seed]).standard_normal(self.dim)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
