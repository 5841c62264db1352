"""``HybridIndex``: DupMAE's dense [CLS] part in FAISS, its sparse vocabulary part in a :class:`SparseIndex`.

:meth:`HybridIndex.search` takes the top candidates of each part (FAISS's exact dense top; the sparse part's
pruned posting lists), re-scores their union exactly (dense dot by FAISS's ``compute_distance_subset``,
sparse dot from the forward store) and returns the best ``k``, the same ``(scores, ids)`` as
``DocumentIndex.search``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from dynvocab.config import as_int

from encoders.hybrid import HybridEncoder, HybridVectors

from .ann import as_vectors
from .documents import TextSplit, load_documents
from .hybrid_storage import encoder_record, read_hybrid_dir, write_hybrid_dir
from .sparse import SparseIndex

__all__ = ["HybridIndex"]

logger = logging.getLogger(__name__)


class HybridIndex:
    """Documents searchable by ``dense . dense + sparse . sparse``; a drop-in for ``DocumentIndex`` in the pipeline.

    Args:
        dense: exact inner-product FAISS index of the dense parts, or ``None`` (sparse only).
        sparse: the sparse parts, or ``None`` (dense only).
        documents: ``{"id", "title", "text"}`` per row.
        candidates: how many candidates each part proposes before the exact re-scoring of their union
            (at least ``k`` of a search).
        query_terms: a query's heaviest sparse entries whose posting lists propose the sparse candidates.
    """

    def __init__(self, dense: faiss.IndexFlatIP | None, sparse: SparseIndex | None, documents: list[dict[str, str]], *,
                 encoder: HybridEncoder | None = None, encoder_info: dict[str, Any] | None = None,
                 candidates: int = 32, query_terms: int = 16) -> None:
        assert dense is not None or sparse is not None, "at least one part"
        assert dense is None or dense.ntotal == len(documents), "one dense vector per document"
        assert sparse is None or len(sparse) == len(documents), "one sparse row per document"
        for name, value in (("candidates", candidates), ("query_terms", query_terms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int, e.g. {32 if name == 'candidates' else 16}")
        self.dense, self.sparse, self.documents = dense, sparse, documents
        self.encoder, self.encoder_info = encoder, encoder_info
        self.candidates, self.query_terms = candidates, query_terms
        self.directory: Path | None = None  # the folder it was loaded from (phrase vectors may sit beside it)

    @classmethod
    def build(cls, source: Any, encoder: HybridEncoder | None = None, *, vectors: HybridVectors | None = None,
              vocab_size: int | None = None, candidates: int = 32, query_terms: int = 16, posting_terms: int = 32,
              text_field: str = "text",
              title_field: str = "title", id_field: str = "id", split: TextSplit = "auto", batch_size: int = 32,
              show_progress_bar: bool | None = None) -> HybridIndex:
        """Load documents from ``source`` (see ``load_documents``), encode them (or take ``vectors``) and index them.

        ``posting_terms``: each document's heaviest sparse entries that go into the posting lists (see
        :class:`SparseIndex`); ``candidates`` and ``query_terms`` as in the class.
        """
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
        dense, sparse = _build_parts(vectors, vocab_size, posting_terms)
        info = encoder_record(encoder) if encoder is not None else None
        return cls(dense, sparse, documents, encoder=encoder, encoder_info=info, candidates=candidates,
                   query_terms=query_terms)

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
        return self.sparse.vocab_size if self.sparse is not None else None

    def nbytes(self) -> dict[str, int]:
        """Bytes held in memory: the dense vectors and the sparse part (forward store and posting lists)."""
        dense = self.dense.ntotal * self.dense.d * 4 if self.dense is not None else 0
        sparse = 0 if self.sparse is None else self.sparse.nbytes()
        return {"dense": dense, "sparse": sparse, "total": dense + sparse}

    def exhaustive(self) -> HybridIndex:
        """The same index with every document a candidate of both parts: exact scores, no pruning (slow; a reference)."""
        return HybridIndex(self.dense, self.sparse, self.documents, encoder=self.encoder, encoder_info=self.encoder_info,
                           candidates=len(self), query_terms=self.vocab_size or 1)

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
        k = as_int(k, "k", minimum=1)
        query = self.embed_queries(queries)
        n, width = len(self), min(max(k, self.candidates), len(self))
        pools = []
        if self.dense is not None:
            pools.append(self.dense.search(np.ascontiguousarray(query.dense, dtype=np.float32), width)[1])
        has_sparse = self.sparse is not None and query.ids.shape[1] > 0
        if has_sparse:
            pools.append(self.sparse.candidates(query.ids, query.values, width, self.query_terms))
        candidates = np.sort(np.concatenate(pools, axis=1), axis=1)
        repeated = np.zeros_like(candidates, dtype=bool)
        repeated[:, 1:] = candidates[:, 1:] == candidates[:, :-1]
        candidates = np.ascontiguousarray(np.where(candidates < 0, 0, candidates), dtype=np.int64)
        scores = np.zeros(candidates.shape, dtype=np.float32)
        if self.dense is not None:
            dense = np.ascontiguousarray(query.dense, dtype=np.float32)
            self.dense.compute_distance_subset(len(dense), faiss.swig_ptr(dense), candidates.shape[1],
                                               faiss.swig_ptr(scores), faiss.swig_ptr(candidates))
        if has_sparse:
            scores += self.sparse.scores(query.ids, query.values, candidates)
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

    def save(self, directory: str | Path) -> Path:
        """Write the dense FAISS index, the sparse postings and ``metadata.json`` atomically, with hashes."""
        metadata = {"num_documents": len(self), "candidates": self.candidates, "query_terms": self.query_terms,
                    "encoder": self.encoder_info,
                    "documents": {"ids": [d["id"] for d in self.documents], "titles": [d["title"] for d in self.documents],
                                  "texts": [d["text"] for d in self.documents]}}
        self.directory = write_hybrid_dir(Path(directory), self.dense, self.sparse, metadata)
        return self.directory

    @classmethod
    def load(cls, directory: str | Path, encoder: HybridEncoder | None = None) -> HybridIndex:
        """Read an index written by :meth:`save`, checking hashes and that ``encoder`` matches the one that built it."""
        dense, sparse, metadata = read_hybrid_dir(Path(directory), encoder)
        docs = metadata["documents"]
        documents = [{"id": i, "title": t, "text": x} for i, t, x in zip(docs["ids"], docs["titles"], docs["texts"])]
        loaded = cls(dense, sparse, documents, encoder=encoder, encoder_info=metadata["encoder"],
                     candidates=metadata["candidates"], query_terms=metadata["query_terms"])
        loaded.directory = Path(directory)
        return loaded


def _build_parts(vectors: HybridVectors, vocab_size: int | None,
                 posting_terms: int) -> tuple[faiss.IndexFlatIP | None, SparseIndex | None]:
    dense = None
    if vectors.dense.shape[1]:
        dense = faiss.IndexFlatIP(vectors.dense.shape[1])
        dense.add(as_vectors(vectors.dense, name="dense vectors"))
    sparse = None
    if vectors.ids.shape[1]:
        if vocab_size is None:
            raise ValueError("vectors have a sparse part but vocab_size is None; pass vocab_size= (the tokenizer's size)")
        sparse = SparseIndex(vectors.ids, vectors.values, vocab_size, posting_terms)
    return dense, sparse
