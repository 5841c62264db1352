"""Tiny random BERT encoder built offline from a config and an in-memory WordPiece vocabulary."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

from tests.tiny_mlm import WORDS, tiny_mlm_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return tiny_mlm_tokenizer()


@pytest.fixture(scope="session")
def _tiny_bert() -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=len(WORDS),
        max_position_embeddings=64,
    )
    return BertModel(config).eval()


@pytest.fixture
def tiny_bert(_tiny_bert: BertModel) -> BertModel:
    return copy.deepcopy(_tiny_bert)
