"""``HybridIndex``: DupMAE's dense [CLS] part in FAISS, its sparse vocabulary part in an inverted index.

The sparse part is a ``scipy.sparse`` CSC matrix ``(n, V)``: its columns are the posting lists of the
vocabulary ids. Multiplying a query's sparse row by it walks only the posting lists of the query's own
ids (scipy's compiled sparse product), which is what an inverted index does, without a new dependency.
:meth:`HybridIndex.search` takes the top candidates of each part, re-scores their union exactly
(dense dot + sparse dot) and returns the best ``k``, the same ``(scores, ids)`` as ``DocumentIndex.search``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from scipy.sparse import csc_matrix

from encoders.hybrid import HybridEncoder, HybridVectors

from .ann import as_vectors
from .documents import TextSplit, load_documents
from .hybrid_storage import encoder_record, read_hybrid_dir, write_hybrid_dir

__all__ = ["HybridIndex"]

logger = logging.getLogger(__name__)


class HybridIndex:
    """Documents searchable by ``dense . dense + sparse . sparse``; a drop-in for ``DocumentIndex`` in the pipeline.

    Args:
        dense: exact inner-product FAISS index of the dense parts, or ``None`` (sparse only).
        sparse: CSC matrix ``(n, V)`` of the sparse parts, or ``None`` (dense only).
        documents: ``{"id", "title", "text"}`` per row.
        candidates: how many candidates each part proposes before the exact re-scoring of their union.
    """

    def __init__(self, dense: faiss.IndexFlatIP | None, sparse: csc_matrix | None, documents: list[dict[str, str]], *,
                 encoder: HybridEncoder | None = None, encoder_info: dict[str, Any] | None = None,
                 candidates: int = 100) -> None:
        assert dense is not None or sparse is not None, "at least one part"
        assert dense is None or dense.ntotal == len(documents), "one dense vector per document"
        assert sparse is None or sparse.shape[0] == len(documents), "one sparse row per document"
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise ValueError(f"candidates={candidates!r} must be a positive int, e.g. 100")
        self.dense, self.sparse, self.documents = dense, sparse, documents
        self.encoder, self.encoder_info, self.candidates = encoder, encoder_info, candidates

    @classmethod
    def build(cls, source: Any, encoder: HybridEncoder | None = None, *, vectors: HybridVectors | None = None,
              vocab_size: int | None = None, candidates: int = 100, text_field: str = "text",
              title_field: str = "title", id_field: str = "id", split: TextSplit = "auto", batch_size: int = 32,
              show_progress_bar: bool | None = None) -> HybridIndex:
        """Load documents from ``source`` (see ``load_documents``), encode them (or take ``vectors``) and index them."""
        documents = load_documents(source, text_field=text_field, title_field=title_field, id_field=id_field,
                                   split=split)
        if not documents:
            raise ValueError("source holds no documents; an index needs at least one")
        if vectors is None:
            if not isinstance(encoder, HybridEncoder):
                raise TypeError(f"encoder={encoder!r}: pass a HybridEncoder, or precomputed vectors=HybridVectors")
            vectors = encoder.encode([d["text"] for d in documents], batch_size=batch_size,
                                     show_progress_bar=show_progress_bar)
        if not isinstance(vectors, HybridVectors):
            raise TypeError(f"vectors is a {type(vectors).__name__}; pass HybridVectors (HybridEncoder.encode gives them)")
        if len(vectors) != len(documents):
            raise ValueError(f"got {len(vectors)} vectors for {len(documents)} documents; pass one per document")
        vocab_size = encoder.vocab_size if encoder is not None else vocab_size
        dense, sparse = _build_parts(vectors, vocab_size)
        info = encoder_record(encoder) if encoder is not None else None
        return cls(dense, sparse, documents, encoder=encoder, encoder_info=info, candidates=candidates)

    def __len__(self) -> int:
        return len(self.documents)

    def __repr__(self) -> str:
        label = self.encoder_info["label"] if self.encoder_info else None
        return f"HybridIndex(n={len(self)}, dense_dim={self.dim}, sparse={self.sparse is not None}, representation={label!r})"

    @property
    def dim(self) -> int:
        """Size of the dense part (0 without one)."""
        return int(self.dense.d) if self.dense is not None else 0

    @property
    def vocab_size(self) -> int | None:
        return int(self.sparse.shape[1]) if self.sparse is not None else None

    def nbytes(self) -> dict[str, int]:
        """Bytes held in memory: the dense vectors and the sparse postings (values, ids, offsets)."""
        dense = self.dense.ntotal * self.dense.d * 4 if self.dense is not None else 0
        sparse = 0 if self.sparse is None else self.sparse.data.nbytes + self.sparse.indices.nbytes + self.sparse.indptr.nbytes
        return {"dense": dense, "sparse": sparse, "total": dense + sparse}

    def embed_queries(self, queries: list[str] | HybridVectors, batch_size: int = 32) -> HybridVectors:
        """Query vectors: encoded when ``queries`` are str, checked against the index when they are vectors."""
        if isinstance(queries, str):
            queries = [queries]
        if isinstance(queries, (list, tuple)):
            if self.encoder is None:
                raise ValueError("this index has no encoder, so it cannot search with text; pass HybridVectors or load "
                                 "it with HybridIndex.load(path, encoder=HybridEncoder.from_pretrained(...))")
            queries = self.encoder.encode(list(queries), batch_size=batch_size, show_progress_bar=False)
        if not isinstance(queries, HybridVectors):
            raise TypeError(f"queries is a {type(queries).__name__}; pass a list of str or HybridVectors")
        if self.dense is not None:
            as_vectors(queries.dense, name="query dense vectors", dim=self.dim)
        if self.sparse is not None and queries.ids.size and int(queries.ids.max()) >= self.vocab_size:
            raise ValueError(f"query sparse ids reach {int(queries.ids.max())}, past the index's vocabulary of "
                             f"{self.vocab_size}; encode queries with the encoder that built the index")
        return queries

    def search(self, queries: list[str] | HybridVectors, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` documents: ``(scores (q, k) float32, ids (q, k) int64)``; ids are rows, ``-1`` when k > n."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r} must be a positive int")
        query = self.embed_queries(queries)
        n, width = len(self), min(max(k, self.candidates), len(self))
        pools = []
        if self.dense is not None:
            pools.append(self.dense.search(np.ascontiguousarray(query.dense, dtype=np.float32), width)[1])
        sparse_scores = self._sparse_scores(query)
        if sparse_scores is not None:
            pools.append(np.argpartition(-sparse_scores, width - 1, axis=1)[:, :width])
        candidates = np.sort(np.concatenate(pools, axis=1), axis=1)
        repeated = np.zeros_like(candidates, dtype=bool)
        repeated[:, 1:] = candidates[:, 1:] == candidates[:, :-1]
        candidates = np.where(candidates < 0, 0, candidates)
        scores = self._exact_scores(query, candidates, sparse_scores)
        scores[repeated] = -np.inf
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        ids, best = np.take_along_axis(candidates, top, 1), np.take_along_axis(scores, top, 1)
        out_ids = np.full((len(query), k), -1, dtype=np.int64)
        out_scores = np.full((len(query), k), -np.inf, dtype=np.float32)
        kept = min(k, n)
        out_ids[:, :kept], out_scores[:, :kept] = ids[:, :kept], best[:, :kept]
        return out_scores, out_ids

    def search_documents(self, queries: list[str] | HybridVectors, k: int = 10) -> list[list[dict[str, Any]]]:
        """Top-``k`` documents per query as dicts ``{"id", "title", "text", "score"}``, best first."""
        scores, ids = self.search(queries, k)
        return [[{**self.documents[i], "score": float(s)} for s, i in zip(row_scores, row_ids) if i >= 0]
                for row_scores, row_ids in zip(scores, ids)]

    def _sparse_scores(self, query: HybridVectors) -> np.ndarray | None:
        """``(q, n)`` exact sparse dots: the query rows times the posting lists of their ids."""
        if self.sparse is None or not query.ids.shape[1]:
            return None
        rows = query.sparse_matrix(self.vocab_size)
        return np.asarray((rows @ self.sparse.T).todense(), dtype=np.float32)

    def _exact_scores(self, query: HybridVectors, candidates: np.ndarray, sparse: np.ndarray | None) -> np.ndarray:
        """``(q, c)`` hybrid scores of each query's candidates."""
        scores = np.zeros(candidates.shape, dtype=np.float32)
        if self.dense is not None:
            stored = faiss.rev_swig_ptr(self.dense.get_xb(), self.dense.ntotal * self.dense.d)
            matrix = np.asarray(stored).reshape(self.dense.ntotal, self.dense.d)
            scores += np.einsum("qd,qcd->qc", query.dense, matrix[candidates])
        if sparse is not None:
            scores += np.take_along_axis(sparse, candidates, 1)
        return scores

    def save(self, directory: str | Path) -> Path:
        """Write the dense FAISS index, the sparse postings and ``metadata.json`` atomically, with hashes."""
        metadata = {"num_documents": len(self), "candidates": self.candidates, "encoder": self.encoder_info,
                    "documents": {"ids": [d["id"] for d in self.documents], "titles": [d["title"] for d in self.documents],
                                  "texts": [d["text"] for d in self.documents]}}
        return write_hybrid_dir(Path(directory), self.dense, self.sparse, metadata)

    @classmethod
    def load(cls, directory: str | Path, encoder: HybridEncoder | None = None) -> HybridIndex:
        """Read an index written by :meth:`save`, checking hashes and that ``encoder`` matches the one that built it."""
        dense, sparse, metadata = read_hybrid_dir(Path(directory), encoder)
        docs = metadata["documents"]
        documents = [{"id": i, "title": t, "text": x} for i, t, x in zip(docs["ids"], docs["titles"], docs["texts"])]
        return cls(dense, sparse, documents, encoder=encoder, encoder_info=metadata["encoder"],
                   candidates=metadata["candidates"])


def _build_parts(vectors: HybridVectors, vocab_size: int | None) -> tuple[faiss.IndexFlatIP | None, csc_matrix | None]:
    dense = None
    if vectors.dense.shape[1]:
        dense = faiss.IndexFlatIP(vectors.dense.shape[1])
        dense.add(as_vectors(vectors.dense, name="dense vectors"))
    sparse = None
    if vectors.ids.shape[1]:
        if vocab_size is None:
            raise ValueError("vectors have a sparse part but vocab_size is None; pass vocab_size= (the tokenizer's size)")
        if not np.isfinite(vectors.values).all():
            raise ValueError("sparse values contain NaN or infinite values")
        if vectors.ids.min() < 0 or vectors.ids.max() >= vocab_size:
            raise ValueError(f"sparse ids must lie in [0, vocab_size={vocab_size}); got {vectors.ids.min()}..{vectors.ids.max()}")
        sparse = csc_matrix(vectors.sparse_matrix(vocab_size), dtype=np.float32)
    return dense, sparse

