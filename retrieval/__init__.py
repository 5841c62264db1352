"""Document retrieval (faiss) and phrase extraction from retrieved documents."""

from .ann import IndexConfig, exact_search, recall_at_k
from .documents import load_documents
from .index import DocumentIndex, Encoder
from .phrases import ENGLISH_STOPWORDS, extract_phrases

__all__ = [
    "DocumentIndex",
    "ENGLISH_STOPWORDS",
    "Encoder",
    "IndexConfig",
    "exact_search",
    "extract_phrases",
    "load_documents",
    "recall_at_k",
]
