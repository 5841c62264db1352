"""Document retrieval (faiss) and phrase extraction from retrieved documents."""

from .ann import IndexConfig, exact_search, recall_at_k
from .documents import load_documents
from .hybrid_index import HybridIndex
from .index import DocumentIndex, Encoder
from .phrases import ENGLISH_STOPWORDS, extract_phrases
from .sparse_index import SparseIndex

__all__ = [
    "DocumentIndex",
    "ENGLISH_STOPWORDS",
    "Encoder",
    "HybridIndex",
    "IndexConfig",
    "SparseIndex",
    "exact_search",
    "extract_phrases",
    "load_documents",
    "recall_at_k",
]
