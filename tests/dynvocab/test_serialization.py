import copy
import os

import pytest
import torch

from dynvocab import DynamicVocabLM, Phrase
from tests.helpers import tiny_llama

PHRASES = [" New York City", Phrase(" of the", "doc-1")]


@pytest.fixture
def trained(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer, encoder_layers=2).eval()
    with torch.no_grad():
        for p in model.phrase_encoder.head.parameters():
            p.add_(torch.randn_like(p))
    model.set_phrases(PHRASES)
    return model


def test_round_trip_restores_every_tensor_and_writes_only_our_files(trained, base_model, tokenizer, tmp_path):
    fresh_base = copy.deepcopy(base_model)
    trained.save_pretrained(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "dynvocab_config.json", "dynvocab_manifest.json", "phrase_encoder.safetensors", "phrase_encoder_config.json"
    ]
    loaded = DynamicVocabLM.from_pretrained(tmp_path / "ckpt", fresh_base, tokenizer).eval()
    expected = trained.phrase_encoder.state_dict()
    for name, tensor in loaded.phrase_encoder.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert loaded.dynvocab_config == trained.dynvocab_config
    loaded.set_phrases(PHRASES)
    ids = torch.tensor([trained.tokenize("He went to New York City of the year")])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, trained(ids).logits)


def test_phrases_are_saved_when_asked(trained, base_model, tokenizer, tmp_path):
    trained.save_pretrained(tmp_path / "ckpt", save_phrases=True)
    loaded = DynamicVocabLM.from_pretrained(tmp_path / "ckpt", copy.deepcopy(base_model), tokenizer)
    assert loaded.phrases == trained.phrases
    assert torch.equal(loaded.phrase_table.output_vectors, trained.phrase_table.output_vectors)


def test_another_hidden_size_or_tokenizer_is_refused(trained, tokenizer, tmp_path):
    trained.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="hidden size 32"):
        DynamicVocabLM.from_pretrained(tmp_path / "ckpt", tiny_llama(len(tokenizer), hidden_size=32), tokenizer)
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<new-token>"])
    with pytest.raises(ValueError, match="different vocabulary"):
        DynamicVocabLM.from_pretrained(tmp_path / "ckpt", tiny_llama(len(tokenizer)), other)


def test_a_failed_save_keeps_the_previous_checkpoint(trained, monkeypatch, tmp_path):
    trained.save_pretrained(tmp_path / "ckpt")
    before = (tmp_path / "ckpt" / "phrase_encoder.safetensors").read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("dynvocab.serialization.save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        trained.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "phrase_encoder.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_loading_a_directory_that_is_not_a_checkpoint(tmp_path, llama, tokenizer):
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        DynamicVocabLM.from_pretrained(tmp_path, llama, tokenizer)


def test_unknown_arguments_are_refused(trained, llama, tokenizer, tmp_path):
    with pytest.raises(TypeError, match="safe_serialization"):
        trained.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    trained.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(TypeError, match="device_map"):
        DynamicVocabLM.from_pretrained(tmp_path / "ckpt", llama, tokenizer, device_map="auto")


def test_a_base_lm_with_another_vocabulary_size_is_refused(trained, tokenizer, tmp_path):
    trained.save_pretrained(tmp_path / "ckpt")
    bigger = tiny_llama(len(tokenizer) + 8)
    with pytest.raises(ValueError, match=f"vocabulary size {len(tokenizer) + 8}"):
        DynamicVocabLM.from_pretrained(tmp_path / "ckpt", bigger, tokenizer)
