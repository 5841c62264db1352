from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from retrieval import DocumentIndex, IndexConfig, exact_search, recall_at_k


@pytest.fixture(scope="module", params=["flat", "ivf", "hnsw"])
def built(request, clustered):
    vectors, documents, _, _ = clustered
    return DocumentIndex.build(documents, vectors=vectors, index_type=request.param)


def _binomial_floor(p: float, trials: int) -> float:
    """``p`` less three standard errors of a rate measured over ``trials``: the bar a correct index clears."""
    return p - 3 * math.sqrt(p * (1 - p) / trials)


def test_flat_finds_the_document_each_query_was_copied_from(clustered):
    vectors, documents, queries, targets = clustered
    index = DocumentIndex.build(documents, vectors=vectors, index_type="flat")
    scores, ids = index.search(queries, k=5)
    assert scores.dtype == np.float32 and ids.dtype == np.int64 and ids.shape == (len(queries), 5)
    np.testing.assert_array_equal(ids[:, 0], targets)
    assert (np.diff(scores, axis=1) <= 1e-6).all()
    np.testing.assert_allclose(scores[:, 0], np.sum(queries * vectors[targets], axis=1), rtol=1e-5)


def test_approximate_index_recall_against_flat(built, clustered):
    vectors, _, queries, targets = clustered
    k = 10
    exact = exact_search(vectors, queries, k)[1]
    approx = built.search(queries, k)[1]
    floor = _binomial_floor(built.config.target_recall, queries.shape[0] * k)
    assert recall_at_k(approx, exact) >= floor
    assert built.recall(queries, k) == pytest.approx(recall_at_k(approx, exact))
    assert np.mean(approx[:, 0] == targets) >= _binomial_floor(built.config.target_recall, len(queries))
    if built.kind == "flat":
        assert built.search_param is None and built.recall(queries, k) == 1.0
    else:
        assert built.search_param >= 1


def test_tuning_picks_the_smallest_setting_that_reaches_the_target(clustered):
    vectors, documents, queries, _ = clustered
    index = DocumentIndex.build(documents, vectors=vectors, index_type="ivf")
    recall = index.tune(queries, k=10, target_recall=0.99)
    chosen = index.search_param
    assert recall >= 0.99 or chosen == index._cpu_index.nlist
    if chosen > 1:
        index.set_search_param(chosen // 2)
        assert index.recall(queries, 10) < 0.99


def test_tuning_on_documents_adds_a_margin_and_real_queries_need_none(clustered):
    vectors, documents, queries, _ = clustered
    plain = DocumentIndex.build(documents, vectors=vectors, config=IndexConfig(index_type="hnsw", tune_margin=1))
    doubled = DocumentIndex.build(documents, vectors=vectors, config=IndexConfig(index_type="hnsw", tune_margin=2))
    assert doubled.search_param == 2 * plain.search_param
    on_queries = DocumentIndex.build(documents, vectors=vectors, index_type="ivf", tune_queries=queries[:100])
    floor = _binomial_floor(on_queries.config.target_recall, 100 * on_queries.config.tune_k)
    assert on_queries.recall(queries[100:], on_queries.config.tune_k) >= floor


def test_explicit_search_parameters_are_kept(clustered):
    vectors, documents, _, _ = clustered
    ivf = DocumentIndex.build(documents, vectors=vectors, config=IndexConfig(index_type="ivf", nlist=20, nprobe=3))
    assert ivf.search_param == 3 and ivf._cpu_index.nlist == 20
    hnsw = DocumentIndex.build(documents, vectors=vectors, config=IndexConfig(index_type="hnsw", ef_search=50))
    assert hnsw.search_param == 50


def test_auto_picks_flat_for_small_and_approximate_for_large_corpora(clustered):
    vectors, documents, _, _ = clustered
    assert DocumentIndex.build(documents, vectors=vectors).kind == "flat"
    config = IndexConfig(flat_max_size=1000, auto_approximate="hnsw", ef_search=64)
    assert DocumentIndex.build(documents, vectors=vectors, config=config).kind == "hnsw"
    assert DocumentIndex.build(documents, vectors=vectors, config=config, index_type="flat").kind == "flat"


def test_search_documents_returns_dicts_best_first(built, clustered):
    _, documents, queries, targets = clustered
    results = built.search_documents(queries[:3], k=4)
    assert len(results) == 3 and all(len(hits) == 4 for hits in results)
    for hits, target in zip(results, targets[:3]):
        assert hits[0] == {**documents[target], "score": pytest.approx(hits[0]["score"])}
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_k_larger_than_the_corpus_pads_with_minus_one():
    vectors = np.eye(3, 4, dtype=np.float32)
    index = DocumentIndex.build(["a", "b", "c"], vectors=vectors)
    scores, ids = index.search(vectors[:1], k=5)
    assert ids[0, 0] == 0 and sorted(ids[0, :3].tolist()) == [0, 1, 2] and ids[0, 3:].tolist() == [-1, -1]
    assert len(index.search_documents(vectors[:1], k=5)[0]) == 3


def test_text_queries_go_through_the_encoder(hash_encoder):
    texts = ["the eiffel tower in paris", "a river through london", "money in the bank", "cats and dogs"]
    index = DocumentIndex.build(texts, hash_encoder)
    assert index.search(["money bank"], k=1)[1][0, 0] == 2
    assert index.search_documents("cats and dogs", k=1)[0][0]["text"] == "cats and dogs"
    assert index.search([], k=2)[1].shape == (0, 2)


def test_bad_inputs_raise(clustered, hash_encoder):
    vectors, documents, _, _ = clustered
    index = DocumentIndex.build(documents, vectors=vectors)
    with pytest.raises(ValueError, match="no encoder"):
        index.search(["a text query"], k=3)
    with pytest.raises(ValueError, match="dimension 5 but the index has 32"):
        index.search(np.zeros((1, 5)), k=3)
    with pytest.raises(ValueError, match="k=0"):
        index.search(vectors[:1], k=0)
    with pytest.raises(ValueError, match="got 10 vectors for 2000 documents"):
        DocumentIndex.build(documents, vectors=vectors[:10])
    with pytest.raises(ValueError, match="NaN"):
        DocumentIndex.build(["a"], vectors=np.full((1, 4), np.nan))
    with pytest.raises(ValueError, match="pass an encoder"):
        DocumentIndex.build(["a"])
    with pytest.raises(ValueError, match="dimension 32 but the index has 16"):
        DocumentIndex.build(documents, hash_encoder, vectors=vectors)
    with pytest.raises(ValueError, match="no documents"):
        DocumentIndex.build([], vectors=np.zeros((0, 4)))


def test_recall_at_k_by_hand():
    exact = np.array([[1, 2, 3, 4], [5, 6, -1, -1]])
    approx = np.array([[4, 3, 9, 8], [6, 5, -1, -1]])
    assert recall_at_k(approx, exact) == pytest.approx((2 / 4 + 2 / 2) / 2)
    assert recall_at_k(exact, exact) == 1.0
    with pytest.raises(ValueError, match="same q"):
        recall_at_k(approx[:1], exact)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"index_type": "lsh"}, "index_type='lsh'"),
        ({"nlist": 0}, "nlist=0"),
        ({"target_recall": 1.5}, "target_recall=1.5"),
        ({"auto_approximate": "flat"}, "auto_approximate='flat'"),
    ],
)
def test_index_config_is_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        IndexConfig(**kwargs)


def test_index_config_round_trips_and_warns_about_unknown_keys(caplog):
    config = IndexConfig(index_type="hnsw", ef_search=40)
    with caplog.at_level(logging.WARNING, logger="retrieval.index.ann"):
        assert IndexConfig.from_dict({**config.to_dict(), "from_the_future": 1}) == config
    assert "from_the_future" in caplog.text
