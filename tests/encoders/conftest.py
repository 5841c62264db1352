"""Tiny random BERT encoder built offline from a config and an in-memory WordPiece vocabulary."""

from __future__ import annotations

import copy

import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

WORDS = (
    "[PAD] [UNK] [CLS] [SEP] [MASK] the a an cat cats dog dogs sat on mat tower paris is in of and run ##s ##ing "
    "eiffel river city bank money water . , !"
).split()


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {word: i for i, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )


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
