"""A non-autoregressive generative retriever (PIXAR): any Hugging Face encoder plus an output layer over a docid vocabulary.

The query is encoded once. The ``[CLS]`` state is ``x0``, the shortlist embedding; the states
at positions ``1..s`` score docid positions ``0..s-1`` against the output layer ``W`` ``(V, d)``
all at once. Decoding is the trie-constrained beam search of ``retrieval.nar.trie`` over
either every id (full softmax) or each query's shortlist from a ``ShortlistHead`` fitted on ``W``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer, PreTrainedModel

from dynvocab.config import JsonConfig
from dynvocab.data.assets import resolve_model
from dynvocab.io.tensor_files import read_tensor_folder, write_tensor_folder
from dynvocab.scoring.shortlist_head import ShortlistHead

from .trie import BeamResult, DocidTrie, beam_search

__all__ = ["NarConfig", "NarRetriever", "SearchStats", "local_or_hub"]

logger = logging.getLogger(__name__)

FORMAT = "dynvocab.NarRetriever"
OUTPUT_FILE = "output_layer.safetensors"
ENCODER_DIR = "encoder"


@dataclass
class NarConfig(JsonConfig):
    """Shape of a NAR retriever."""

    encoder: str = field(default="minilm", metadata={"help": "HF encoder name or path ('minilm' is the offline asset)."})
    vocab_size: int = field(default=16384, metadata={"help": "Docid vocabulary size |V| of the output layer."})
    positions: int = field(default=8, metadata={"help": "s: docid positions scored (docid tokens plus the end id)."})
    max_query_length: int = field(default=64, metadata={"help": "Query tokens kept."})
    x0_pooling: str = field(default="cls", metadata={"help": "x0 is the [CLS] state ('cls') or the masked mean of the states ('mean')."})
    position_states: str = field(
        default="encoder",
        metadata={"help": "Docid position t is scored from encoder state t+1 ('encoder', PIXAR's) or from x0 through a "
                          "learned map of position t ('projected': a frozen encoder's features can then be cached)."},
    )

    config_name: ClassVar[str] = "nar_config.json"

    def __post_init__(self) -> None:
        if self.x0_pooling not in ("cls", "mean") or self.position_states not in ("encoder", "projected"):
            raise ValueError(f"NarConfig x0_pooling={self.x0_pooling!r} and position_states={self.position_states!r}: "
                             "choose 'cls' or 'mean', and 'encoder' or 'projected'")
        for name, low in (("vocab_size", 4), ("positions", 1), ("max_query_length", 2)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"NarConfig.{name}={value!r} must be an integer >= {low}")


@dataclass(frozen=True)
class SearchStats:
    """Per call: seconds spent encoding and in the head plus beam search, and the mean candidates scored per query."""

    encode_s: float
    search_s: float
    candidates: float


class NarRetriever(nn.Module):
    """``encoder`` (an ``AutoModel``) with its tokenizer and an output layer ``(V, d)`` over docid tokens."""

    def __init__(self, encoder: PreTrainedModel, tokenizer, config: NarConfig, output: torch.Tensor | None = None) -> None:
        super().__init__()
        self.encoder, self.tokenizer, self.config = encoder, tokenizer, config
        hidden = encoder.config.hidden_size
        weight = output if output is not None else torch.randn(config.vocab_size, hidden) * 0.02
        if tuple(weight.shape) != (config.vocab_size, hidden):
            raise ValueError(f"output layer {tuple(weight.shape)} must be (vocab_size, hidden) = ({config.vocab_size}, {hidden})")
        self.output = nn.Parameter(weight.float().contiguous())
        if config.position_states == "projected":  # position t: x0 @ maps[t] + shifts[t], maps start as the identity
            self.position_maps = nn.Parameter(torch.eye(hidden).repeat(config.positions, 1, 1))
            self.position_shifts = nn.Parameter(torch.zeros(config.positions, hidden))

    @classmethod
    def from_encoder(cls, config: NarConfig, token_texts: Sequence[str] | None = None) -> "NarRetriever":
        """A fresh retriever on ``config.encoder``; with ``token_texts`` (one per docid id) each output row starts as the
        mean input embedding of its text's word pieces, so a phrase starts near the words it spells."""
        path = local_or_hub(config.encoder)
        encoder = AutoModel.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = cls(encoder, tokenizer, config)
        if token_texts is not None:
            model.init_output_from_texts(token_texts)
        return model

    @torch.no_grad()
    def init_output_from_texts(self, token_texts: Sequence[str], batch_size: int = 256) -> None:
        """Output row ``i`` starts from ``token_texts[i]`` (rows of empty texts stay random): the mean input embedding
        of its word pieces under ``x0_pooling="cls"``, its pooled encoding (the space ``x0`` lives in) under ``"mean"``."""
        if len(token_texts) != self.config.vocab_size:
            raise ValueError(f"token_texts has {len(token_texts)} entries for a vocabulary of {self.config.vocab_size}; "
                             "pass one text per docid id")
        rows = [i for i, text in enumerate(token_texts) if text.strip()]
        if self.config.x0_pooling == "mean":
            for start in range(0, len(rows), batch_size):
                chunk = rows[start : start + batch_size]
                self.output[chunk] = self.pooled([token_texts[i] for i in chunk])
            return
        table = self.encoder.get_input_embeddings().weight
        pieces = self.tokenizer([token_texts[i] for i in rows], add_special_tokens=False)["input_ids"]
        for row, ids in zip(rows, pieces):
            if ids:
                self.output[row] = table[ids].mean(0)

    # ------------------------------------------------------------------ encoding
    def tokenize(self, queries: Sequence[str]) -> dict[str, torch.Tensor]:
        """Queries as encoder inputs, padded to at least ``s + 1`` positions."""
        if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
            raise TypeError("queries must be a list of str; wrap a single query in a list")
        batch = self.tokenizer(list(queries), padding=True, truncation=True, max_length=self.config.max_query_length,
                               return_tensors="pt")
        short = self.config.positions + 1 - batch["input_ids"].shape[1]
        if short > 0:
            pad = self.tokenizer.pad_token_id or 0
            batch["input_ids"] = nn.functional.pad(batch["input_ids"], (0, short), value=pad)
            batch["attention_mask"] = nn.functional.pad(batch["attention_mask"], (0, short), value=0)
            if "token_type_ids" in batch:
                batch["token_type_ids"] = nn.functional.pad(batch["token_type_ids"], (0, short), value=0)
        return {k: v.to(self.output.device) for k, v in batch.items()}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder inputs ``(B, L)`` -> ``x0`` ``(B, d)`` and position states ``(B, s, d)``."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **inputs).last_hidden_state
        if self.config.x0_pooling == "cls":
            x0 = hidden[:, 0]
        else:
            mask = attention_mask[..., None].to(hidden.dtype)
            x0 = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        if self.config.position_states == "encoder":
            return x0, hidden[:, 1 : self.config.positions + 1]
        return x0, self.project(x0)

    def project(self, x0: torch.Tensor) -> torch.Tensor:
        """``(B, d)`` -> ``(B, s, d)`` position states of ``position_states="projected"``."""
        return torch.einsum("bd,sde->bse", x0, self.position_maps.to(x0.dtype)) + self.position_shifts.to(x0.dtype)

    @torch.no_grad()
    def pooled(self, texts: Sequence[str]) -> torch.Tensor:
        """``x0`` of ``texts`` ``(n, d)`` (one forward pass, no gradient)."""
        return self(**self.tokenize(list(texts)))[0].float()

    # ------------------------------------------------------------------ search
    @torch.no_grad()
    def search(self, queries: Sequence[str], trie: DocidTrie, head: ShortlistHead | None = None, beam_size: int = 10
               ) -> tuple[BeamResult, SearchStats]:
        """Beam search over the docid trie with raw (self-normalised) scores: every id, or each query's shortlist."""
        start = time.perf_counter()
        x0, positions = self(**self.tokenize(queries))
        encoded = time.perf_counter()
        weight = self.output
        if head is None:
            result = beam_search(trie, None, positions @ weight.T, beam_size)
            candidates = float(weight.shape[0])
        else:
            head.always = torch.tensor([trie.end_id], device=x0.device)  # every docid ends with it
            ids, scores = head.score(x0, weight, positions)
            result = beam_search(trie, ids, scores, beam_size)
            candidates = float((ids < head.vocab_size).sum(-1).float().mean())
        return result, SearchStats(encoded - start, time.perf_counter() - encoded, candidates)

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, directory: str | Path) -> Path:
        """The encoder (HF ``save_pretrained``), its tokenizer, the output layer and the config; hashed, atomic."""

        def write_encoder(staging: Path) -> None:
            self.encoder.save_pretrained(staging / ENCODER_DIR)
            self.tokenizer.save_pretrained(staging / ENCODER_DIR)

        head = {name: p for name, p in self.named_parameters() if not name.startswith("encoder.")}
        return write_tensor_folder(directory, FORMAT, {OUTPUT_FILE: head}, {"config": self.config.to_dict()}, write=write_encoder)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "NarRetriever":
        """A retriever written by ``save_pretrained`` (every file's hash is checked)."""
        manifest, files = read_tensor_folder(directory, FORMAT)
        config = NarConfig.from_dict(manifest["config"])
        folder = Path(directory) / ENCODER_DIR
        encoder = AutoModel.from_pretrained(folder)
        head = files[OUTPUT_FILE]
        model = cls(encoder, AutoTokenizer.from_pretrained(folder), config, head.pop("output"))
        for name, value in head.items():
            getattr(model, name).data.copy_(value)
        return model



def local_or_hub(name_or_path: str) -> str:
    """An offline alias or path resolved; a path that looks local and is missing raises instead of reaching the Hub."""
    return resolve_model(name_or_path)
