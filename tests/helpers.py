"""Helpers the tests share: tiny random models built offline from configs, a word-level tokenizer, a model-free encoder.

Fixtures live in the ``conftest.py`` files and build on these; tests import from here, never from a conftest.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from dynvocab.scoring.dot_product import DotProductScorer

ROOT = Path(__file__).resolve().parents[1]


def launch(root: Path, *arguments: str) -> str:
    """``accelerate launch -m dynvocab ARGUMENTS`` on two CPU processes (gloo), run in ``root``; returns its stdout."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
               "-m", "dynvocab", *arguments]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def tiny_llama(vocab_size: int, seed: int = 0, hidden_size: int = 16) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=vocab_size,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(vocab_size: int, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=vocab_size, n_positions=256)).eval()


WORDS = "the cat sat on a mat dog ran to red blue big small and it was".split()


def word_tokenizer(padding_side: str = "right", *, words=WORDS, adds_bos: bool = False, cleans_up_spaces: bool = False):
    """Word-level tokenizer over ``words`` (ids 4..), pad 0, bos 1, eos 2, unk 3.

    ``adds_bos``: like Llama's, it puts ``<s>`` first unless ``add_special_tokens=False``.
    ``cleans_up_spaces``: like BERT's, its ``decode`` drops the space before punctuation ("cat ." -> "cat.").
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>", "<unk>", *words])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if adds_bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side=padding_side,
        clean_up_tokenization_spaces=cleans_up_spaces,
    )


class HashEncoder:
    """Deterministic bag-of-words encoder: each word is a fixed random vector (seeded by the word)."""

    def __init__(self, dim: int = 16, seed: int = 0, name: str = "hash-encoder", pooling: str = "mean") -> None:
        self.dim, self.seed, self.name, self.pooling, self.normalize = dim, seed, name, pooling, True

    def encode(self, texts, batch_size: int = 32, show_progress_bar=None) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row] += np.random.default_rng([zlib.crc32(word.encode()), self.seed]).standard_normal(self.dim)
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


class RandomScorer(torch.nn.Module):
    """Phrase scores from a fixed random projection of the hidden state: phrases and tokens both win steps."""

    def __init__(self, hidden_size: int, num_phrases: int, scale: float = 6.0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.register_buffer("projection", torch.randn(hidden_size, num_phrases, generator=generator) * scale)

    def forward(self, hidden, phrase_vectors, phrase_mask=None):
        scores = hidden @ self.projection[:, : phrase_vectors.shape[0]].to(hidden.dtype)
        if phrase_mask is not None:
            scores = scores.masked_fill(~phrase_mask[:, None, :], float("-inf"))
        return scores


class PreferPhrases(DotProductScorer):
    """Exact phrase scores lifted by 100, far above a tiny LM's logits (|logit| < 1): a phrase a row may use wins
    every step it is not banned, the best of them by its exact score. Not 1e4, where float32 keeps only 1e-3 of a
    score and nearby phrases tie."""

    def forward(self, hidden, vectors, mask=None):
        return super().forward(hidden, vectors, mask) + 100.0


class PhrasesAlwaysWin(torch.nn.Module):
    """A phrase scorer that gives every phrase a huge score: greedy decoding picks a phrase unless one is banned."""

    def forward(self, hidden, vectors, mask=None):
        scores = hidden[..., :1] * 0 + 1e4
        return scores.expand(*hidden.shape[:-1], vectors.shape[0]).clone()


class TableLM(torch.nn.Module):
    """A causal LM whose next-token scores depend on the last token only: ``logits[last]``, ``logits`` ``(V, V)``,
    on ``logits``' device."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.table = logits
        self.head = torch.nn.Linear(1, logits.shape[1], bias=False, device=logits.device)
        self.generation_config = GenerationConfig(eos_token_id=None)

    @property
    def device(self) -> torch.device:
        return self.table.device

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, ids, past_key_values=None, use_cache=True, logits_to_keep=0, **padding):
        """``padding``: a batch's ``attention_mask`` and ``position_ids``, which the last token alone makes moot."""
        logits = self.table[ids]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def count_encoded(model) -> list[int]:
    """Spy on ``model``'s phrase encoder: the returned list gets the number of phrases of each ``encode_ids`` call."""
    calls, encode = [], model.phrase_encoder.encode_ids

    def spy(phrases, *args, **kwargs):
        calls.append(len(phrases))
        return encode(phrases, *args, **kwargs)

    model.phrase_encoder.encode_ids = spy
    return calls


def count_tokenized(tokenizer, monkeypatch) -> list[str]:
    """Spy on ``tokenizer``'s calls until the test ends: the returned list gets every text it is asked to tokenize."""
    texts, call = [], type(tokenizer).__call__

    def spy(self, text, *args, **kwargs):
        texts.extend([text] if isinstance(text, str) else text)
        return call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", spy)
    return texts


def killed_after(count: int, write):
    """``write``, raising ``KeyboardInterrupt`` once it has written ``count`` times: a build killed part-way."""
    written = []

    def killed(*args):
        if len(written) == count:
            raise KeyboardInterrupt
        written.append(write(*args))

    return killed
