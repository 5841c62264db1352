"""Fixtures for the eval tests: tiny random Llama and GPT-2 over the word-level tokenizer, built offline."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(scope="session")
def _tiny_llama(word_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=len(word_tokenizer),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.5,  # large weights so that log-probs differ clearly from uniform
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def _tiny_gpt2(word_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=len(word_tokenizer), n_positions=64)
    config.initializer_range = 0.5
    return GPT2LMHeadModel(config).eval()


@pytest.fixture
def tiny_llama(_tiny_llama):
    """A fresh copy of the session's tiny random Llama (hidden 16, 2 layers)."""
    return copy.deepcopy(_tiny_llama)


@pytest.fixture(params=["llama", "gpt2"])
def tiny_lm(request, _tiny_llama, _tiny_gpt2):
    """A fresh copy of each tiny random causal LM: Llama (rotary positions) and GPT-2 (learned absolute positions)."""
    return copy.deepcopy(_tiny_llama if request.param == "llama" else _tiny_gpt2)
