"""Small helpers shared by the model-based metrics: loading, padding, position ids, eval mode."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator

import torch

from dynvocab.tokens.padding import position_ids_from_mask

logger = logging.getLogger(__name__)

_SIDES = ("left", "right")


def load(model, tokenizer, auto_class_name: str):
    """Return ``(model, tokenizer)``; a str ``model`` is loaded with ``transformers.<auto_class_name>``."""
    import transformers

    if isinstance(model, str):
        logger.info("loading %s from %s", auto_class_name, model)
        model = getattr(transformers, auto_class_name).from_pretrained(model)
        if tokenizer is None:
            tokenizer = transformers.AutoTokenizer.from_pretrained(model.name_or_path)
    if tokenizer is None:
        raise ValueError("tokenizer is None: pass the tokenizer that goes with the model object")
    return model, tokenizer


def check_side(padding_side: str | None, tokenizer) -> str:
    """Resolve ``padding_side`` (``None`` means the tokenizer's own)."""
    side = padding_side if padding_side is not None else getattr(tokenizer, "padding_side", "right")
    if side not in _SIDES:
        raise ValueError(f"padding_side must be 'left', 'right' or None, got {padding_side!r}")
    return side


def forward(model, ids: torch.Tensor, mask: torch.Tensor, **kwargs):
    """Run ``model`` on a padded batch, passing explicit position ids when its forward takes them."""
    device = next(model.parameters()).device
    inputs = {"input_ids": ids.to(device), "attention_mask": mask.to(device), **kwargs}
    if "position_ids" in inspect.signature(model.forward).parameters:
        inputs["position_ids"] = position_ids_from_mask(mask).to(device)
    return model(**inputs)


@contextlib.contextmanager
def eval_mode(model) -> Iterator[None]:
    """Put ``model`` in eval mode without gradients, then restore its training flag."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)
