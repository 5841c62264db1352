"""Citation-aware question answering: answers whose phrases carry the documents they came from."""

from .answering import CitationQA, QAConfig, QAResult
from .citations import Citation, strip_markers

__all__ = ["Citation", "CitationQA", "QAConfig", "QAResult", "strip_markers"]
