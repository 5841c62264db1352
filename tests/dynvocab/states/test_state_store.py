"""Document states kept on disk: what the LM reads, found by ids, resumable, tied to the LM and to max_tokens."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dynvocab.states.store as state_store
from dynvocab.phrases.store import finished_shards, read_record, shard_path
from dynvocab.states.store import DOCUMENT_STATES, DocumentStates, DocumentStateStore, write_document_states
from tests.helpers import killed_after, tiny_llama

DOCUMENTS = [[5, 6, 7, 8, 9], [5, 6, 7], [], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [30, 31], [5, 6, 7, 8]]


def read_by_lm(lm) -> list:
    """Each call of the LM's decoder, as the number of rows it read."""
    calls = []
    lm.get_decoder().register_forward_hook(lambda module, args, kwargs, out: calls.append(kwargs["input_ids"].shape[0]),
                                           with_kwargs=True)
    return calls


def alone(lm, ids, max_tokens=10):
    return DocumentStates(lm, max_tokens=max_tokens, batch_size=1, max_bytes=0)([ids])[0]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_stored_states_are_the_lms_and_the_lm_reads_only_what_the_store_lacks(tmp_path, dtype):
    lm = tiny_llama(64)
    store = write_document_states(DocumentStates(lm, max_tokens=10, max_bytes=0), DOCUMENTS, tmp_path, dtype=dtype,
                                  shard_documents=4)
    assert finished_shards(tmp_path) == [0, 1] and len(store) == 5 and store.tokens == 5 + 3 + 10 + 2 + 4
    states = DocumentStates(lm, max_tokens=10)
    states.use_store(tmp_path)
    calls = read_by_lm(lm)
    asked = [DOCUMENTS[3], DOCUMENTS[0], [40, 41, 42], DOCUMENTS[1]]
    read = states(asked)
    assert calls == [1] and (states.loaded, states.misses) == (3, 1)  # only the document no shard holds
    states([DOCUMENTS[0]])  # kept in memory now
    assert states.hits == 1 and calls == [1]
    for ids, got in zip(asked, read):
        expected = alone(lm, ids)
        assert got.shape == expected.shape == (min(len(ids), 10), lm.config.hidden_size) and got.dtype == torch.float32
        if dtype == "float32":
            assert torch.allclose(got, expected, atol=1e-5)
        assert float(F.cosine_similarity(got, expected, dim=-1).min()) > 0.999


def test_a_document_is_found_by_its_exact_ids_only(tmp_path):
    lm = tiny_llama(64)
    store = write_document_states(DocumentStates(lm, max_tokens=10, max_bytes=0), DOCUMENTS, tmp_path)
    found = store.lookup([[5, 6, 7, 8], [5, 6, 7, 8, 9, 10], [5, 6], [6, 5, 7], [], [5, 6, 7, 8, 9]])
    assert [f is not None for f in found] == [True, False, False, False, False, True]
    shard, document = store._where[next(iter(store._where))][0]  # a key whose stored ids no longer match: a miss
    start, end = store._offsets[shard][document : document + 2]
    ids = store._ids[shard][start:end].tolist()
    store._ids[shard][start] += 1
    assert store.lookup([ids]) == [None] and store.stats()["misses"] == 4 + 1


def test_a_resumed_build_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    lm = tiny_llama(64)
    whole = write_document_states(DocumentStates(lm, max_tokens=10, max_bytes=0), DOCUMENTS, tmp_path / "whole",
                                  shard_documents=2)
    write = state_store.write_token_shard
    monkeypatch.setattr(state_store, "write_token_shard", killed_after(2, write))
    with pytest.raises(KeyboardInterrupt):
        write_document_states(DocumentStates(lm, max_tokens=10, max_bytes=0), DOCUMENTS, tmp_path / "resumed",
                              shard_documents=2)
    assert finished_shards(tmp_path / "resumed") == [0, 1]
    monkeypatch.setattr(state_store, "write_token_shard", write)
    calls = read_by_lm(lm)
    resumed = write_document_states(DocumentStates(lm, max_tokens=10, max_bytes=0), DOCUMENTS, tmp_path / "resumed",
                                    shard_documents=2)
    assert calls == [2]  # only the last shard's two documents were read
    for number in range(3):
        for name in ("token_ids.npy", "offsets.npy", "states.npy"):
            a, b = (np.load(shard_path(s.directory, number) / name) for s in (whole, resumed))
            assert np.array_equal(a, b), (number, name)


def test_a_store_of_another_lm_or_max_tokens_is_refused(tmp_path):
    lm, other_lm = tiny_llama(64), tiny_llama(64, seed=1)  # held: DocumentStates holds its LM weakly
    write_document_states(DocumentStates(lm, max_tokens=10, max_bytes=0), DOCUMENTS, tmp_path)
    for other in (DocumentStates(other_lm, max_tokens=10), DocumentStates(lm, max_tokens=8)):
        with pytest.raises(ValueError, match="another LM or for max_tokens=10.*document-states --index .*--overwrite"):
            other.use_store(tmp_path)
        assert other.stores == []
    with pytest.raises(ValueError, match="another build.*fingerprint.*--overwrite"):
        write_document_states(DocumentStates(other_lm, max_tokens=10, max_bytes=0), DOCUMENTS, tmp_path)
    assert DocumentStateStore(tmp_path).fingerprint == DocumentStates(lm).fingerprint  # the store there is kept
    rebuilt = write_document_states(DocumentStates(other_lm, max_tokens=10, max_bytes=0), DOCUMENTS, tmp_path,
                                    overwrite=True)
    assert rebuilt.fingerprint == DocumentStates(other_lm).fingerprint != DocumentStates(lm).fingerprint


def test_bad_stores_and_settings_are_refused_with_the_fix(tmp_path):
    lm = tiny_llama(64)
    with pytest.raises(ValueError, match="not a store of document states; build one with `dynvocab document-states"):
        DocumentStateStore(tmp_path)
    with pytest.raises(ValueError, match="dtype='bfloat16' must be one of"):
        write_document_states(DocumentStates(lm, max_bytes=0), DOCUMENTS, tmp_path, dtype="bfloat16")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="non-empty folder"):
        write_document_states(DocumentStates(lm, max_bytes=0), DOCUMENTS, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with torch.no_grad():
        lm.model.norm.weight.fill_(1e6)  # states beyond float16's range
    with pytest.raises(ValueError, match="does not fit float16.*--dtype float32"):
        write_document_states(DocumentStates(lm, max_bytes=0), DOCUMENTS, tmp_path / "huge")
    assert read_record(tmp_path / "huge", DOCUMENT_STATES)["dtype"] == "float16"
    assert finished_shards(tmp_path / "huge") == []


def test_several_stores_are_read_in_turn(tmp_path):
    lm = tiny_llama(64)
    write_document_states(DocumentStates(lm, max_tokens=10, max_bytes=0), DOCUMENTS[:2], tmp_path / "a")
    write_document_states(DocumentStates(lm, max_tokens=10, max_bytes=0), DOCUMENTS[3:], tmp_path / "b")
    states = DocumentStates(lm, max_tokens=10)
    for folder in ("a", "b", "a"):
        states.use_store(tmp_path / folder)
    calls = read_by_lm(lm)
    states([DOCUMENTS[0], DOCUMENTS[4]])
    assert len(states.stores) == 2 and states.loaded == 2 and calls == []
    states.use_store(None)
    states([DOCUMENTS[1]])
    assert states.stores == [] and calls == [1]
