"""Index bytes and search latency of dense-only and hybrid indexes, side by side in one run.

Synthetic 10k-document collections: dense parts are Gaussian, sparse ids follow a Zipf law over a
30,522-id vocabulary (as MLM-head weights concentrate on frequent word pieces), values are uniform.
"""

from __future__ import annotations

import time

import faiss
import numpy as np

from encoders.hybrid import HybridVectors
from retrieval.index.hybrid import HybridIndex

__all__ = ["exact_agreement", "index_benchmark", "synthetic_vectors", "time_search"]


def synthetic_vectors(n: int, dense_dim: int, sparse_k: int, vocab_size: int = 30522, seed: int = 0) -> HybridVectors:
    """``n`` random hybrid vectors with ``sparse_k`` distinct Zipf-distributed ids each."""
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal((n, dense_dim)) / np.sqrt(max(dense_dim, 1))).astype(np.float32)
    weights = 1.0 / np.arange(1, vocab_size + 1) ** 0.8
    ids = np.stack([rng.choice(vocab_size, size=sparse_k, replace=False, p=weights / weights.sum()) for _ in range(n)]) \
        if sparse_k else np.zeros((n, 0), dtype=np.int64)
    values = rng.uniform(0.1, 3.0, size=ids.shape).astype(np.float32)
    return HybridVectors(dense, ids.astype(np.int64), values)


def time_search(search, queries, k: int = 10, repeats: int = 3) -> float:
    """Best-of-``repeats`` milliseconds per query of ``search(queries, k)`` over the whole batch."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        search(queries, k)
        best = min(best, time.perf_counter() - start)
    return 1e3 * best / len(queries)


def exact_agreement(found: np.ndarray, exact: np.ndarray, k: int = 10) -> float:
    """Share of the top-``k`` ids of ``found (q, >= k)`` that an exhaustive search's ``exact (q, >= k)`` also
    returns: what pruning the sparse candidates costs, since the scores of the kept ones are exact."""
    return float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(found.tolist(), exact.tolist())]))


def index_benchmark(n: int = 10_000, queries: int = 200, candidates: int = 32, seed: int = 0, rounds: int = 7) -> list[dict]:
    """Bytes and ms/query of dense-only (384, 768) and hybrid (CLS:384/OT:384, CLS:384/OT:260) flat indexes.

    The four searches take turns for ``rounds`` rounds, each timed as the best of 3 calls (the first absorbs
    the switch between FAISS's and torch's thread pools); a row's ms/query is its median over the rounds and
    its latency against dense 384 the median of the per-round ratios, so drifts of a shared machine hit both
    sides of a ratio alike. Random weights make every document's exact sparse score a sum of many tiny
    products, so pruning's effect on the ranking is measured on real vectors (``exact_agreement`` in
    ``dynvocab eval-retrieval``), not here.
    """
    rows, searches = [], []
    for dense_dim in (384, 768):
        docs = synthetic_vectors(n, dense_dim, 0, seed=seed).dense
        index = faiss.IndexFlatIP(dense_dim)
        index.add(docs)
        rows.append({"index": f"dense {dense_dim}", "bytes": int(docs.nbytes)})
        searches.append((index.search, synthetic_vectors(queries, dense_dim, 0, seed=seed + 1).dense))
    for sparse_k in (384, 260):
        index = HybridIndex.build([f"doc {i}" for i in range(n)], vectors=synthetic_vectors(n, 384, sparse_k, seed=seed),
                                  vocab_size=30522, candidates=candidates)
        rows.append({"index": f"hybrid CLS:384/OT:{sparse_k}", "bytes": index.nbytes()["total"],
                     "candidates": index.candidates, "query_terms": index.query_terms,
                     "posting_terms": index.sparse.posting_terms})
        searches.append((index.search, synthetic_vectors(queries, 384, sparse_k, seed=seed + 1)))
    for search, q in searches:
        search(q, 10)
    times = np.array([[time_search(search, q) for search, q in searches] for _ in range(rounds)])
    for row, column in zip(rows, times.T):
        row["ms_per_query"] = float(np.median(column))
        row["latency_vs_dense384"] = float(np.median(column / times[:, 0]))
        row["bytes_vs_dense768"] = row["bytes"] / rows[1]["bytes"]
    return rows
