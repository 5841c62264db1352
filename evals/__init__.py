"""Evaluation metrics for dynamic-vocabulary generation: repetition, perplexity, MAUVE, latency, compression, ranking.

Each metric is a plain function over precomputed inputs with an optional step that
computes them; none keeps a global model cache. MAUVE needs ``pip install dynvocab[evals]``.
"""

from .compression import CompressionResult, compression, compression_from_segments
from .latency import LatencyStats, StageTimer, summarize, time_callable
from .mauve import (
    Features,
    MauveResult,
    causal_lm_features,
    gpt2_large_features,
    mauve_score,
    minilm_features,
    sentence_embedding_features,
)
from .perplexity import PerplexityResult, perplexity, perplexity_from_logprobs, token_logprobs
from .ranking import hits_at_k, mrr_at_k, ndcg_at_k, ranking_metrics, recall_at_k
from .repetition import RepetitionResult, diversity, ngram_counts, rep_n

__all__ = [
    "CompressionResult",
    "Features",
    "LatencyStats",
    "MauveResult",
    "PerplexityResult",
    "RepetitionResult",
    "StageTimer",
    "causal_lm_features",
    "compression",
    "compression_from_segments",
    "diversity",
    "gpt2_large_features",
    "hits_at_k",
    "mauve_score",
    "mrr_at_k",
    "ndcg_at_k",
    "minilm_features",
    "ngram_counts",
    "perplexity",
    "perplexity_from_logprobs",
    "ranking_metrics",
    "recall_at_k",
    "rep_n",
    "sentence_embedding_features",
    "summarize",
    "time_callable",
    "token_logprobs",
]
