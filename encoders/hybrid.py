"""DupMAE's retrieval representation: [CLS] (or the token mean) projected to ``d'`` dims plus the top-``k`` vocabulary
weights.

The dense part is ``projection(h_CLS)`` (or of the mean of the token states), L2-normalised; the sparse part is ``log(1 + relu(max_i head(h_i)))``
over the ordinary tokens ``i`` (special tokens get weight 0), cut to its ``k`` largest entries, L2-normalised
and scaled by ``sqrt(w)``. A query and a document score ``dense . dense + w * sparse . sparse`` over shared
vocabulary ids, so each part is a cosine and a score lies in ``[-1, 1 + w]``: raw dot products of unnormalised
MLM-head weights run into the hundreds and swamp any softmax temperature (the contrastive loss then sits near
900). The fusion weight ``w`` (``sparse_weight``, 1 in training) is chosen on held-out queries after fine-tuning
(:mod:`retrieval.training.fusion`).
Representations: ``cls`` (dense only), ``ot`` (sparse only), ``both`` (CLS:384/OT:384) and
``both-260`` (CLS:384/OT:260, the paper's memory-parity setting).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from .dense import pool
from .dupmae import load_masked_lm, mlm_head
from .masking import ordinary_tokens

__all__ = ["REPRESENTATIONS", "HybridEncoder", "HybridEncoderConfig", "HybridVectors", "hybrid_scores", "top_k_sparse"]

logger = logging.getLogger(__name__)

CONFIG_FILE = "hybrid_config.json"
PROJECTION_FILE = "hybrid_projection.safetensors"

#: representation name -> (use the dense [CLS] part, sparse entries kept; 0: none)
REPRESENTATIONS: dict[str, tuple[bool, int]] = {"cls": (True, 0), "ot": (False, 384), "both": (True, 384),
                                                "both-260": (True, 260)}


@dataclass
class HybridEncoderConfig:
    """Settings of a :class:`HybridEncoder`; recorded in index metadata."""

    name: str = field(default="", metadata={"help": "model name or path the weights came from"})
    dense_dim: int = field(default=384, metadata={"help": "size d' of the projected [CLS] vector"})
    use_dense: bool = field(default=True, metadata={"help": "include the dense [CLS] part"})
    sparse_k: int = field(default=384, metadata={"help": "vocabulary entries kept per text; 0: no sparse part"})
    max_length: int = field(default=256, metadata={"help": "texts are truncated to this many tokens"})
    pooling: str = field(default="cls", metadata={
        "help": "what the dense part projects: 'cls' (DupMAE's [CLS]) or 'mean' (the token mean a sentence encoder such "
                "as MiniLM was trained for; with dense_dim equal to the hidden size the projection starts as the "
                "identity, so the dense part starts as that encoder)"})
    sparse_weight: float = field(default=1.0, metadata={
        "help": "fusion weight w of the sparse part: a score is dense . dense + w * sparse . sparse (each part is a "
                "cosine); 1 in training, then chosen on held-out queries by finetune-encoder"})

    def __post_init__(self) -> None:
        for name, low in (("dense_dim", 1), ("sparse_k", 0), ("max_length", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an int >= {low}")
        if not self.use_dense and self.sparse_k == 0:
            raise ValueError("use_dense=False with sparse_k=0 leaves no representation; keep one part")
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"pooling={self.pooling!r}; choose 'cls' or 'mean'")
        if isinstance(self.sparse_weight, bool) or not isinstance(self.sparse_weight, (int, float)) \
                or not 0 <= self.sparse_weight < float("inf"):
            raise ValueError(f"sparse_weight={self.sparse_weight!r} must be a finite number >= 0; 1 weighs the two "
                             "parts alike, 0 keeps only the dense part")

    @property
    def label(self) -> str:
        """``CLS:384/OT:260`` style name of the representation (``MEAN:384`` for a mean-pooled dense part, ``OT:384x0.3``
        for a sparse part of fusion weight 0.3)."""
        dense = f"{self.pooling.upper()}:{self.dense_dim}"
        sparse = f"OT:{self.sparse_k}" + ("" if self.sparse_weight == 1 else f"x{self.sparse_weight:g}")
        parts = ([dense] if self.use_dense else []) + ([sparse] if self.sparse_k else [])
        return "/".join(parts)


@dataclass(frozen=True)
class HybridVectors:
    """Encoded texts: ``dense (n, d')`` float32 (``(n, 0)`` without a dense part), ``ids``/``values (n, k)``."""

    dense: np.ndarray
    ids: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.dense)


def top_k_sparse(weights: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of ``weights (n, V)``: ``(ids (n, k) int64, values (n, k))``, zeros kept as 0."""
    values, ids = weights.topk(min(k, weights.shape[1]), dim=1)
    return ids, values


def hybrid_scores(query: HybridVectors, documents: HybridVectors) -> np.ndarray:
    """Brute-force scores ``(q, n)``: dense dot plus sparse dot over shared ids (the reference the index matches)."""
    scores = query.dense.astype(np.float64) @ documents.dense.astype(np.float64).T
    for row in range(len(query)):
        weights = dict(zip(query.ids[row].tolist(), query.values[row].tolist()))
        for col in range(len(documents)):
            scores[row, col] += sum(weights.get(i, 0.0) * v for i, v in zip(documents.ids[col].tolist(),
                                                                           documents.values[col].tolist()))
    return scores.astype(np.float32)


class HybridEncoder(nn.Module):
    """A masked LM whose [CLS] state (projected) and max-pooled MLM-head weights represent a text."""

    def __init__(self, model, tokenizer, config: HybridEncoderConfig, projection: nn.Linear | None = None) -> None:
        super().__init__()
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.head = mlm_head(model)
        hidden = model.config.hidden_size
        if projection is None:
            projection = nn.Linear(hidden, config.dense_dim, bias=False)
            if config.dense_dim == hidden:
                nn.init.eye_(projection.weight)
        self.projection = projection
        self.special_ids = sorted(set(tokenizer.all_special_ids))

    @classmethod
    def from_pretrained(cls, name_or_path: str, representation: str = "both", dense_dim: int = 384,
                        max_length: int = 256, pooling: str = "cls") -> HybridEncoder:
        """Load a masked LM (a DupMAE or fine-tuned folder, or any BERT-like Hub name) as a hybrid encoder.

        A folder written by :meth:`save_pretrained` brings back its projection, ``dense_dim``, ``pooling`` and
        ``sparse_weight``; otherwise a fresh projection of ``pooling`` is made (the identity when ``dense_dim`` equals
        the hidden size) and the sparse weight is 1.
        """
        if representation not in REPRESENTATIONS:
            raise ValueError(f"representation={representation!r} is not one of {sorted(REPRESENTATIONS)}")
        model, tokenizer = load_masked_lm(name_or_path)
        folder, projection, sparse_weight = Path(name_or_path), None, 1.0
        if (folder / CONFIG_FILE).is_file():
            saved = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
            dense_dim, pooling = saved["dense_dim"], saved.get("pooling", "cls")  # folders saved before pooling: [CLS]
            sparse_weight = saved.get("sparse_weight", 1.0)
            projection = nn.Linear(model.config.hidden_size, dense_dim, bias=False)
            projection.load_state_dict(load_file(folder / PROJECTION_FILE))
        use_dense, sparse_k = REPRESENTATIONS[representation]
        config = HybridEncoderConfig(name=name_or_path, dense_dim=dense_dim, use_dense=use_dense, sparse_k=sparse_k,
                                     max_length=max_length, pooling=pooling, sparse_weight=sparse_weight)
        return cls(model, tokenizer, config, projection).eval()

    def save_pretrained(self, directory: str | Path) -> None:
        """Writes the masked LM, tokenizer, projection weights and config into ``directory``."""
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.projection.state_dict().items()},
                  Path(directory) / PROJECTION_FILE)
        (Path(directory) / CONFIG_FILE).write_text(json.dumps(asdict(self.config), indent=2), encoding="utf-8")

    def with_representation(self, representation: str) -> HybridEncoder:
        """The same weights under another representation (``cls``, ``ot``, ``both``, ``both-260``)."""
        if representation not in REPRESENTATIONS:
            raise ValueError(f"representation={representation!r} is not one of {sorted(REPRESENTATIONS)}")
        use_dense, sparse_k = REPRESENTATIONS[representation]
        return self._with_config(replace(self.config, use_dense=use_dense, sparse_k=sparse_k))

    def with_sparse_weight(self, weight: float) -> HybridEncoder:
        """The same weights with fusion weight ``weight``: scores become ``dense . dense + weight * sparse . sparse``."""
        return self._with_config(replace(self.config, sparse_weight=weight))

    def _with_config(self, config: HybridEncoderConfig) -> HybridEncoder:
        return HybridEncoder(self.model, self.tokenizer, config, self.projection).train(self.training)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def dim(self) -> int:
        """Size of the dense part (0 for the ``ot`` representation)."""
        return self.config.dense_dim if self.config.use_dense else 0

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def __repr__(self) -> str:
        return f"HybridEncoder(name={self.name!r}, representation={self.config.label!r})"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dense (b, d'), vocabulary weights (b, V))``: the dense part unit length, the weights of length
        ``sqrt(sparse_weight)``, keeping only their top ``sparse_k`` entries (all when ``sparse_k`` is 0), so training
        scores exactly what the index stores."""
        hidden = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        dense = F.normalize(self.projection(pool(hidden, attention_mask, self.config.pooling)), dim=-1)
        ordinary = ordinary_tokens(input_ids, attention_mask, self.special_ids)
        logits = self.head(hidden).masked_fill(~ordinary[..., None], 0.0)
        weights = torch.log1p(torch.relu(logits.amax(dim=1)))
        special = torch.tensor(self.special_ids, dtype=torch.long, device=weights.device)
        weights = weights.index_fill(1, special, 0.0)
        if 0 < self.config.sparse_k < weights.shape[1]:
            ids, values = top_k_sparse(weights, self.config.sparse_k)
            weights = torch.zeros_like(weights).scatter(1, ids, values)
        weights = F.normalize(weights, dim=-1)
        return dense, weights if self.config.sparse_weight == 1 else weights * math.sqrt(self.config.sparse_weight)

    def tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return self.tokenizer(texts, padding=True, truncation=True, max_length=self.config.max_length,
                              return_tensors="pt").to(self.device)

    def encode(self, texts: str | list[str], batch_size: int = 32, show_progress_bar: bool | None = None) -> HybridVectors:
        """Encode ``texts`` (input order) into :class:`HybridVectors` of this representation."""
        if isinstance(texts, str):
            texts = [texts]
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive int, e.g. 32")
        texts = list(texts)
        bad = next((i for i, text in enumerate(texts) if not isinstance(text, str)), None)
        if bad is not None:
            raise TypeError(f"texts[{bad}] is {type(texts[bad]).__name__}; encode takes a list of str")
        if show_progress_bar is None:
            show_progress_bar = logger.isEnabledFor(logging.INFO)
        k = min(self.config.sparse_k, self.vocab_size)
        dense = np.zeros((len(texts), self.dim), dtype=np.float32)
        ids, values = np.zeros((len(texts), k), dtype=np.int64), np.zeros((len(texts), k), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode(), tqdm(total=len(texts), desc="encode", disable=not show_progress_bar) as bar:
            for start in range(0, len(texts), batch_size):
                rows = order[start : start + batch_size]
                batch_dense, weights = self(**_inputs(self.tokenize([texts[i] for i in rows])))
                if self.config.use_dense:
                    dense[rows] = batch_dense.float().cpu().numpy()
                if k:
                    top_ids, top_values = top_k_sparse(weights.float(), k)
                    ids[rows], values[rows] = top_ids.cpu().numpy(), top_values.cpu().numpy()
                bar.update(len(rows))
        return HybridVectors(dense, ids, values)


def _inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
