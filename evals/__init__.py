"""Evaluation metrics for dynamic-vocabulary generation: repetition, perplexity, MAUVE, latency, compression, ranking,
QA and citations.

Each metric is a plain function over precomputed inputs with an optional step that
computes them; none keeps a global model cache. MAUVE needs ``pip install dynvocab[evals]``.
"""

from .qa.citations import Statement, alce_citation_scores, answer_support, exact_provenance, hf_entailment, split_statements
from .compression import CompressionResult, compression, compression_from_segments
from .latency import LatencyStats, StageTimer, summarize, time_callable
from .mauve import (
    Features,
    MauveGain,
    MauveResult,
    causal_lm_features,
    gpt2_large_features,
    mauve_score,
    minilm_features,
    paired_mauve_gain,
    sentence_embedding_features,
)
from .perplexity import PerplexityResult, pair_logprobs, perplexity, perplexity_from_logprobs, token_logprobs
from .qa.metrics import exact_match, normalize_answer, qa_scores, rouge_l, str_em, token_f1
from .retrieval.ranking import hits_at_k, mrr_at_k, ndcg_at_k, ranking_metrics, recall_at_k
from .repetition import RepetitionResult, diversity, loops, ngram_counts, rep_n

__all__ = [
    "CompressionResult",
    "Features",
    "LatencyStats",
    "MauveGain",
    "MauveResult",
    "PerplexityResult",
    "RepetitionResult",
    "StageTimer",
    "Statement",
    "alce_citation_scores",
    "answer_support",
    "causal_lm_features",
    "compression",
    "compression_from_segments",
    "diversity",
    "exact_match",
    "exact_provenance",
    "gpt2_large_features",
    "hf_entailment",
    "hits_at_k",
    "loops",
    "mauve_score",
    "minilm_features",
    "mrr_at_k",
    "ndcg_at_k",
    "ngram_counts",
    "normalize_answer",
    "pair_logprobs",
    "paired_mauve_gain",
    "perplexity",
    "perplexity_from_logprobs",
    "qa_scores",
    "ranking_metrics",
    "recall_at_k",
    "rep_n",
    "rouge_l",
    "sentence_embedding_features",
    "split_statements",
    "str_em",
    "summarize",
    "time_callable",
    "token_f1",
    "token_logprobs",
]
