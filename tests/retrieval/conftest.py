"""Retrieval fixtures: synthetic vectors with known neighbours and a model-free encoder."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import HashEncoder


@pytest.fixture
def hash_encoder() -> HashEncoder:
    return HashEncoder()


@pytest.fixture(scope="session")
def clustered():
    """2,000 unit vectors in 20 clusters (d=32), and 200 queries that are slightly noisy copies of known documents.

    Noise (norm ~0.06) is far below the gap between distinct documents (norm ~0.9 within a cluster),
    so each query's exact nearest neighbour is the document it was copied from.
    """
    rng = np.random.default_rng(0)
    n, d = 2000, 32
    centers = rng.standard_normal((20, d))
    vectors = centers[rng.integers(0, 20, n)] + 0.6 * rng.standard_normal((n, d))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    targets = rng.choice(n, size=200, replace=False)
    queries = vectors[targets] + 0.01 * rng.standard_normal((200, d))
    documents = [{"id": f"doc-{i}", "title": f"Title {i}", "text": f"text of document {i}"} for i in range(n)]
    return vectors.astype(np.float32), documents, queries.astype(np.float32), targets
