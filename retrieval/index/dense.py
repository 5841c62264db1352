"""``DocumentIndex``: documents, their dense vectors and a faiss index over them."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import faiss
import numpy as np

from dynvocab.config import as_int

from .ann import (
    IVF_KINDS,
    SEARCH_PARAM,
    IndexConfig,
    IndexType,
    as_vectors,
    build_index,
    exact_search as flat_top_k,
    get_search_param,
    recall_at_k,
    reconstruct_all,
    resolve_index_type,
    set_search_param,
    to_gpu,
    tune_search_param,
)
from .documents import TextSplit, load_documents
from .storage import encoder_record, read_index_dir, write_index_dir

logger = logging.getLogger(__name__)


@runtime_checkable
class Encoder(Protocol):
    """What an index needs from an encoder (``encoders.DenseEncoder`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def encode(self, texts: list[str], batch_size: int = 32, show_progress_bar: bool | None = None) -> np.ndarray: ...


class DocumentIndex:
    """Documents searchable by inner product of their vectors (cosine for normalised encoders).

    Build with :meth:`build`, query with :meth:`search` (row ids) or
    :meth:`search_documents` (the documents), persist with :meth:`save` / :meth:`load`.
    """

    def __init__(
        self,
        index: faiss.Index,
        documents: list[dict[str, str]],
        *,
        kind: str,
        config: IndexConfig,
        encoder: Encoder | None = None,
        encoder_info: dict[str, Any] | None = None,
    ) -> None:
        assert index.ntotal == len(documents), "one vector per document"
        self.documents = documents
        self.kind = kind
        self.config = config
        self.encoder = encoder
        self.encoder_info = encoder_info
        self.directory: Path | None = None  # the folder it was loaded from (phrase vectors may sit beside it)
        self._cpu_index = index
        self._index = to_gpu(index, kind) if config.use_gpu else index
        self._exact: faiss.Index | None = index if kind == "flat" else None

    @classmethod
    def build(
        cls,
        source: Any,
        encoder: Encoder | None = None,
        *,
        vectors: np.ndarray | None = None,
        index_type: IndexType | None = None,
        tune_queries: list[str] | np.ndarray | None = None,
        config: IndexConfig | None = None,
        text_field: str = "text",
        title_field: str = "title",
        id_field: str = "id",
        split: TextSplit = "auto",
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
    ) -> DocumentIndex:
        """Load documents from ``source`` (see ``load_documents``), encode and index them.

        Pass ``vectors`` ``(n, d)`` to index precomputed vectors instead of encoding;
        ``index_type`` overrides ``config.index_type``. An approximate index is tuned to
        ``config.target_recall`` on ``tune_queries`` (texts or vectors) when given: real
        queries are best. Otherwise it is tuned on sampled document vectors, and the
        setting found is multiplied by ``config.tune_margin``, because real queries lie
        farther from the corpus than its own documents do.
        """
        config = config or IndexConfig()
        if index_type is not None:
            config = replace(config, index_type=index_type)
        documents = load_documents(source, text_field=text_field, title_field=title_field, id_field=id_field,
                                   split=split)
        if not documents:
            raise ValueError("source holds no documents; an index needs at least one")
        if vectors is None:
            if encoder is None:
                raise ValueError("pass an encoder (e.g. encoders.DenseEncoder()) or precomputed vectors=")
            vectors = encoder.encode([d["text"] for d in documents], batch_size=batch_size,
                                     show_progress_bar=show_progress_bar)
        vectors = as_vectors(vectors, dim=encoder.dim if encoder is not None else None)
        if len(vectors) != len(documents):
            raise ValueError(f"got {len(vectors)} vectors for {len(documents)} documents; pass one per document")
        kind = resolve_index_type(config, len(vectors))
        index = build_index(vectors, kind, config)
        info = encoder_record(encoder) if encoder is not None else None
        built = cls(index, documents, kind=kind, config=config, encoder=encoder, encoder_info=info)
        if tune_queries is not None and kind != "flat" and _search_setting(config, kind) is None:
            built.tune(tune_queries)
        else:
            built._tune_on_documents(vectors)
        logger.info("built a %s index of %d documents (d=%d)", kind, len(documents), vectors.shape[1])
        return built

    def __len__(self) -> int:
        return len(self.documents)

    def __repr__(self) -> str:
        name = self.encoder_info["name"] if self.encoder_info else None
        return f"DocumentIndex(n={len(self)}, dim={self.dim}, kind={self.kind!r}, encoder={name!r})"

    @property
    def dim(self) -> int:
        return int(self._cpu_index.d)

    @property
    def search_param(self) -> int | None:
        """``nprobe`` (IVF) or ``efSearch`` (HNSW) in use; ``None`` for flat."""
        return get_search_param(self._cpu_index, self.kind)

    def set_search_param(self, value: int) -> None:
        """Set ``nprobe`` (IVF) or ``efSearch`` (HNSW); ignored for flat."""
        value = as_int(value, "search parameter", minimum=1)
        set_search_param(self._cpu_index, self.kind, value)
        if self._index is not self._cpu_index:
            set_search_param(self._index, self.kind, value)

    def embed_queries(self, queries: list[str] | np.ndarray, batch_size: int = 32) -> np.ndarray:
        """Query vectors ``(q, d)``: encoded when ``queries`` are str, checked when they are vectors."""
        if isinstance(queries, str):
            queries = [queries]
        if isinstance(queries, (list, tuple)) and all(isinstance(q, str) for q in queries):
            if self.encoder is None:
                raise ValueError(
                    "this index has no encoder, so it cannot search with text; pass query vectors or load it "
                    "with DocumentIndex.load(path, encoder=DenseEncoder(<the encoder that built it>))"
                )
            if not queries:
                return np.empty((0, self.dim), dtype=np.float32)
            empty = next((i for i, query in enumerate(queries) if not query.strip()), None)
            if empty is not None:
                raise ValueError(f"query {empty} is empty ({queries[empty]!r}): a search needs text; drop the query or "
                                 "give it words")
            queries = self.encoder.encode(list(queries), batch_size=batch_size, show_progress_bar=False)
        return as_vectors(queries, name="query vectors", dim=self.dim)

    def search(self, queries: list[str] | np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` documents: ``(scores (q, k) float32, ids (q, k) int64)``; ids are rows, ``-1`` when k > n."""
        k = as_int(k, "k", minimum=1)
        vectors = self.embed_queries(queries)
        scores, ids = self._index.search(vectors, k)
        return scores.astype(np.float32, copy=False), ids.astype(np.int64, copy=False)

    def search_documents(self, queries: list[str] | np.ndarray, k: int = 10) -> list[list[dict[str, Any]]]:
        """Top-``k`` documents per query as dicts ``{"id", "title", "text", "score"}``, best first."""
        scores, ids = self.search(queries, k)
        return [
            [{**self.documents[i], "score": float(s)} for s, i in zip(row_scores, row_ids) if i >= 0]
            for row_scores, row_ids in zip(scores, ids)
        ]

    def exact_search(self, queries: list[str] | np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Exact flat top-``k`` over the stored vectors: the reference for :meth:`recall`.

        IVF-PQ stores its vectors compressed, so its reference is their decoded copies; measure it against the
        original vectors with ``retrieval.index.ann.exact_search`` and ``recall_at_k``.
        """
        vectors = self.embed_queries(queries)
        if self._exact is None:
            self._exact = faiss.IndexFlatIP(self.dim)
            self._exact.add(reconstruct_all(self._cpu_index, self.kind))
        return self._exact.search(vectors, k)

    def recall(self, queries: list[str] | np.ndarray, k: int = 10) -> float:
        """Recall@k of this index against exact flat search on ``queries`` (1.0 for flat)."""
        vectors = self.embed_queries(queries)
        return recall_at_k(self.search(vectors, k)[1], self.exact_search(vectors, k)[1])

    def tune(self, queries: list[str] | np.ndarray, k: int | None = None, target_recall: float | None = None) -> float:
        """Pick the smallest ``nprobe``/``efSearch`` reaching ``target_recall`` on ``queries``; returns the recall."""
        if self.kind == "flat":
            return 1.0
        vectors = self.embed_queries(queries)
        k = min(k or self.config.tune_k, len(self))
        return self._tune(vectors, self.exact_search(vectors, k)[1], target_recall)

    def _tune(self, queries: np.ndarray, exact_ids: np.ndarray, target_recall: float | None = None) -> float:
        value, recall = tune_search_param(self._cpu_index, self.kind, queries, exact_ids,
                                          target_recall or self.config.target_recall)
        self.set_search_param(value)
        return recall

    def _tune_on_documents(self, vectors: np.ndarray) -> None:
        if self.kind == "flat":
            return
        explicit = _search_setting(self.config, self.kind)
        if explicit is not None:
            self.set_search_param(explicit)
            return
        rng = np.random.default_rng(self.config.seed)
        sample = vectors[np.sort(rng.choice(len(vectors), size=min(self.config.tune_queries, len(vectors)), replace=False))]
        # the reference is the original vectors, not the index's own (IVF-PQ decodes them only approximately)
        self._tune(sample, flat_top_k(vectors, sample, min(self.config.tune_k, len(self)))[1])
        value = self.search_param * self.config.tune_margin
        if self.kind in IVF_KINDS:
            value = min(value, self._cpu_index.nlist)
        self.set_search_param(value)
        logger.info("%s=%d after a margin of %d for queries unlike documents", SEARCH_PARAM[self.kind], value,
                    self.config.tune_margin)

    def save(self, directory: str | Path) -> Path:
        """Write the faiss index and ``metadata.json`` to ``directory`` atomically; returns the path (now ``directory``)."""
        self.directory = write_index_dir(Path(directory), self._cpu_index, self._metadata())
        return self.directory

    def _metadata(self) -> dict[str, Any]:
        return {
            "index_type": self.kind,
            "config": self.config.to_dict(),
            "search_param": self.search_param,
            "dimension": self.dim,
            "num_documents": len(self),
            "encoder": self.encoder_info,
            "documents": {
                "ids": [d["id"] for d in self.documents],
                "titles": [d["title"] for d in self.documents],
                "texts": [d["text"] for d in self.documents],
            },
        }

    @classmethod
    def load(cls, directory: str | Path, encoder: Encoder | None = None) -> DocumentIndex:
        """Read an index written by :meth:`save`, checking integrity and that ``encoder`` matches."""
        index, metadata = read_index_dir(Path(directory), encoder)
        docs = metadata["documents"]
        documents = [{"id": i, "title": t, "text": x} for i, t, x in zip(docs["ids"], docs["titles"], docs["texts"])]
        config = IndexConfig.from_dict(metadata["config"])
        loaded = cls(index, documents, kind=metadata["index_type"], config=config, encoder=encoder,
                     encoder_info=metadata["encoder"])
        if metadata["search_param"] is not None:
            loaded.set_search_param(int(metadata["search_param"]))
        loaded.directory = Path(directory)
        return loaded


def _search_setting(config: IndexConfig, kind: str) -> int | None:
    """The search setting the config fixes for ``kind`` (``None``: to be tuned)."""
    return config.nprobe if kind in IVF_KINDS else config.ef_search if kind == "hnsw" else None
