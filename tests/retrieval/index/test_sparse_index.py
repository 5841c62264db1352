"""The sparse part of the hybrid index: exact scores, pruned candidates on a hand-checked case, storage."""

import numpy as np
import pytest

from encoders.hybrid import HybridVectors, hybrid_scores
from evals.retrieval.footprint import synthetic_vectors
from retrieval.index.sparse import SparseIndex

VOCAB = 50


def _brute_force(query_ids, query_values, doc_ids, doc_values):
    empty = lambda ids: np.zeros((len(ids), 0), dtype=np.float32)
    return hybrid_scores(HybridVectors(empty(query_ids), query_ids, query_values), HybridVectors(empty(doc_ids), doc_ids, doc_values))


def test_scores_of_any_candidates_equal_brute_force():
    docs, queries = synthetic_vectors(40, 0, 6, vocab_size=VOCAB, seed=0), synthetic_vectors(5, 0, 6, vocab_size=VOCAB, seed=1)
    index = SparseIndex(docs.ids, docs.values, VOCAB, posting_terms=2)
    candidates = np.random.default_rng(0).integers(0, 40, size=(5, 7))
    reference = _brute_force(queries.ids, queries.values, docs.ids, docs.values)
    np.testing.assert_allclose(index.scores(queries.ids, queries.values, candidates),
                               np.take_along_axis(reference, candidates, 1), rtol=1e-5, atol=1e-6)


def test_without_pruning_candidates_are_the_exact_top():
    docs, queries = synthetic_vectors(60, 0, 8, vocab_size=VOCAB, seed=2), synthetic_vectors(6, 0, 8, vocab_size=VOCAB, seed=3)
    index = SparseIndex(docs.ids, docs.values, VOCAB, posting_terms=8)
    found = index.candidates(queries.ids, queries.values, width=5, query_terms=8)
    reference = _brute_force(queries.ids, queries.values, docs.ids, docs.values)
    for row, ids in enumerate(found):
        best = np.sort(reference[row])[::-1][:5]
        np.testing.assert_allclose(np.sort(reference[row, ids])[::-1], best, rtol=1e-3, atol=1e-3)


def test_pruning_keeps_each_documents_heaviest_entries_and_the_querys_heaviest_ids():
    # doc 0 holds id 7 as its lighter entry, doc 1 as its heavier one; doc 2 shares only id 9 with the query
    ids = np.array([[3, 7], [7, 4], [9, 5]])
    values = np.array([[0.9, 0.8], [0.5, 0.1], [0.7, 0.0]], dtype=np.float32)
    index = SparseIndex(ids, values, VOCAB, posting_terms=1)
    assert index.posting_docs[index.offsets[7]:index.offsets[8]].tolist() == [1], "doc 0's id 7 is pruned"
    assert index.offsets[5] == index.offsets[6], "zero weights never enter a list"
    query_ids, query_values = np.array([[7, 9]]), np.array([[1.0, 0.2]], dtype=np.float32)
    assert index.candidates(query_ids, query_values, width=1, query_terms=2).tolist() == [[1]]
    assert index.candidates(query_ids, query_values, width=2, query_terms=2)[0].tolist() in ([1, 2], [2, 1])
    assert index.candidates(query_ids, query_values, width=1, query_terms=1).tolist() == [[1]]
    exact = index.scores(query_ids, query_values, np.array([[0, 1, 2]]))
    np.testing.assert_allclose(exact, [[0.8, 0.5, 0.14]], rtol=1e-6)


def test_ids_take_16_bits_when_the_vocabulary_fits():
    docs = synthetic_vectors(10, 0, 4, vocab_size=VOCAB, seed=4)
    small = SparseIndex(docs.ids, docs.values, VOCAB)
    large = SparseIndex(docs.ids, docs.values, 100_000)
    assert small.ids.dtype == np.uint16 and large.ids.dtype == np.int32
    assert small.nbytes() == 10 * 4 * (2 + 4) + (VOCAB + 1) * 8 + 40 * (4 + 2)


@pytest.mark.parametrize("change, message", [
    (lambda i, v: (i, np.where(v > 2, np.nan, v)), "NaN or infinite"),
    (lambda i, v: (i + VOCAB, v), r"must lie in \[0, vocab_size=50\)"),
    (lambda i, v: (i[:, :2], v), "two \\(n, k\\) arrays of one shape"),
])
def test_bad_vectors_are_refused(change, message):
    docs = synthetic_vectors(10, 0, 4, vocab_size=VOCAB, seed=5)
    with pytest.raises(ValueError, match=message):
        SparseIndex(*change(docs.ids, docs.values), VOCAB)
    with pytest.raises(ValueError, match="posting_terms=0 must be a positive int"):
        SparseIndex(docs.ids, docs.values, VOCAB, posting_terms=0)
