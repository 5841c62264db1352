"""Loading causal LMs by name or offline alias, with or without a trained phrase encoder."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .assets import resolve_model
from .model import DynamicVocabLM

__all__ = ["SHIPPED_ENCODER", "load_dynamic_lm", "load_lm"]

logger = logging.getLogger(__name__)

#: a phrase encoder trained by `dynvocab train` (settings in its train_config.json), shipped so the demo starts at once
SHIPPED_ENCODER = Path(__file__).resolve().parents[1] / "examples" / "checkpoints" / "smollm2-wikipedia"


def load_lm(name: str) -> tuple[torch.nn.Module, object]:
    path = resolve_model(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), tokenizer


def load_dynamic_lm(name: str, checkpoint: str | Path | None) -> DynamicVocabLM:
    """The LM with a trained phrase encoder (and the LM's LoRA adapter or weights, if they trained)."""
    full = Path(checkpoint) / "lm_weights" if checkpoint is not None else None
    lm, tokenizer = load_lm(str(full) if full is not None and full.exists() else name)
    if checkpoint is None:
        logger.warning("no phrase-encoder checkpoint given: phrases are encoded by an untrained encoder")
        return DynamicVocabLM.from_causal_lm(lm, tokenizer).eval()
    adapter = Path(checkpoint) / "lm_adapter"
    if adapter.exists():
        from peft import PeftModel

        lm = PeftModel.from_pretrained(lm, adapter)
    return DynamicVocabLM.from_pretrained(checkpoint, lm, tokenizer).eval()
