"""Loading causal LMs by name or offline alias, with or without a trained phrase encoder."""

from __future__ import annotations

import gc
import json
import logging
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .data.assets import resolve_model
from .hardware.attention import use_grouped_attention
from .hardware.packed_linear import pack_linear_layers
from .io.atomic import recover
from .model import DynamicVocabLM

__all__ = ["LM_ADAPTER", "LM_WEIGHTS", "SHIPPED_CHECKPOINTS", "SHIPPED_ENCODER", "SHIPPED_MWT", "freeze_loaded_objects",
           "load_dynamic_lm", "load_lm"]

logger = logging.getLogger(__name__)

#: where a trainer export keeps the LM's LoRA adapter (``mode="lora"``) or its weights (``mode="full"``)
LM_ADAPTER, LM_WEIGHTS = "lm_adapter", "lm_weights"
#: what marks a folder as a peft adapter rather than a model
ADAPTER_CONFIG = "adapter_config.json"

#: trained checkpoints that ship inside the package (wheel package data), so the demo starts at once
SHIPPED_CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
#: a phrase encoder trained by `dynvocab train` (settings in its train_config.json)
SHIPPED_ENCODER = SHIPPED_CHECKPOINTS / "smollm2-wikipedia"
#: the multi-word-token baseline trained by `dynvocab train-mwt`
SHIPPED_MWT = SHIPPED_CHECKPOINTS / "smollm2-wikipedia-mwt"


def load_lm(name: str) -> tuple[torch.nn.Module, object]:
    """The causal LM (float32, eval mode) and its tokenizer, by Hub name, path or offline alias; a folder holding a
    peft LoRA adapter (``dynvocab finetune-lm`` writes one) is its base LM with the adapter folded in.

    Its linear layers run on prepacked weights at CPU inference (:mod:`dynvocab.hardware.packed_linear`); training and
    GPUs take torch's own path. An LM on SDPA attends over grouped key/value heads without copying them out
    (:mod:`dynvocab.hardware.attention`).
    """
    path = resolve_model(name)
    adapter = Path(path) / ADAPTER_CONFIG
    if adapter.is_file():
        from peft import PeftModel

        base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if not base:
            raise ValueError(f"{adapter} names no base_model_name_or_path: the adapter cannot say which LM it adapts; "
                             "set it to the LM's Hub name, path or offline alias")
        base = resolve_model(base)
        tokenizer = AutoTokenizer.from_pretrained(base)
        lm = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        lm = PeftModel.from_pretrained(lm, path).merge_and_unload().eval()
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pack_linear_layers(lm)
    use_grouped_attention(lm)
    return lm, tokenizer


def load_dynamic_lm(name: str, checkpoint: str | Path | None) -> DynamicVocabLM:
    """The LM with a trained phrase encoder (and the LM's LoRA adapter or weights, if they trained)."""
    if checkpoint is None:
        logger.warning("no phrase-encoder checkpoint given: phrases are encoded by an untrained encoder")
        lm, tokenizer = load_lm(name)
        return DynamicVocabLM.from_causal_lm(lm, tokenizer).eval()
    checkpoint = Path(checkpoint)
    recover(checkpoint)
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"checkpoint {str(checkpoint)!r} does not exist; pass a folder `dynvocab train` wrote")
    mode = _trained_mode(checkpoint)
    full, adapter = checkpoint / LM_WEIGHTS, checkpoint / LM_ADAPTER
    needed = {"full": full, "lora": adapter}.get(mode)
    if needed is not None and not needed.is_dir():
        raise ValueError(
            f"{checkpoint} was trained with mode={mode!r} but has no {needed.name}/ folder: without it the LM would "
            "run without what it learned; use a complete checkpoint of that run"
        )
    lm, tokenizer = load_lm(str(full) if full.is_dir() else name)
    if adapter.is_dir():
        from peft import PeftModel

        lm = PeftModel.from_pretrained(lm, adapter).merge_and_unload()  # inference: the adapter folded into the weights
    return DynamicVocabLM.from_pretrained(checkpoint, lm, tokenizer).eval()


def _trained_mode(checkpoint: Path) -> str | None:
    """The ``mode`` recorded in the checkpoint's ``train_config.json`` (None for a plain ``save_pretrained`` folder)."""
    path = checkpoint / "train_config.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("mode")
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is corrupted ({error}); use a complete checkpoint") from error


def freeze_loaded_objects() -> None:
    """Collect garbage, then leave every object alive now out of Python's cyclic garbage collector (``gc.freeze``).

    Call it once the model, tokenizer and index are loaded, before serving or timing requests. A loaded stack holds
    some 400,000 objects the collector tracks, and each full collection walks them all: 215 ms on a 2-core CPU, inside
    about one demo request in ten (``results/request-path/gc-pauses/``). Frozen objects are still freed when nothing refers to
    them; only reference cycles among them stay until ``gc.unfreeze()``. The command line, the server and the
    evaluations call it after loading.
    """
    gc.collect()
    gc.freeze()
