"""``dynvocab eval-retrieval`` (the default, full-corpus run; ``--quick true`` runs :mod:`.quick_protocol`): BM25, MiniLM as shipped and any trained encoders
given, each over all 10,033 leads with exact scoring (:mod:`.corpus`), compared with MiniLM as shipped by
paired-bootstrap 95% intervals. Trains nothing: trained encoders come from ``dynvocab finetune-encoder``.

Documents are truncated at 256 tokens (MiniLM's own ``max_seq_length``) and encoded in float32 unless the device
computes bf16 natively (``dynvocab.hardware.precision``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np
import torch

from dynvocab.data.assets import resolve_model
from dynvocab.hardware.precision import encode_autocast, encode_autocast_dtype
from retrieval.loading import document_encoder, is_hybrid_encoder

from .config import RetrievalEvalConfig
from .corpus import (
    BASELINE,
    bm25_rankings,
    compare_with,
    dense_rankings,
    full_corpus,
    hybrid_rankings,
    served_hybrid_latency,
    system_scores,
)
from .embedding_cache import cached_vectors, weights_fingerprint
from .quick_protocol import evaluate_quick
from .report import save_report, write_markdown

__all__ = ["BASELINE_ENCODER", "FULL_MAX_LENGTH", "encoder_scores", "evaluate_full_corpus", "evaluate_retrieval"]

logger = logging.getLogger(__name__)

#: the encoder every system is compared with (:data:`.full_corpus.BASELINE`): the offline all-MiniLM-L6-v2
BASELINE_ENCODER = "minilm"
#: tokens per document and query in the full-corpus mode: MiniLM's own max_seq_length
FULL_MAX_LENGTH = 256

Scores = dict[str, dict[str, list[float]]]  # {query set: {metric: per-query values}}


def _bm25(documents: list[dict], sets: dict[str, list[dict]]) -> tuple[Scores, dict]:
    texts = [d["text"] for d in documents]
    return {name: system_scores(bm25_rankings(texts, [q["question"] for q in queries]), documents, queries)
            for name, queries in sets.items()}, {}


def _retriever(resolved: str, max_length: int) -> tuple[Callable, Callable, dict, torch.device, Callable | None]:
    """``(encode(texts, progress), rank(doc vectors, query vectors), identity, device, served)`` of a dense or hybrid
    encoder; ``identity`` (kind and settings) is part of the cache key; ``served(doc vectors, query vectors, exact ids)``
    times a hybrid's index as served (``None`` for a dense encoder)."""
    if is_hybrid_encoder(resolved):
        from encoders.hybrid import HybridEncoder

        hybrid = HybridEncoder.from_pretrained(resolved, representation="both", max_length=max_length)

        def encode_hybrid(items: list[str], progress: bool = False):
            with encode_autocast(hybrid.device):
                return hybrid.encode(items, show_progress_bar=progress)

        return encode_hybrid, partial(hybrid_rankings, vocab_size=hybrid.vocab_size), \
            {"kind": "hybrid", "config": asdict(hybrid.config)}, hybrid.device, \
            partial(served_hybrid_latency, vocab_size=hybrid.vocab_size)
    dense = document_encoder(resolved, max_length=max_length)

    def encode_dense(items: list[str], progress: bool = False):
        return dense.encode(items, show_progress_bar=progress)

    return encode_dense, dense_rankings, {"kind": "dense", "config": dense.config.to_dict()}, dense.device, None


def encoder_scores(path: str, documents: list[dict], sets: dict[str, list[dict]], cache_dir: str | Path,
                   max_length: int = FULL_MAX_LENGTH, baseline: Callable | None = None) -> tuple[Scores, dict, Callable]:
    """Per-query scores of a dense or hybrid encoder (folder, Hub name or ``"minilm"``), its costs (encoding
    seconds and documents/s, index bytes, exact-search ms/query) and its ``encode(texts, progress)``; corpus vectors
    come from ``cache_dir`` if there. With ``baseline`` (another encoder's ``encode``) the two encode the first query
    set's first queries one at a time in turns, and a hybrid's index as served is timed against a flat dense one."""
    resolved = resolve_model(path)
    encode, rank, identity, device, served = _retriever(resolved, max_length)
    identity["weights"] = weights_fingerprint(resolved)
    docs, cost = cached_vectors(lambda items: encode(items, True), [d["text"] for d in documents], identity, cache_dir)
    scores, latency, extra = {}, {}, {}
    for name, queries in sets.items():
        found = encode([q["question"] for q in queries])
        ids, latency[name] = rank(docs, found)
        scores[name] = system_scores(ids, documents, queries)
        if served is not None and baseline is not None and "served" not in extra:
            extra["served"] = served(docs, found, ids)
    if baseline is not None:
        extra["query_encoding"] = paired_encode_ms(encode, baseline, [q["question"] for q in next(iter(sets.values()))])
    dtype = encode_autocast_dtype("auto", device)
    return scores, {"kind": identity["kind"], "encode_seconds": cost["seconds"], "documents_per_s": cost["documents_per_s"],
                    "cached": cost["cached"], "index_bytes": _index_bytes(docs), "ms_per_query": latency,
                    "dtype": str(dtype or "float32").removeprefix("torch."), **extra}, encode


def paired_encode_ms(encode: Callable, baseline: Callable, queries: list[str], count: int = 64) -> dict[str, float]:
    """Median ms to encode one query alone with ``encode`` and with ``baseline``, in turns over ``count`` queries."""
    pairs = []
    for query in queries[:count]:
        pair = []
        for fn in (encode, baseline):
            start = time.perf_counter()
            fn([query])
            pair.append(1e3 * (time.perf_counter() - start))
        pairs.append(pair)
    times = np.array(pairs)
    return {"ms": float(np.median(times[:, 0])), "baseline_ms": float(np.median(times[:, 1])),
            "ratio": float(np.median(times[:, 0] / times[:, 1]))}


def _index_bytes(docs) -> int:
    """Bytes of an exact index: float32 dense vectors; a hybrid's sparse entries as 16-bit ids and float32 values."""
    if isinstance(docs, np.ndarray):
        return int(docs.nbytes)
    return int(docs.dense.nbytes + docs.values.nbytes + 2 * docs.ids.size)


def evaluate_full_corpus(config: RetrievalEvalConfig, command: str = "") -> Path:
    """Score every system, write ``results.json`` and ``report.md`` into the output folder; returns the report."""
    documents, sets = full_corpus(config.full_heldout_queries)
    logger.info("full corpus: %d documents; query sets %s", len(documents), {k: len(v) for k, v in sets.items()})
    cache = Path(config.work_dir) / "embeddings"
    *shipped, baseline = encoder_scores(BASELINE_ENCODER, documents, sets, cache)
    runs = {"BM25 (bm25s)": _bm25(documents, sets), BASELINE: tuple(shipped)}
    for path in config.encoder_list:
        runs[path] = encoder_scores(path, documents, sets, cache, baseline=baseline)[:2]
    base = runs[BASELINE][0]
    systems = {name: {query_set: compare_with(base[query_set], scores[query_set], seed=config.bootstrap_seed)
                      for query_set in sets} for name, (scores, _) in runs.items()}
    record = {"command": command, "config": config.to_dict(), "documents": len(documents),
              "queries": {k: len(v) for k, v in sets.items()}, "systems": systems,
              "costs": {name: cost for name, (_, cost) in runs.items()}}
    return save_report(record, config.output_path, write_markdown)


def evaluate_retrieval(config: RetrievalEvalConfig, command: str = "") -> Path:
    """``dynvocab eval-retrieval``: the full-corpus run, or with ``quick`` the quick one; returns the report path."""
    return evaluate_quick(config, command) if config.quick else evaluate_full_corpus(config, command)
