from __future__ import annotations

import json
import logging
import os

import faiss
import numpy as np
import pytest
from tests.helpers import HashEncoder

import retrieval.index.storage
from retrieval import DocumentIndex, IndexConfig

TEXTS = ["the eiffel tower in paris", "a river through london", "money in the bank", "cats and dogs", "green tea"]


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_save_load_round_trip(tmp_path, clustered, kind):
    vectors, documents, queries, _ = clustered
    index = DocumentIndex.build(documents, vectors=vectors, index_type=kind)
    index.save(tmp_path / "index")
    assert sorted(os.listdir(tmp_path)) == ["index"]  # no staging folder left behind
    assert sorted(os.listdir(tmp_path / "index")) == ["dynvocab_manifest.json", "index.faiss", "metadata.json"]
    loaded = DocumentIndex.load(tmp_path / "index")
    assert loaded.kind == kind and loaded.documents == documents and loaded.search_param == index.search_param
    assert loaded.config == index.config
    for got, want in zip(loaded.search(queries, 10), index.search(queries, 10)):
        np.testing.assert_array_equal(got, want)


def test_metadata_records_what_built_the_index(tmp_path):
    encoder = HashEncoder(dim=16)
    DocumentIndex.build([{"id": "p", "title": "Paris", "text": TEXTS[0]}], encoder).save(tmp_path)
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    assert metadata["faiss_version"] == faiss.__version__
    assert metadata["dimension"] == 16 and metadata["index_type"] == "flat"
    assert metadata["encoder"]["name"] == "hash-encoder" and metadata["encoder"]["normalize"] is True
    assert metadata["encoder"]["pooling"] == "mean" and len(metadata["encoder"]["probe"]) == 16
    assert metadata["documents"] == {"ids": ["p"], "titles": ["Paris"], "texts": [TEXTS[0]]}
    assert len(metadata["index_sha256"]) == 64 and metadata["config"]["index_type"] == "auto"


def test_load_with_the_building_encoder_searches_text(tmp_path):
    DocumentIndex.build(TEXTS, HashEncoder()).save(tmp_path)
    loaded = DocumentIndex.load(tmp_path, encoder=HashEncoder())
    assert loaded.search_documents(["money bank"], k=1)[0][0]["text"] == "money in the bank"


@pytest.mark.parametrize(
    ("encoder", "message"),
    [
        (HashEncoder(dim=8), "16-dim vectors from encoder 'hash-encoder'.*gives 8-dim"),
        (HashEncoder(seed=1, name="other-encoder"), "'other-encoder' is a different encoder"),
        (HashEncoder(seed=1), "same name with different weights"),
        (HashEncoder(pooling="cls"), "pooling='mean'.*pooling='cls'"),
    ],
)
def test_load_with_a_different_encoder_raises(tmp_path, encoder, message):
    DocumentIndex.build(TEXTS, HashEncoder()).save(tmp_path)
    with pytest.raises(ValueError, match=message) as error:
        DocumentIndex.load(tmp_path, encoder=encoder)
    assert "rebuild the index" in str(error.value)


class NearbyEncoder(HashEncoder):
    """HashEncoder's vectors turned by a fixed small angle: cosine 0.995 to them, as a fine-tuned neighbour gives."""

    def encode(self, texts, **kwargs):
        vectors = super().encode(texts, **kwargs)
        turn = np.roll(vectors, 1, axis=1)
        turn -= (turn * vectors).sum(1, keepdims=True) * vectors  # orthogonal to each vector
        turn /= np.linalg.norm(turn, axis=1, keepdims=True)
        return (0.995 * vectors + np.sqrt(1 - 0.995**2) * turn).astype(np.float32)


def test_a_close_neighbour_of_the_building_encoder_is_refused(tmp_path):
    DocumentIndex.build(TEXTS, HashEncoder()).save(tmp_path)
    with pytest.raises(ValueError, match="cosine 0.995 on a probe text") as error:
        DocumentIndex.load(tmp_path, encoder=NearbyEncoder(name="fine-tuned-hash"))
    assert "rebuild the index" in str(error.value)


def test_same_weights_under_another_name_are_accepted_with_a_warning(tmp_path, caplog):
    DocumentIndex.build(TEXTS, HashEncoder()).save(tmp_path)
    with caplog.at_level(logging.WARNING, logger="retrieval.index.storage"):
        DocumentIndex.load(tmp_path, encoder=HashEncoder(name="/moved/hash-encoder"))
    assert "gives the same vectors" in caplog.text


def _saved(tmp_path):
    DocumentIndex.build(TEXTS, vectors=np.eye(5, 8, dtype=np.float32)).save(tmp_path)
    return tmp_path / "index.faiss", tmp_path / "metadata.json"


def test_truncated_index_file_raises(tmp_path):
    index_file, _ = _saved(tmp_path)
    data = index_file.read_bytes()
    index_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or altered.*rebuild the index"):
        DocumentIndex.load(tmp_path)


def test_corrupted_index_file_raises(tmp_path):
    index_file, _ = _saved(tmp_path)
    data = bytearray(index_file.read_bytes())
    data[-5] ^= 0xFF
    index_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted: its sha256"):
        DocumentIndex.load(tmp_path)


def test_truncated_metadata_raises(tmp_path):
    _, metadata = _saved(tmp_path)
    metadata.write_text(metadata.read_text()[:40])
    with pytest.raises(ValueError, match="metadata.json is truncated or corrupted"):
        DocumentIndex.load(tmp_path)


def test_missing_index_raises(tmp_path):
    with pytest.raises(ValueError, match="no saved index"):
        DocumentIndex.load(tmp_path / "nowhere")
    index_file, _ = _saved(tmp_path / "saved")
    index_file.unlink()
    with pytest.raises(ValueError, match="index.faiss is missing"):
        DocumentIndex.load(tmp_path / "saved")


def _snapshot(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_failed_write_leaves_the_previous_index_intact(tmp_path, monkeypatch):
    target = tmp_path / "index"
    DocumentIndex.build(TEXTS, HashEncoder()).save(target)
    before = _snapshot(target)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(retrieval.index.storage.json, "dump", disk_full)
    replacement = DocumentIndex.build(TEXTS[:2], vectors=np.eye(2, 4, dtype=np.float32))
    with pytest.raises(OSError, match="No space left"):
        replacement.save(target)
    assert _snapshot(target) == before
    assert sorted(os.listdir(tmp_path)) == ["index"]
    monkeypatch.undo()
    assert len(DocumentIndex.load(target, encoder=HashEncoder())) == len(TEXTS)


def test_failed_swap_restores_the_previous_index(tmp_path, monkeypatch):
    target = tmp_path / "index"
    DocumentIndex.build(TEXTS, HashEncoder()).save(target)
    before = _snapshot(target)
    real_replace = os.replace
    calls = []

    def failing_second_replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # the first moves the old index aside, the second would put the new one in place
            raise OSError("interrupted")
        real_replace(src, dst)

    monkeypatch.setattr(retrieval.index.storage.os, "replace", failing_second_replace)
    with pytest.raises(OSError, match="interrupted"):
        DocumentIndex.build(TEXTS[:2], vectors=np.eye(2, 4, dtype=np.float32)).save(target)
    assert _snapshot(target) == before
    assert sorted(os.listdir(tmp_path)) == ["index"]


def test_save_overwrites_an_index_but_not_other_folders(tmp_path):
    target = tmp_path / "index"
    DocumentIndex.build(TEXTS, HashEncoder()).save(target)
    DocumentIndex.build(TEXTS[:2], vectors=np.eye(2, 4, dtype=np.float32)).save(target)
    assert len(DocumentIndex.load(target)) == 2
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(ValueError, match="refusing to overwrite"):
        DocumentIndex.build(TEXTS, HashEncoder()).save(tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="it is a file"):
        DocumentIndex.build(TEXTS, HashEncoder()).save(tmp_path / "notes" / "todo.txt")


def test_loaded_approximate_index_keeps_its_settings(tmp_path, clustered):
    vectors, documents, _, _ = clustered
    config = IndexConfig(index_type="ivf", nlist=16, nprobe=5, seed=3)
    DocumentIndex.build(documents, vectors=vectors, config=config).save(tmp_path)
    loaded = DocumentIndex.load(tmp_path)
    assert loaded.search_param == 5 and loaded.config == config
