"""Encoding in shards (several processes or machines) and merging them into one index; IVF-PQ."""

import json

import numpy as np
import pytest

from retrieval import DocumentIndex
from retrieval.index.ann import IndexConfig, exact_search, index_bytes, recall_at_k
from retrieval.index.storage import PROBE_TEXT
from retrieval.index.shards import encode_shard, missing_shards, read_shards, shard_path, shard_rows
from tests.helpers import HashEncoder

DOCUMENTS = [{"id": str(i), "title": "", "text": f"document {i} about topic {i % 7} and word {i * 13 % 11}"}
             for i in range(23)]


class CountingEncoder(HashEncoder):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.texts = 0

    def encode(self, texts, batch_size=32, show_progress_bar=None):
        self.texts += sum(text != PROBE_TEXT for text in texts)  # the probe is the encoder's fingerprint
        return super().encode(texts, batch_size, show_progress_bar)


@pytest.mark.parametrize("num_documents,num_shards", [(23, 1), (23, 4), (5, 8), (1000, 7)])
def test_shards_tile_the_rows_in_order(num_documents, num_shards):
    rows = [list(shard_rows(num_documents, shard, num_shards)) for shard in range(num_shards)]
    assert sum(rows, []) == list(range(num_documents))
    assert max(map(len, rows)) - min(map(len, rows)) <= 1


def test_a_shard_past_the_last_is_refused():
    with pytest.raises(ValueError, match=r"shard 4 does not exist in 4 shards; shards are numbered 0..3"):
        shard_rows(10, 4, 4)


def test_merged_shards_are_the_vectors_of_one_encoding_and_a_written_shard_is_kept(tmp_path):
    encoder = CountingEncoder()
    for shard in (2, 0, 1):  # any order, as processes finish
        encode_shard(DOCUMENTS, encoder, tmp_path, shard, 3)
    assert encoder.texts == len(DOCUMENTS) and missing_shards(tmp_path, 3) == []
    merged = read_shards(DOCUMENTS, tmp_path, 3, encoder)
    np.testing.assert_allclose(merged, HashEncoder().encode([d["text"] for d in DOCUMENTS]), atol=1e-6)
    encode_shard(DOCUMENTS, encoder, tmp_path, 1, 3)  # resumed: already there
    assert encoder.texts == len(DOCUMENTS)
    built = DocumentIndex.build(DOCUMENTS, encoder, vectors=merged, index_type="flat")
    assert built.search_documents(DOCUMENTS[5]["text"], k=1)[0][0]["id"] == "5"


def test_a_missing_shard_is_named_with_the_command_that_writes_it(tmp_path):
    encode_shard(DOCUMENTS, HashEncoder(), tmp_path, 0, 3)
    encode_shard(DOCUMENTS, HashEncoder(), tmp_path, 2, 3)
    with pytest.raises(ValueError, match=r"1 of 3 shards are not in .* \(the first: shard 1\); encode them "
                                         r"\(dynvocab index \.\.\. --shards .* --num-shards 3 --shard 1\)"):
        read_shards(DOCUMENTS, tmp_path, 3)


@pytest.mark.parametrize("mismatch,message", [
    ("documents", r"was encoded for other documents \(23 of them\) than the 22 given now"),
    ("encoder", r"was built by encoder 'hash-encoder'; 'hash-encoder' is an encoder of the same name with different"),
])
def test_shards_of_other_documents_or_another_encoder_are_refused(tmp_path, mismatch, message):
    encode_shard(DOCUMENTS, HashEncoder(), tmp_path, 0, 1)
    documents, encoder = (DOCUMENTS[:-1], HashEncoder()) if mismatch == "documents" else (DOCUMENTS, HashEncoder(seed=1))
    with pytest.raises(ValueError, match=message):
        read_shards(documents, tmp_path, 1, encoder)
    with pytest.raises(ValueError, match=message):  # and before anything is encoded again
        encode_shard(documents, encoder, tmp_path, 0, 1)


def test_a_shard_edited_after_it_was_written_is_refused(tmp_path):
    path = encode_shard(DOCUMENTS, HashEncoder(), tmp_path, 0, 1)
    vectors = np.load(path / "vectors.npy")
    np.save(path / "vectors.npy", vectors * 2)
    with pytest.raises(ValueError, match="does not match the size and sha256 recorded"):
        read_shards(DOCUMENTS, tmp_path, 1)
    assert json.loads((shard_path(tmp_path, 0, 1) / "shard.json").read_text())["rows"] == [0, 23]


def test_ivfpq_keeps_recall_in_a_fraction_of_the_memory(tmp_path):
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((50, 32)).astype(np.float32)
    vectors = centres[rng.integers(0, 50, 4000)] + 0.3 * rng.standard_normal((4000, 32)).astype(np.float32)
    documents = [str(i) for i in range(len(vectors))]
    queries = vectors[:200] + 0.1 * rng.standard_normal((200, 32)).astype(np.float32)
    flat = DocumentIndex.build(documents, vectors=vectors, index_type="flat")
    pq = DocumentIndex.build(documents, vectors=vectors, config=IndexConfig(index_type="ivfpq", pq_m=16))
    exact_ids = exact_search(vectors, queries, 10)[1]
    assert recall_at_k(pq.search(queries, 10)[1], exact_ids) >= 0.6  # 16 bytes for 128: lossy, far above chance (0.0025)
    assert recall_at_k(flat.search(queries, 10)[1], exact_ids) == 1.0
    assert index_bytes(pq._cpu_index) < 0.3 * index_bytes(flat._cpu_index)  # 16 + 8 (its id) bytes a vector, and codebooks
    pq.save(tmp_path / "pq")
    loaded = DocumentIndex.load(tmp_path / "pq")
    assert loaded.kind == "ivfpq" and loaded.search_param == pq.search_param
    np.testing.assert_array_equal(loaded.search(queries, 10)[1], pq.search(queries, 10)[1])


@pytest.mark.parametrize("config,count,message", [
    (IndexConfig(index_type="ivfpq", pq_m=5), 400, r"pq_m=5 does not divide the vectors' dimension 32; pick a divisor"),
    (IndexConfig(index_type="ivfpq"), 100, r"needs at least as many vectors, got 100; use index_type='flat' or 'ivf'"),
])
def test_ivfpq_settings_that_cannot_work_are_named(config, count, message):
    vectors = np.random.default_rng(0).standard_normal((count, 32)).astype(np.float32)
    with pytest.raises(ValueError, match=message):
        DocumentIndex.build([str(i) for i in range(count)], vectors=vectors, config=config)


def test_ivfpq_is_tuned_to_a_share_of_what_its_codes_reach_not_to_probe_every_list():
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((64, 32)).astype(np.float32)
    vectors = centres[rng.integers(0, 64, 6000)] + 0.4 * rng.standard_normal((6000, 32)).astype(np.float32)
    config = IndexConfig(index_type="ivfpq", pq_m=8, tune_margin=1)
    pq = DocumentIndex.build([str(i) for i in range(len(vectors))], vectors=vectors, config=config)
    assert pq.search_param < pq._cpu_index.nlist  # the codes' ceiling is far below 0.95: probing all would not reach it
