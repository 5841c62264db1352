"""Phrases from retrieved documents: the retrieve-then-generate path, and the rooms it stands on.

- ``retrieval/`` (here): the pipeline that retrieves documents for a prompt, cuts phrases from them
  (each remembering its source) and generates with them (``PhrasePipeline``, ``extract_phrases``); what decoding
  takes from a request's documents without an index (``DocumentReader``); the request's settings (``PipelineConfig``).
- ``retrieval.index``: document indexes (dense faiss, sparse, hybrid) and their folders.
- ``retrieval.qa``: answers whose phrases cite their documents (``CitationQA``).
- ``retrieval.training``: DupMAE pre-training and contrastive fine-tuning of document encoders.
- ``retrieval.nar``: non-autoregressive generative retrieval over a phrase vocabulary (PIXAR).
"""

from .config import PipelineConfig
from .index import (
    DocumentIndex,
    Encoder,
    HybridIndex,
    IndexConfig,
    SparseIndex,
    exact_search,
    load_documents,
    recall_at_k,
)
from .nar import DocidTrie, NarConfig, NarRetriever, NarTrainConfig, PhraseVocabulary
from .phrases import ENGLISH_STOPWORDS, extract_phrases
from .pipeline import PhrasePipeline, PipelineResult
from .qa import CitationQA, QAConfig, QAResult
from .reading import DocumentReader
from .training import FinetuneConfig, PretrainConfig, finetune, pretrain

__all__ = [
    "CitationQA",
    "DocidTrie",
    "DocumentIndex",
    "DocumentReader",
    "ENGLISH_STOPWORDS",
    "Encoder",
    "FinetuneConfig",
    "HybridIndex",
    "IndexConfig",
    "NarConfig",
    "NarRetriever",
    "NarTrainConfig",
    "PhrasePipeline",
    "PhraseVocabulary",
    "PipelineConfig",
    "PipelineResult",
    "PretrainConfig",
    "QAConfig",
    "QAResult",
    "SparseIndex",
    "exact_search",
    "extract_phrases",
    "finetune",
    "load_documents",
    "pretrain",
    "recall_at_k",
]
