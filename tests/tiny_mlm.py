"""A tiny random BERT masked LM with a WordPiece tokenizer, saved to a folder: what DupMAE tests load by path."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

WORDS = (
    "[PAD] [UNK] [CLS] [SEP] [MASK] the a an cat cats dog dogs sat on mat tower paris is in of and run ##s ##ing "
    "eiffel river city bank money water . , !"
).split()


def tiny_mlm_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {word: i for i, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def save_tiny_mlm(path: Path, seed: int = 0) -> Path:
    """Write a random ``BertForMaskedLM`` (hidden 16, 2 layers) and its tokenizer into ``path``."""
    torch.manual_seed(seed)
    config = BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                        vocab_size=len(WORDS), max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(path)
    tiny_mlm_tokenizer().save_pretrained(path)
    return path
