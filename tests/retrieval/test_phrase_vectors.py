"""Phrase vectors computed beside an index: the vectors encoding makes, found per request, resumable, tied to the encoder."""

import dataclasses

import numpy as np
import pytest
import torch

from dynvocab import DynamicVocabLM
from dynvocab.phrases.store import finished_shards, flatten, phrase_keys, shard_path
from retrieval import DocumentIndex
from retrieval.config import PipelineConfig
from retrieval.phrase_vectors import attach_phrase_vectors, build_phrase_vectors, store_path
from retrieval.pipeline import PhrasePipeline
from tests.helpers import HashEncoder as WordHashEncoder, count_encoded, killed_after

MORE = [
    {"id": "nyc", "title": "New York", "text": "New York City is the most populous city in the United States. New York City lies on the Hudson River."},
    {"id": "paris", "title": "Paris", "text": "Paris is the capital of France. The Seine river flows through Paris."},
    {"id": "tokyo", "title": "Tokyo", "text": "Tokyo is the capital of Japan. Greater Tokyo is the largest metropolitan area."},
    {"id": "rome", "title": "Rome", "text": "Rome is the capital city of Italy. The Tiber river flows through Rome."},
    {"id": "cairo", "title": "Cairo", "text": "Cairo is the capital of Egypt. The Nile river flows through Cairo."},
]


@pytest.fixture
def index_dir(tmp_path):
    DocumentIndex.build(MORE, WordHashEncoder(), index_type="flat").save(tmp_path / "index")
    return tmp_path / "index"


def model_of(base_model, tokenizer, **config) -> DynamicVocabLM:
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer, **config).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # a trained-looking encoder: the head's deltas are not zero
        for parameter in model.phrase_encoder.head.parameters():
            parameter.normal_(0, 0.5)
    return model


def test_keys_tell_phrases_apart_by_ids_and_length():
    phrases = [(1, 2), (2, 1), (1, 2, 0), (0, 1, 2), (1, 2)]
    keys = phrase_keys(*flatten(phrases))
    assert len(set(keys[:4].tolist())) == 4 and keys[0] == keys[4]


def test_a_pipeline_that_cuts_no_phrases_leaves_the_store_alone(base_model, tokenizer, index_dir):
    model = model_of(base_model, tokenizer)
    index = DocumentIndex.load(index_dir, encoder=WordHashEncoder())
    config = PipelineConfig(grounded=False, top_k=2, max_new_tokens=4, agreement_top_k=0)
    build_phrase_vectors(model, index, config, shard_documents=2)
    PhrasePipeline(model, index, dataclasses.replace(config, max_phrases=0))
    assert model.phrase_store is None
    PhrasePipeline(model, index, config)
    assert model.phrase_store is not None


def test_stored_vectors_are_the_ones_encoding_makes_and_a_request_encodes_none(base_model, tokenizer, index_dir):
    model = model_of(base_model, tokenizer)
    index = DocumentIndex.load(index_dir, encoder=WordHashEncoder())
    config = PipelineConfig(grounded=False, top_k=2, max_new_tokens=4, agreement_top_k=0)
    store = build_phrase_vectors(model, index, config, shard_documents=2)
    assert finished_shards(store_path(index_dir)) == [0, 1, 2] and len(store) > 20
    pipeline = PhrasePipeline(model, index, config)
    assert model.phrase_store is not None and model.phrase_store.directory == store_path(index_dir)
    calls = count_encoded(model)
    pipeline("Which river flows through Rome?")
    assert calls == [] and model.phrase_store.hits == len(model.phrase_table) > 0
    fresh = model_of(base_model, tokenizer)
    fresh.set_phrases(model.phrases, mid_sentence_forms=False)
    assert torch.allclose(model.phrase_table.output_vectors, fresh.phrase_table.output_vectors, atol=1e-6)


def test_a_key_collision_is_a_miss_not_a_wrong_vector(base_model, tokenizer, index_dir):
    model = model_of(base_model, tokenizer)
    store = build_phrase_vectors(model, DocumentIndex.load(index_dir, encoder=WordHashEncoder()), PipelineConfig(grounded=False))
    ids = [tuple(store._flat[store._offsets[g] : store._offsets[g + 1]].tolist()) for g in (0, 1)]
    assert store.lookup(ids)[0] == [0, 1]
    store._flat[store._offsets[1]] += 1  # phrase 1's stored ids now differ from the ids its key was made of
    found, vectors = store.lookup(ids)
    assert found == [0] and vectors.shape == (1, store.dim) and store.stats()["misses"] == 1


def test_a_phrase_the_store_lacks_is_encoded(base_model, tokenizer, index_dir):
    model = model_of(base_model, tokenizer)
    build_phrase_vectors(model, DocumentIndex.load(index_dir, encoder=WordHashEncoder()), PipelineConfig(grounded=False))
    model.use_phrase_store(store_path(index_dir))
    calls = count_encoded(model)
    model.set_phrases([" Tiber river", " a phrase no document holds"], mid_sentence_forms=False)
    assert calls == [1] and model.phrase_store.stats()["hits"] == 1


def test_a_resumed_build_equals_an_uninterrupted_one(base_model, tokenizer, index_dir, tmp_path, monkeypatch):
    model = model_of(base_model, tokenizer)
    index = DocumentIndex.load(index_dir, encoder=WordHashEncoder())
    whole = build_phrase_vectors(model, index, PipelineConfig(grounded=False), directory=tmp_path / "whole", shard_documents=2)
    import retrieval.phrase_vectors as builder

    write = builder.write_shard
    monkeypatch.setattr(builder, "write_shard", killed_after(2, write))
    with pytest.raises(KeyboardInterrupt):
        build_phrase_vectors(model, index, PipelineConfig(grounded=False), directory=tmp_path / "resumed", shard_documents=2)
    assert finished_shards(tmp_path / "resumed") == [0, 1]
    monkeypatch.setattr(builder, "write_shard", write)
    calls = count_encoded(model)
    resumed = build_phrase_vectors(model, index, PipelineConfig(grounded=False), directory=tmp_path / "resumed", shard_documents=2)
    assert len(calls) == 1  # only the missing shard was encoded
    for number in range(3):
        for name in ("token_ids.npy", "offsets.npy", "vectors.npy"):
            a, b = (np.load(shard_path(s.directory, number) / name) for s in (whole, resumed))
            assert np.array_equal(a, b), (number, name)


def test_a_store_of_another_encoder_is_refused_and_not_read(base_model, tokenizer, index_dir, caplog):
    model = model_of(base_model, tokenizer)
    index = DocumentIndex.load(index_dir, encoder=WordHashEncoder())
    build_phrase_vectors(model, index, PipelineConfig(grounded=False))
    other = model_of(base_model, tokenizer)
    with torch.no_grad():
        next(other.phrase_encoder.head.parameters()).add_(0.1)
    with pytest.raises(ValueError, match="another phrase encoder.*dynvocab phrase-vectors --index"):
        other.use_phrase_store(store_path(index_dir))
    caplog.set_level("INFO", logger="retrieval.phrase_vectors")
    assert attach_phrase_vectors(other, index) is None and "encodes its phrases" in caplog.text
    with pytest.raises(ValueError, match="another build.*fingerprint.*--overwrite"):
        build_phrase_vectors(other, index, PipelineConfig(grounded=False))
    rebuilt = build_phrase_vectors(other, index, PipelineConfig(grounded=False), overwrite=True)
    other.use_phrase_store(rebuilt)
    assert other.phrase_store is rebuilt


def test_the_store_is_not_read_once_the_encoder_trains_on(base_model, tokenizer, index_dir):
    model = model_of(base_model, tokenizer)
    store = build_phrase_vectors(model, DocumentIndex.load(index_dir, encoder=WordHashEncoder()), PipelineConfig(grounded=False))
    model.use_phrase_store(store)
    with torch.no_grad():
        next(model.phrase_encoder.head.parameters()).add_(0.1)  # as a training step would
    calls = count_encoded(model)
    model.set_phrases([" Tiber river"], mid_sentence_forms=False)
    assert calls == [1] and store.hits == 0


def test_bfloat16_vectors_round_trip(base_model, tokenizer, index_dir):
    model = model_of(base_model, tokenizer, phrase_dtype="bfloat16")
    store = build_phrase_vectors(model, DocumentIndex.load(index_dir, encoder=WordHashEncoder()), PipelineConfig(grounded=False))
    model.use_phrase_store(store)
    model.set_phrases([" Tiber river"], mid_sentence_forms=False)
    stored = model.phrase_table.output_vectors
    assert stored.dtype == torch.bfloat16 and torch.equal(stored, model.encode_output_vectors([model.phrase_table.token_ids[0]]))


def test_the_demo_builds_the_vectors_once_and_leaves_another_encoders_alone(base_model, tokenizer, index_dir, capsys):
    from dynvocab.cli.demo import phrase_vectors_beside

    model = model_of(base_model, tokenizer)
    index = DocumentIndex.load(index_dir, encoder=WordHashEncoder())
    phrase_vectors_beside(model, index, PipelineConfig(grounded=False))
    stored = sorted(p.read_bytes() for p in store_path(index_dir).rglob("*.npy"))
    assert stored and finished_shards(store_path(index_dir)) == [0]
    calls = count_encoded(model)
    phrase_vectors_beside(model, index, PipelineConfig(grounded=False))  # complete: nothing encoded again
    assert calls == [] and "not used" not in capsys.readouterr().out
    other = model_of(base_model, tokenizer)
    with torch.no_grad():
        next(other.phrase_encoder.head.parameters()).add_(0.1)
    phrase_vectors_beside(other, index, PipelineConfig(grounded=False))
    assert "another build" in capsys.readouterr().out  # said, and the store is kept as it was
    assert sorted(p.read_bytes() for p in store_path(index_dir).rglob("*.npy")) == stored
