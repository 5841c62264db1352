"""The full-corpus retrieval evaluation on tiny synthetic corpora whose answers are known by construction."""

import json
import math

import numpy as np
import pytest

from evals.retrieval.corpus import (
    BASELINE,
    FANOUT,
    HELDOUT,
    MULTI_HOP,
    bm25_rankings,
    compare_with,
    dense_rankings,
    multi_hop_questions,
    query_sets_over,
    system_scores,
)
from evals.retrieval.embedding_cache import cached_vectors
from tests.tiny_mlm import save_tiny_mlm


def _document(i: int, sentences: int = 3) -> dict:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    text = " ".join(f"Sentence {s} of document {words[i]} has words." for s in range(sentences))
    return {"id": f"d{i}", "title": f"d{i}", "text": text}


def test_query_sets_keep_answerable_questions_and_cut_held_out_sentences_from_non_evidence_documents():
    documents = [_document(i) for i in range(8)] + [_document(8, sentences=2)]
    questions = [{"id": "q1", "question": "about d1?", "title": "d1"},
                 {"id": "q2", "question": "about d2?", "title": "d2"},
                 {"id": "q3", "question": "about a page not indexed?", "title": "elsewhere"}]
    held_out = [documents[1], documents[5], documents[6], documents[8]]  # d1 is evidence, d8 too short to cut
    hops = [{"id": "m1", "question": "d1 and d2?", "title": ["d1", "elsewhere", "d2"]},
            {"id": "m2", "question": "outside?", "title": ["elsewhere"]}]
    indexed, sets = query_sets_over(documents, held_out, questions, heldout_queries=10, multi_hop=hops)
    assert [q["id"] for q in sets[FANOUT]] == ["q1", "q2"]
    assert sets[MULTI_HOP] == [{"id": "m1", "question": "d1 and d2?", "title": ["d1", "d2"]}]
    assert sorted(q["title"] for q in sets[HELDOUT]) == ["d5", "d6"]
    assert [d["id"] for d in indexed] == [d["id"] for d in documents]
    changed = {d["id"] for d, original in zip(indexed, documents) if d["text"] != original["text"]}
    assert changed == {"d5", "d6"}  # the evidence pages stay as published
    by_id = {d["id"]: d["text"] for d in indexed}
    assert all(q["question"] not in by_id[q["title"]] for q in sets[HELDOUT])
    _, fewer = query_sets_over(documents, held_out, questions, heldout_queries=1)
    assert len(fewer[HELDOUT]) == 1 and MULTI_HOP not in fewer  # an empty set is left out


def test_a_multi_hop_question_is_relevant_to_the_evidence_of_all_its_sub_questions():
    published = [{"id": "a", "question": "Top?", "decomposition": [
        {"id": "a1", "question": "first?", "evidence": {"title": "P"}, "decomposition": [
            {"id": "a11", "question": "deeper?", "evidence": {"title": "Q"}}]},
        {"id": "a2", "question": "again?", "evidence": {"title": "P"}},
        {"id": "a3", "question": "no page?", "evidence": None}]},
        {"id": "b", "question": "No evidence at all?", "decomposition": []}]
    assert multi_hop_questions(published) == [{"id": "a", "question": "Top?", "title": ["P", "Q"]}]


def test_exact_dense_search_gives_the_hand_computed_figures():
    """40 one-hot documents; query 0 finds its document first, query 1 third, query 2 last (40th, past 32)."""
    documents = np.eye(40, dtype=np.float32)
    queries = np.zeros((3, 40), dtype=np.float32)
    queries[0, 0] = 1
    queries[1, [5, 6, 7]] = [3, 2, 1]
    queries[2, 1:] = np.arange(39, 0, -1)  # every document but d0 scores above it
    ids, ms = dense_rankings(documents, queries)
    assert ids.shape == (3, 40) and ms >= 0
    docs = [{"id": f"d{i}"} for i in range(40)]
    scores = system_scores(ids, docs, [{"title": "d0"}, {"title": "d7"}, {"title": "d0"}])
    assert scores["recall@1"] == [1, 0, 0]
    assert scores["recall@5"] == scores["recall@10"] == scores["recall@32"] == [1, 1, 0]
    assert scores["mrr@10"] == pytest.approx([1, 1 / 3, 0])
    assert scores["ndcg@10"] == pytest.approx([1, 1 / math.log2(4), 0])


def test_bm25_ranks_the_only_document_holding_the_query_words_first():
    texts = ["the eiffel tower stands in paris", "a cat sat on the mat", "money in the bank", "rivers run to the sea"]
    ids = bm25_rankings(texts, ["eiffel tower", "bank money", "cat mat"], k=2)
    assert ids[:, 0].tolist() == [0, 2, 1]


def test_comparing_a_system_with_itself_gives_zero_and_a_better_one_a_positive_interval():
    base = {"mrr@10": [1.0, 0.5, 0.0, 0.25] * 25, "recall@5": [1.0, 1.0, 0.0, 1.0] * 25}
    same = compare_with(base, base)
    assert all(entry["difference"] == entry["low"] == entry["high"] == 0 for entry in same.values())
    better = compare_with(base, {"mrr@10": [1.0, 1.0, 0.5, 0.5] * 25, "recall@5": [1.0] * 100})
    assert better["recall@5"]["mean"] == 1 and better["recall@5"]["difference"] == pytest.approx(0.25)
    assert better["mrr@10"]["difference"] == pytest.approx(0.75 - 0.4375) and better["mrr@10"]["low"] > 0
    assert better["mrr@10 relative"]["mean"] == pytest.approx(0.75 / 0.4375 - 1)


def test_cached_vectors_encode_once_per_encoder_and_texts(tmp_path):
    calls = []

    def encode(texts):
        calls.append(len(texts))
        return np.arange(2 * len(texts), dtype=np.float32).reshape(len(texts), 2)

    first, record = cached_vectors(encode, ["a", "b"], {"encoder": "x"}, tmp_path)
    again, cached = cached_vectors(encode, ["a", "b"], {"encoder": "x"}, tmp_path)
    np.testing.assert_array_equal(first, again)
    assert calls == [2] and not record["cached"] and cached["cached"] and cached["seconds"] == record["seconds"]
    cached_vectors(encode, ["a", "c"], {"encoder": "x"}, tmp_path)  # other texts
    cached_vectors(encode, ["a", "b"], {"encoder": "y"}, tmp_path)  # another encoder
    assert calls == [2, 2, 2]
    with pytest.raises(ValueError, match="one per text"):
        cached_vectors(lambda texts: np.zeros((1, 2)), ["a", "b"], {"encoder": "z"}, tmp_path)


TINY_TEXTS = ["the cat sat on the mat .", "paris is a city on the river .", "the dog ran in the water .",
              "money in the bank !", "the eiffel tower is in paris ."]


@pytest.fixture()
def tiny_encoders(tmp_path):
    from encoders.hybrid import HybridEncoder

    dense = save_tiny_mlm(tmp_path / "dense")
    HybridEncoder.from_pretrained(str(save_tiny_mlm(tmp_path / "mlm", seed=1)), dense_dim=8).save_pretrained(
        tmp_path / "hybrid")
    documents = [{"id": f"d{i}", "title": f"d{i}", "text": text} for i, text in enumerate(TINY_TEXTS)]
    sets = {FANOUT: [{"id": f"q{i}", "question": d["text"], "title": d["id"]} for i, d in enumerate(documents)]}
    return str(dense), str(tmp_path / "hybrid"), documents, sets


def test_an_encoder_finds_each_document_from_its_own_text_and_reuses_its_cached_corpus(tiny_encoders, tmp_path):
    from evals.retrieval.protocol import encoder_scores

    dense, hybrid, documents, sets = tiny_encoders
    for path, kind in ((dense, "dense"), (hybrid, "hybrid")):
        scores, cost, _ = encoder_scores(path, documents, sets, tmp_path / "cache", max_length=16)
        assert cost["kind"] == kind and not cost["cached"] and cost["index_bytes"] > 0
        assert scores[FANOUT]["mrr@10"] == [1.0] * 5  # a text's own vector scores highest (cosine 1, or 1 + 1)
        again, cost, _ = encoder_scores(path, documents, sets, tmp_path / "cache", max_length=16)
        assert cost["cached"] and again == scores


def test_the_full_evaluation_writes_a_report_against_the_baseline(tiny_encoders, tmp_path, monkeypatch):
    from evals.retrieval import protocol
    from evals.retrieval.config import RetrievalEvalConfig
    from evals.retrieval.protocol import evaluate_retrieval

    dense, hybrid, documents, sets = tiny_encoders
    monkeypatch.setattr(protocol, "full_corpus", lambda heldout_queries: (documents, sets))
    monkeypatch.setattr(protocol, "BASELINE_ENCODER", dense)
    config = RetrievalEvalConfig(encoders=hybrid, output_dir=str(tmp_path / "out"), work_dir=str(tmp_path / "work"))
    report = evaluate_retrieval(config, "dynvocab eval-retrieval --encoders x")
    record = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(record["systems"]) == ["BM25 (bm25s)", BASELINE, hybrid]
    assert record["systems"][BASELINE][FANOUT]["mrr@10"] == {"mean": 1.0, "difference": 0.0, "low": 0.0, "high": 0.0}
    text = report.read_text()
    assert "dynvocab eval-retrieval --encoders x" in text and f"| {BASELINE} | 1.0000 |" in text
    served, encoding = record["costs"][hybrid]["served"], record["costs"][hybrid]["query_encoding"]
    assert served["top10_agreement"] == 1.0  # five documents: every one is a candidate, so pruning changes nothing
    assert served["ms_per_query"] > 0 and served["dense_ms_per_query"] > 0 and encoding["baseline_ms"] > 0
    assert "## Query latency" in text and f"| {hybrid} |" in text.split("## Query latency")[1]


def test_the_full_mode_refuses_a_corpus_it_has_no_queries_for():
    from evals.retrieval.config import RetrievalEvalConfig

    with pytest.raises(ValueError, match="--quick true"):
        RetrievalEvalConfig(corpus="licenses")
    assert RetrievalEvalConfig(corpus="licenses", quick=True).output_path == "results/retrieval/dupmae"
    assert RetrievalEvalConfig().output_path == "results/retrieval/full-corpus"
