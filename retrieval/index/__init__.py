"""Document retrieval: dense (faiss), sparse and hybrid indexes over a corpus, saved as checked folders."""

from .ann import IndexConfig, exact_search, recall_at_k
from .dense import DocumentIndex, Encoder
from .documents import load_documents
from .hybrid import HybridIndex
from .sparse import SparseIndex

__all__ = ["DocumentIndex", "Encoder", "HybridIndex", "IndexConfig", "SparseIndex", "exact_search", "load_documents",
           "recall_at_k"]
