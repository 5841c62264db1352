"""``dynvocab pretrain-encoder``: DupMAE pre-training (or continued pre-training on a target corpus)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from dynvocab.config import JsonConfig
from dynvocab.data.assets import resolve_model
from dynvocab.data.corpora import CORPORA, corpus_split
from dynvocab.training.loop import LoopSettings, check_loop_settings
from encoders.dupmae import DupMAEConfig, DupMAEForPretraining

from ..index.documents import load_documents
from .trainer import EncoderTrainer

__all__ = ["PretrainConfig", "corpus_texts", "pretrain", "step_indices"]

logger = logging.getLogger(__name__)


@dataclass
class PretrainConfig(LoopSettings, JsonConfig):
    """Settings of ``dynvocab pretrain-encoder``."""

    model: str = field(default="minilm", metadata={"help": "BERT-like masked LM: Hub name or folder; 'minilm' is the offline asset"})
    data: str = field(default="wikipedia", metadata={"help": "'wikipedia' or 'licenses' (their training split), or a JSONL/text file"})
    text_field: str = field(default="text", metadata={"help": "field holding the text in JSONL files"})
    output_dir: str = field(default="runs/dupmae", metadata={"help": "checkpoints, log.jsonl and final/ go here"})
    max_length: int = field(default=64, metadata={"help": "tokens per training sequence"})
    batch_size: int = field(default=16, metadata={"help": "sequences per step and process"})
    encoder_mask_ratio: float = field(default=0.3, metadata={"help": "encoder MLM mask ratio"})
    decoder_mask_ratio: float = field(default=0.5, metadata={"help": "decoder context mask ratio"})
    mlm_weight: float = field(default=1.0, metadata={"help": "weight of L_mlm"})
    decoder_weight: float = field(default=1.0, metadata={"help": "weight of L_dec"})
    bow_weight: float = field(default=1.0, metadata={"help": "weight of L_bow"})

    config_name: ClassVar[str] = "pretrain_config.json"

    def __post_init__(self) -> None:
        for name in ("max_length", "batch_size", "max_steps", "save_every", "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        check_loop_settings(self)
        self.dupmae_config()

    def dupmae_config(self) -> DupMAEConfig:
        return DupMAEConfig(self.encoder_mask_ratio, self.decoder_mask_ratio, self.mlm_weight, self.decoder_weight,
                            self.bow_weight)


def corpus_texts(data: str, text_field: str = "text") -> list[str]:
    """Training texts: the training split of an embedded corpus, or every document of a file."""
    documents = corpus_split(data)[0] if data in CORPORA else load_documents(data, text_field=text_field)
    texts = [d["text"] for d in documents if d["text"].strip()]
    if not texts:
        raise ValueError(f"data={data!r} holds no text; pass a corpus name {sorted(CORPORA)} or a file with documents")
    return texts


def step_indices(step: int, batch_size: int, size: int, seed: int, process: int = 0, processes: int = 1) -> list[int]:
    """Rows of one process's batch at ``step``: epochs are permutations seeded by ``seed + epoch``; processes get
    disjoint slices of each global batch."""
    start = (step * processes + process) * batch_size
    rows = []
    for position in range(start, start + batch_size):
        epoch, offset = divmod(position, size)
        rows.append(int(np.random.default_rng(seed + epoch).permutation(size)[offset]))
    return rows


def pretrain(config: PretrainConfig, resume: bool = False) -> dict[str, float]:
    """Pre-train with DupMAE's three losses; ``output_dir/final`` loads with ``HybridEncoder.from_pretrained``."""
    texts = corpus_texts(config.data, config.text_field)
    torch.manual_seed(config.seed)
    model = DupMAEForPretraining.from_pretrained(resolve_model(config.model), config.dupmae_config())
    tokenizer = model.tokenizer

    def batch_at(step: int, process: int, processes: int) -> dict[str, Any]:
        rows = step_indices(step, config.batch_size, len(texts), config.seed, process, processes)
        batch = tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=config.max_length,
                          return_tensors="pt")
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step * 1009 + process)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "generator": generator}

    trainer = EncoderTrainer(model, config, config.output_dir, batch_at, lambda module, folder: module.save_pretrained(folder))
    return trainer.train(resume=resume)
