"""FAISS building blocks: exact and approximate inner-product indexes, tuning, recall.

Exact ``IndexFlatIP`` search is the reference that the approximate indexes (IVF,
IVF-PQ, HNSW) are measured and tuned against. IVF-PQ stores each vector as ``pq_m``
bytes (and its 8-byte id) instead of ``4 d``: the index for corpora whose vectors do not fit in memory, at a recall
that ``pq_m`` sets (docs/indexing.md has the figures).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import faiss
import numpy as np

from dynvocab.config import JsonConfig, as_int, check_field_types

logger = logging.getLogger(__name__)

IndexType = Literal["auto", "flat", "ivf", "ivfpq", "hnsw"]

#: the index types with inverted lists (an ``nprobe``)
IVF_KINDS = ("ivf", "ivfpq")

#: Which faiss search-time knob each approximate index type has.
SEARCH_PARAM = {"ivf": "nprobe", "ivfpq": "nprobe", "hnsw": "efSearch"}


@dataclass
class IndexConfig(JsonConfig):
    """How a :class:`~retrieval.DocumentIndex` builds and tunes its faiss index."""

    index_type: IndexType = field(default="auto", metadata={"help": "'flat', 'ivf', 'ivfpq', 'hnsw' or 'auto' (by size)"})
    flat_max_size: int = field(default=50_000, metadata={"help": "'auto' uses exact flat search up to this size"})
    auto_approximate: Literal["ivf", "hnsw"] = field(default="ivf", metadata={"help": "'auto' above flat_max_size"})
    nlist: int | None = field(default=None, metadata={"help": "IVF lists; None: 4*sqrt(n), >= 39 points a list"})
    nprobe: int | None = field(default=None, metadata={"help": "IVF lists probed; None: tuned to target_recall"})
    pq_m: int | None = field(default=None, metadata={"help": "IVF-PQ bytes a vector; None: d/4 (96 for MiniLM, which GPU "
                                                           "faiss takes too; d must divide by it)"})
    pq_bits: int = field(default=8, metadata={"help": "IVF-PQ bits a sub-quantizer code (faiss: 8 is the fast one)"})
    hnsw_m: int = field(default=32, metadata={"help": "HNSW neighbours per node"})
    ef_construction: int = field(default=80, metadata={"help": "HNSW candidate list size while building"})
    ef_search: int | None = field(default=None, metadata={"help": "HNSW candidates at search; None: tuned"})
    target_recall: float = field(default=0.95, metadata={"help": "recall@tune_k the tuning aims for"})
    tune_k: int = field(default=32, metadata={"help": "k used when tuning nprobe/efSearch"})
    tune_queries: int = field(default=256, metadata={"help": "sampled document vectors used as tuning queries"})
    tune_margin: int = field(
        default=2, metadata={"help": "multiply a setting tuned on document vectors (easier than real queries) by this"}
    )
    use_gpu: bool = field(default=True, metadata={"help": "move flat/IVF indexes to a GPU when faiss has one"})
    seed: int = field(default=0, metadata={"help": "seed for k-means and query sampling"})

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.index_type not in ("auto", "flat", *IVF_KINDS, "hnsw"):
            raise ValueError(f"index_type={self.index_type!r} is not supported; use 'auto', 'flat', 'ivf', 'ivfpq' or "
                             "'hnsw'")
        if self.auto_approximate not in ("ivf", "hnsw"):
            raise ValueError(f"auto_approximate={self.auto_approximate!r} must be 'ivf' or 'hnsw'")
        for name in ("flat_max_size", "hnsw_m", "ef_construction", "tune_k", "tune_queries", "tune_margin"):
            _check_positive(name, getattr(self, name))
        for name in ("nlist", "nprobe", "ef_search", "pq_m"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if not 1 <= as_int(self.pq_bits, "pq_bits") <= 16:
            raise ValueError(f"pq_bits={self.pq_bits} must be in 1..16 (8 is faiss's fast path)")
        if not 0.0 < self.target_recall <= 1.0:
            raise ValueError(f"target_recall={self.target_recall!r} must be in (0, 1], e.g. 0.95")


def _check_positive(name: str, value: Any) -> None:
    as_int(value, name, minimum=1)


def as_vectors(array: Any, name: str = "vectors", dim: int | None = None) -> np.ndarray:
    """Check and convert to a C-contiguous float32 ``(n, d)`` array (a ``(d,)`` vector becomes ``(1, d)``)."""
    array = np.asarray(array)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"{name} must be a numeric (n, d) array, got dtype {array.dtype} and shape {array.shape}")
    if dim is not None and array.shape[1] != dim:
        raise ValueError(f"{name} have dimension {array.shape[1]} but the index has {dim}; use the same encoder")
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contain NaN or infinite values")
    return array


def resolve_index_type(config: IndexConfig, n: int) -> str:
    """The concrete index type for ``n`` vectors ('auto' picks flat up to ``flat_max_size``)."""
    if config.index_type != "auto":
        return config.index_type
    return "flat" if n <= config.flat_max_size else config.auto_approximate


def default_nlist(n: int) -> int:
    """About ``4 * sqrt(n)`` lists, but at least 39 training points a list (faiss's minimum)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def build_index(vectors: np.ndarray, kind: str, config: IndexConfig) -> faiss.Index:
    """A CPU faiss inner-product index of type ``kind`` holding ``vectors`` (ids are row numbers)."""
    n, d = vectors.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif kind in IVF_KINDS:
        nlist = min(config.nlist or default_nlist(n), n)
        if kind == "ivf":
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        else:
            m = pq_subquantizers(d, n, config)
            index = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, nlist, m, config.pq_bits, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = config.seed
        index.train(vectors)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.ef_construction
    else:
        raise ValueError(f"index type {kind!r} is not supported; use 'flat', 'ivf', 'ivfpq' or 'hnsw'")
    index.add(vectors)
    return index


def pq_subquantizers(d: int, n: int, config: IndexConfig) -> int:
    """IVF-PQ's ``m`` (bytes a vector at 8 bits), checked against the dimension and the number of vectors."""
    m = config.pq_m or max(1, d // 4)
    if d % m:
        raise ValueError(f"pq_m={m} does not divide the vectors' dimension {d}; pick a divisor of {d} (e.g. {d // 4})")
    if n < 2**config.pq_bits:
        raise ValueError(f"IVF-PQ with pq_bits={config.pq_bits} trains {2**config.pq_bits} centroids a sub-quantizer "
                         f"and needs at least as many vectors, got {n}; use index_type='flat' or 'ivf' for so few")
    return m


def index_bytes(index: faiss.Index) -> int:
    """The bytes of a CPU index serialised: what it takes on disk and, within a few percent, in memory."""
    return int(faiss.serialize_index(index).nbytes)


def exact_search(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force inner-product top-``k``: ``(scores (q, k) float32, ids (q, k) int64)``."""
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    return flat.search(queries, k)


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean fraction of the exact top-k ids ``(q, k)`` found in the approximate ids ``(q, k')``.

    ``-1`` (no result) in ``exact_ids`` is not counted; in ``approx_ids`` it is a miss.
    """
    approx_ids, exact_ids = np.asarray(approx_ids), np.asarray(exact_ids)
    if approx_ids.ndim != 2 or exact_ids.ndim != 2 or approx_ids.shape[0] != exact_ids.shape[0]:
        raise ValueError(
            f"approx_ids {approx_ids.shape} and exact_ids {exact_ids.shape} must be (q, k) arrays with the same q"
        )
    recalls = []
    for approx, exact in zip(approx_ids, exact_ids):
        exact = exact[exact >= 0]
        if exact.size:
            recalls.append(np.isin(exact, approx).mean())
    return float(np.mean(recalls)) if recalls else 1.0


def get_search_param(index: faiss.Index, kind: str) -> int | None:
    """The current ``nprobe`` (IVF) or ``efSearch`` (HNSW); ``None`` for flat."""
    if kind in IVF_KINDS:
        return int(faiss.extract_index_ivf(index).nprobe)
    if kind == "hnsw":
        return int(faiss.downcast_index(index).hnsw.efSearch)
    return None


def set_search_param(index: faiss.Index, kind: str, value: int) -> None:
    """Set ``nprobe`` (IVF) or ``efSearch`` (HNSW) on a CPU or GPU index."""
    if kind not in SEARCH_PARAM:
        return
    space = faiss.GpuParameterSpace() if is_gpu_index(index) else faiss.ParameterSpace()
    space.set_index_parameter(index, SEARCH_PARAM[kind], int(value))


def tune_search_param(
    index: faiss.Index, kind: str, queries: np.ndarray, exact_ids: np.ndarray, target_recall: float
) -> tuple[int, float]:
    """Smallest power-of-two ``nprobe``/``efSearch`` whose recall@k reaches ``target_recall``.

    ``exact_ids`` are the flat top-k of ``queries``; returns ``(value, recall)``. IVF-PQ aims for ``target_recall``
    of what its codes reach with every list probed (its ceiling: the codes, not the lists, lose the rest). When no
    value reaches the target, the largest tried is kept and a warning logged.
    """
    k = exact_ids.shape[1]
    if kind in IVF_KINDS:
        limit = faiss.extract_index_ivf(index).nlist
        candidates = [2**i for i in range(int(math.log2(limit)) + 1)] + [limit]
    else:
        candidates = [max(16, k) * 2**i for i in range(8)]
    if kind == "ivfpq":
        set_search_param(index, kind, limit)
        ceiling = recall_at_k(index.search(queries, k)[1], exact_ids)
        logger.info("IVF-PQ's codes reach recall@%d %.3f with every list probed: aiming for %.3f of it", k, ceiling,
                    target_recall)
        target_recall *= ceiling
    recall = 0.0
    for value in candidates:
        set_search_param(index, kind, value)
        recall = recall_at_k(index.search(queries, k)[1], exact_ids)
        if recall >= target_recall:
            break
    else:
        logger.warning("%s=%d reaches recall@%d %.3f only (target %.3f)", SEARCH_PARAM[kind], value, k, recall,
                       target_recall)
    logger.info("tuned %s=%d: recall@%d %.3f", SEARCH_PARAM[kind], value, k, recall)
    return value, recall


def gpu_available() -> bool:
    """Whether this faiss build has GPU support and sees a GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def is_gpu_index(index: faiss.Index) -> bool:
    return type(index).__name__.startswith("Gpu")


def to_gpu(index: faiss.Index, kind: str) -> faiss.Index:
    """Move a flat, IVF or IVF-PQ index to GPU 0 when possible (faiss has no GPU HNSW); else return it."""
    if kind == "hnsw" or not gpu_available():
        return index
    resources = faiss.StandardGpuResources()
    options = faiss.GpuClonerOptions()
    options.useFloat16 = kind == "ivfpq"  # float16 lookup tables: what lets GPU IVF-PQ take more than 48 bytes a vector
    gpu_index = faiss.index_cpu_to_gpu(resources, 0, index, options)
    gpu_index.dynvocab_resources = resources  # the GPU index must not outlive its resources
    logger.info("moved the %s index to GPU 0", kind)
    return gpu_index


def to_cpu(index: faiss.Index) -> faiss.Index:
    return faiss.index_gpu_to_cpu(index) if is_gpu_index(index) else index


def reconstruct_all(index: faiss.Index, kind: str) -> np.ndarray:
    """All stored vectors ``(n, d)`` of a CPU index, in id order (IVF-PQ's are decoded, so only close to the originals)."""
    if kind in IVF_KINDS:
        faiss.extract_index_ivf(index).make_direct_map()
    return index.reconstruct_n(0, index.ntotal)
