"""The full-corpus retrieval evaluation, the headline of ``dynvocab eval-retrieval``: every offline Wikipedia lead
indexed, every document scored exactly, each system compared with MiniLM as shipped on the same queries.

Query sets: the FanOutQA dev sub-questions whose evidence page is a lead; the FanOutQA dev questions themselves
(multi-hop), relevant: the evidence pages of their sub-questions that are leads; and one held-out sentence of each of
``heldout_queries`` held-out leads that are no FanOutQA evidence page (the sentence is cut out of the indexed text,
so the evidence pages stay as published). The run itself (encoders, cache, report) is :mod:`.full_protocol`.
"""

from __future__ import annotations

import random
import time

import faiss
import numpy as np

from encoders.hybrid import HybridVectors
from retrieval.index.hybrid import HybridIndex
from retrieval.training.pairs import held_out_queries

from .footprint import exact_agreement, time_search
from .ranking import paired_difference_interval, paired_relative_interval, per_query_metrics

__all__ = ["BASELINE", "FANOUT", "HELDOUT", "MULTI_HOP", "RANK_DEPTH", "bm25_rankings", "compare_with", "dense_rankings",
           "full_corpus", "hybrid_rankings", "multi_hop_questions", "query_sets_over", "served_hybrid_latency",
           "system_scores"]

#: the system every other is compared with
BASELINE = "MiniLM as shipped"
FANOUT = "FanOutQA sub-questions"
MULTI_HOP = "FanOutQA questions (multi-hop)"
HELDOUT = "held-out sentences"
#: ranks kept per query: past the deepest cut-off reported (recall@32)
RANK_DEPTH = 100


def multi_hop_questions(questions: list[dict]) -> list[dict]:
    """FanOutQA questions as published (nested ``decomposition``s) -> ``{"id", "question", "title": [the evidence
    titles of all their sub-questions, in order]}``; a question without any evidence gives none."""

    def evidence(question: dict) -> list[str]:
        titles = []
        for sub in question.get("decomposition") or []:
            titles += [(sub.get("evidence") or {}).get("title")] + evidence(sub)
        return [t for t in dict.fromkeys(titles) if t]

    found = [{"id": q["id"], "question": q["question"], "title": evidence(q)} for q in questions]
    return [q for q in found if q["title"]]


def query_sets_over(documents: list[dict], held_out: list[dict], questions: list[dict], heldout_queries: int,
                    seed: int = 0, multi_hop: list[dict] = ()) -> tuple[list[dict], dict[str, list[dict]]]:
    """``(indexed documents, {set name: queries {"id", "question", "title"}})`` over all of ``documents``.

    ``multi_hop`` questions (``title``: a list of evidence ids) keep the evidence in ``documents`` and are kept when
    some is left. ``questions`` (``title``: the evidence document's id) are kept when their evidence is in ``documents``; up to
    ``heldout_queries`` of the ``held_out`` documents that are no question's evidence give one held-out sentence
    each, cut out of their indexed text. The documents keep their order.
    """
    ids = {d["id"] for d in documents}
    kept = [q for q in questions if q["title"] in ids]
    evidence = {q["title"] for q in kept}
    candidates = [d for d in held_out if d["id"] in ids and d["id"] not in evidence]
    chosen = random.Random(seed).sample(candidates, min(heldout_queries, len(candidates)))
    queries, cut = held_out_queries(chosen, seed)
    texts = {d["id"]: d["text"] for d in cut}
    indexed = [{**d, "text": texts[d["id"]]} if d["id"] in texts else d for d in documents]
    hops = [{**q, "title": [t for t in q["title"] if t in ids]} for q in multi_hop]
    sets = {FANOUT: kept, MULTI_HOP: [q for q in hops if q["title"]], HELDOUT: queries}
    return indexed, {name: items for name, items in sets.items() if items}


def full_corpus(heldout_queries: int, seed: int = 0) -> tuple[list[dict], dict[str, list[dict]]]:
    """:func:`query_sets_over` on all 10,033 offline leads, the FanOutQA dev questions and sub-questions and the
    held-out split."""
    from dynvocab.data.assets import fanoutqa_dev, wikipedia_leads
    from dynvocab.data.corpora import corpus_split, fanoutqa_subquestions

    return query_sets_over(wikipedia_leads(), corpus_split("wikipedia")[1], fanoutqa_subquestions(), heldout_queries,
                           seed, multi_hop_questions(fanoutqa_dev()))


def dense_rankings(documents: np.ndarray, queries: np.ndarray, k: int = RANK_DEPTH) -> tuple[np.ndarray, float]:
    """Exact inner-product search of ``queries (q, d)`` over ``documents (n, d)``: ``(row ids (q, k), ms/query)``."""
    index = faiss.IndexFlatIP(documents.shape[1])
    index.add(np.ascontiguousarray(documents, dtype=np.float32))
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    return index.search(queries, min(k, len(documents)))[1], time_search(index.search, queries, k=10)


def hybrid_rankings(documents: HybridVectors, queries: HybridVectors, vocab_size: int,
                    k: int = RANK_DEPTH) -> tuple[np.ndarray, float]:
    """Exact hybrid scores (dense dot plus sparse dot, every document a candidate): ``(row ids (q, k), ms/query)``, the
    time being that of this one exhaustive pass (a reference, not the index as served: see
    :func:`served_hybrid_latency`; repeating it would cost minutes per query set at 10k documents)."""
    index = HybridIndex.build([f"doc {i}" for i in range(len(documents))], vectors=documents,
                              vocab_size=vocab_size).exhaustive()
    start = time.perf_counter()
    ids = index.search(queries, min(k, len(documents)))[1]
    return ids, 1e3 * (time.perf_counter() - start) / max(len(queries), 1)


def served_hybrid_latency(documents: HybridVectors, queries: HybridVectors, exact: np.ndarray, vocab_size: int,
                          rounds: int = 7) -> dict:
    """The hybrid index as ``dynvocab index`` builds it (pruned candidates) against a flat dense index of the same
    documents and dimension, timed in turns (the median over ``rounds`` of each best-of-3): ms/query of both, their
    ratio, and the share of the top 10 of ``exact (q, >= 10)`` (the exhaustive ranking) the pruned search returns."""
    served = HybridIndex.build([f"doc {i}" for i in range(len(documents))], vectors=documents, vocab_size=vocab_size)
    dense = faiss.IndexFlatIP(documents.dense.shape[1])
    dense.add(np.ascontiguousarray(documents.dense, dtype=np.float32))
    plain = np.ascontiguousarray(queries.dense, dtype=np.float32)
    k = min(10, len(documents))
    found = served.search(queries, k)[1]
    dense.search(plain, k)
    times = np.array([[time_search(served.search, queries), time_search(dense.search, plain)] for _ in range(rounds)])
    return {"ms_per_query": float(np.median(times[:, 0])), "dense_ms_per_query": float(np.median(times[:, 1])),
            "latency_vs_dense": float(np.median(times[:, 0] / times[:, 1])),
            "top10_agreement": exact_agreement(found, exact, k), "candidates": served.candidates}


def bm25_rankings(texts: list[str], questions: list[str], k: int = RANK_DEPTH) -> np.ndarray:
    """Row ids ``(q, k)`` of the best BM25 (bm25s, English stop words) documents for each question."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(questions, stopwords="en", show_progress=False)
    return retriever.retrieve(tokens, k=min(k, len(texts)), show_progress=False)[0]


def system_scores(rankings: np.ndarray, documents: list[dict], queries: list[dict]) -> dict[str, list[float]]:
    """Per-query recall@1/5/10/32, hits@5, MRR@10 and nDCG@10 of row-id ``rankings (q, k)`` (``-1``: no document)."""
    ranked = [[documents[i]["id"] for i in row if i >= 0] for row in np.asarray(rankings).tolist()]
    return per_query_metrics(ranked, [q["title"] for q in queries])


def compare_with(base: dict[str, list[float]], other: dict[str, list[float]], resamples: int = 2000,
                 seed: int = 0) -> dict[str, dict[str, float]]:
    """Per metric: ``{"mean", "difference", "low", "high"}``, the paired-bootstrap 95% interval of ``other``'s mean
    minus ``base``'s over the same queries; MRR@10 also gets its relative change and interval."""
    out = {}
    for metric, values in other.items():
        low, high = paired_difference_interval(base[metric], values, resamples=resamples, seed=seed)
        out[metric] = {"mean": float(np.mean(values)), "difference": float(np.mean(values) - np.mean(base[metric])),
                       "low": low, "high": high}
    base_mrr = float(np.mean(base["mrr@10"]))
    relative = float(np.mean(other["mrr@10"])) / base_mrr - 1 if base_mrr > 0 else 0.0
    low, high = paired_relative_interval(base["mrr@10"], other["mrr@10"], resamples=resamples, seed=seed)
    out["mrr@10 relative"] = {"mean": relative, "difference": relative, "low": low, "high": high}
    return out

