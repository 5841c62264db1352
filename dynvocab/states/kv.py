"""The LM's keys and values over documents, each document read once and joined into a request's KV cache: the
documents' prefill taken out of grounded decoding (TurboRAG, Lu et al. 2024; RAGCache, Jin et al. 2024).

Grounded decoding reads a request's top documents before its prompt: 768 tokens that take SmolLM2 1.9 s on 2 CPU
cores, a fifth of a Wikipedia prompt's LM time. :class:`DocumentKV` keeps each document's keys and values of every
layer, computed alone at positions ``0 .. n-1`` (in memory, least recently used out first, and in a store beside
the index, ``dynvocab document-kv``). :meth:`DocumentKV.cache` joins a request's documents into one
``DynamicCache``, each document's keys turned by the rotary embedding to the positions it takes after the ones
before it, so the LM reads only the prompt. The first document's keys and values are exactly the LM's; a later
document did not attend to the ones before it (TurboRAG's independent attention), so the text can differ from the
LM reading the documents together. Only LMs with rotary position embeddings (Llama, Mistral, Qwen, SmolLM) can turn
a key to another position; GPT-2's absolute positions cannot.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache

from ..phrases.store import StoreKind
from .store import DocumentStates, DocumentStateStore

__all__ = ["DOCUMENT_KV", "DocumentKV", "DocumentKVStore", "rotated_keys"]

DOCUMENT_KV = StoreKind("dynvocab.DocumentKVStore", "document keys and values",
                        "dynvocab document-kv --index <index folder>")


class DocumentKVStore(DocumentStateStore):
    """Documents' keys and values, ``(L_i, layers * 2 * kv_heads * head_dim)`` a document, read from a store folder
    (``dynvocab.states.store.DocumentStateStore``'s layout)."""

    kind = DOCUMENT_KV


class DocumentKV(DocumentStates):
    """The LM's keys and values of every layer over documents' first ``max_tokens`` tokens, each read once.

    A document's states are kept flat, ``(L_i, layers * 2 * kv_heads * head_dim)`` (float32), by its token ids; the
    LRU, ``max_bytes`` and stores are ``DocumentStates``' (a 384-token document of SmolLM2-135M holds 17.7 MB).
    """

    kind, store_class = DOCUMENT_KV, DocumentKVStore

    def __init__(self, lm: nn.Module, max_tokens: int = 4096, batch_size: int = 4, max_bytes: int = 2**32) -> None:
        rotary = getattr(lm.get_decoder(), "rotary_emb", None)
        config = lm.config.get_text_config()
        if rotary is None or getattr(config, "partial_rotary_factor", 1.0) != 1.0 \
                or float(getattr(rotary, "attention_scaling", 1.0)) != 1.0:
            raise ValueError(f"{type(lm).__name__} has no plain rotary position embedding over whole heads, so a "
                             "document's keys cannot be moved to another position: let the LM read the documents "
                             "with each request (document_kv=0)")
        super().__init__(lm, max_tokens, batch_size, max_bytes)
        self.layers = config.num_hidden_layers
        self.heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    @property
    def dim(self) -> int:
        """Numbers kept per token: a key and a value of every layer and KV head."""
        return self.layers * 2 * self.heads * self.head_dim

    def _read(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(B, W, dim)`` keys and values at each of right-padded ``ids`` ``(B, W)``, at positions ``0 .. W-1``."""
        cache = DynamicCache()
        self.lm(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
        pairs = torch.stack([torch.stack([layer.keys, layer.values]) for layer in cache.layers])  # (layers, 2, B, H, W, d)
        return pairs.permute(2, 4, 0, 1, 3, 5).reshape(ids.shape[0], ids.shape[1], self.dim).float()

    @torch.no_grad()
    def cache(self, documents: Sequence[Sequence[int]]) -> DynamicCache:
        """One ``DynamicCache`` over ``documents`` (token ids, in the order the LM reads them, each whole: at most
        ``max_tokens``), each document's keys turned to the positions it takes after the ones before it."""
        if any(len(ids) > self.max_tokens for ids in documents):
            raise ValueError(f"a document of {max(map(len, documents))} tokens is longer than max_tokens="
                             f"{self.max_tokens}: cut the documents first, or make a DocumentKV with a larger max_tokens")
        parameter = next(self.lm.parameters())
        keys, values, offset = [], [], 0
        for flat in self([ids for ids in documents if len(ids)]):
            pairs = flat.to(parameter.device, parameter.dtype).view(-1, self.layers, 2, self.heads, self.head_dim)
            pairs = pairs.permute(1, 2, 3, 0, 4)  # (layers, 2, H, n, d)
            keys.append(rotated_keys(self.lm, pairs[:, 0], offset) if offset else pairs[:, 0])
            values.append(pairs[:, 1])
            offset += flat.shape[0]
        if not keys:
            return DynamicCache()
        joined_keys, joined_values = torch.cat(keys, dim=2), torch.cat(values, dim=2)
        return DynamicCache([(joined_keys[layer][None].contiguous(), joined_values[layer][None].contiguous())
                             for layer in range(self.layers)])


def rotated_keys(lm: nn.Module, keys: torch.Tensor, offset: int) -> torch.Tensor:
    """``keys`` ``(..., n, head_dim)`` computed at positions ``p`` turned to ``p + offset`` by the LM's rotary
    embedding: a rotation by ``offset``'s angles composes with the one by ``p``'s (half-split pairs, as Llama's)."""
    positions = torch.full((1, keys.shape[-2]), offset, device=keys.device)
    cos, sin = lm.get_decoder().rotary_emb(keys, positions)  # (1, n, head_dim)
    first, second = keys.chunk(2, dim=-1)
    return keys * cos + torch.cat((-second, first), dim=-1) * sin
