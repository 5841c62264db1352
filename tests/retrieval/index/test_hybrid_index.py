"""The hybrid index against brute force, top-k sparsification, and its save/load round trip."""

import json

import numpy as np
import pytest
import torch

from encoders.hybrid import HybridEncoder, HybridVectors, hybrid_scores, top_k_sparse
from evals.retrieval.footprint import synthetic_vectors
from retrieval.index.hybrid import HybridIndex
from tests.tiny_mlm import save_tiny_mlm

VOCAB = 500


@pytest.fixture(scope="module")
def collection():
    docs = synthetic_vectors(300, 8, 12, vocab_size=VOCAB, seed=0)
    queries = synthetic_vectors(25, 8, 12, vocab_size=VOCAB, seed=1)
    return docs, queries


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    folder = save_tiny_mlm(tmp_path_factory.mktemp("tiny-mlm"))
    return HybridEncoder.from_pretrained(str(folder), representation="both", dense_dim=8)


def test_top_k_sparse_keeps_the_largest_entries():
    weights = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 4.0]])
    ids, values = top_k_sparse(weights, 2)
    assert ids.tolist() == [[1, 3], [0, 3]]
    assert values.tolist() == [[3.0, 2.0], [5.0, 4.0]]


@pytest.mark.parametrize("dense, sparse", [(True, True), (True, False), (False, True)])
def test_exhaustive_search_equals_brute_force(collection, dense, sparse):
    docs, queries = collection
    keep = lambda v: HybridVectors(v.dense if dense else v.dense[:, :0], v.ids if sparse else v.ids[:, :0],
                                   v.values if sparse else v.values[:, :0])
    docs, queries = keep(docs), keep(queries)
    index = HybridIndex.build([f"d{i}" for i in range(len(docs))], vectors=docs, vocab_size=VOCAB, posting_terms=1)
    scores, ids = index.exhaustive().search(queries, 10)
    reference = hybrid_scores(queries, docs)
    expected = np.argsort(-reference, axis=1, kind="stable")[:, :10]
    np.testing.assert_allclose(scores, np.take_along_axis(reference, expected, 1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.take_along_axis(reference, ids, 1), scores, rtol=1e-4, atol=1e-4)


def test_union_rescoring_is_exact_for_its_candidates(collection):
    docs, queries = collection
    index = HybridIndex.build([f"d{i}" for i in range(len(docs))], vectors=docs, vocab_size=VOCAB, candidates=20)
    scores, ids = index.search(queries, 5)
    reference = hybrid_scores(queries, docs)
    np.testing.assert_allclose(np.take_along_axis(reference, ids, 1), scores, rtol=1e-4, atol=1e-4)
    assert (np.diff(scores, axis=1) <= 1e-6).all(), "best first"


def test_k_larger_than_collection_pads_with_minus_one(collection):
    docs, queries = collection
    small = HybridVectors(docs.dense[:3], docs.ids[:3], docs.values[:3])
    index = HybridIndex.build(["a", "b", "c"], vectors=small, vocab_size=VOCAB)
    _, ids = index.search(queries, 5)
    assert (ids[:, 3:] == -1).all() and (ids[:, :3] >= 0).all()


def test_encoder_search_and_round_trip(tiny_encoder, tmp_path):
    texts = ["the cat sat on the mat", "the dog ran", "eiffel tower is in paris", "river bank money", "water and cats"]
    index = HybridIndex.build(texts, tiny_encoder, candidates=3, query_terms=5, posting_terms=7)
    before = index.search(["cat on the mat", "paris"], 3)
    folder = index.save(tmp_path / "index")
    assert sorted(p.name for p in folder.iterdir()) == ["dense.faiss", "dynvocab_manifest.json", "metadata.json", "sparse.safetensors"]
    again = HybridIndex.load(folder, encoder=tiny_encoder)
    after = again.search(["cat on the mat", "paris"], 3)
    np.testing.assert_array_equal(before[1], after[1])
    np.testing.assert_allclose(before[0], after[0], rtol=1e-6)
    assert again.documents == index.documents
    assert (again.candidates, again.query_terms, again.sparse.posting_terms) == (3, 5, 7)
    assert again.nbytes() == index.nbytes()
    assert [d["id"] for d in again.search_documents(["paris"], 3)[0]] == [index.documents[i]["id"] for i in after[1][1]]


def test_load_rejects_corruption_and_other_representation(tiny_encoder, tmp_path):
    folder = HybridIndex.build(["the cat", "the dog", "paris"], tiny_encoder).save(tmp_path / "index")
    with pytest.raises(ValueError, match="OT:384"):
        HybridIndex.load(folder, encoder=tiny_encoder.with_representation("cls"))
    sparse = folder / "sparse.safetensors"
    data = bytearray(sparse.read_bytes())
    data[-1] ^= 0xFF
    sparse.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sparse.safetensors is corrupted"):
        HybridIndex.load(folder)
    metadata = json.loads((folder / "metadata.json").read_text())
    (folder / "metadata.json").write_text(json.dumps({**metadata, "format_version": 1}))
    with pytest.raises(ValueError, match="format version 1, whose sparse part .* rebuild the index"):
        HybridIndex.load(folder)
    (folder / "metadata.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not written by HybridIndex.save"):
        HybridIndex.load(folder)


def test_exact_agreement_is_the_shared_share_of_the_top_k():
    from evals.retrieval.footprint import exact_agreement

    found, exact = np.array([[1, 2, 3, 7], [4, 5, 6, 7]]), np.array([[3, 1, 9, 2], [4, 5, 6, 8]])
    assert exact_agreement(found, exact, k=3) == pytest.approx((2 / 3 + 1) / 2)
