"""A fine-tuned encoder as a small LoRA adapter on the encoder it started from.

Fine-tuning moves each weight matrix by a difference whose spectrum falls fast, so the best rank-``r`` approximation
of it (its truncated SVD) keeps nearly all of the change. Written as a ``peft`` LoRA adapter (``B @ A`` with
``B = U_r S_r`` and ``A = V_r^T``, ``lora_alpha = r`` so the scale is 1), the change ships in a few MB instead of the
whole model, and loads where LoRA adapters load::

    model = PeftModel.from_pretrained(AutoModel.from_pretrained(base), folder).merge_and_unload()

Linear and embedding weights that changed become LoRA pairs; every other module with a changed weight (layer norms)
is saved whole (``modules_to_save``), and so are all biases (``bias="all"``).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import PreTrainedModel

__all__ = ["ADAPTER_CONFIG", "adapter_base", "is_adapter", "load_merged", "low_rank_adapter"]

ADAPTER_CONFIG = "adapter_config.json"


def low_rank_adapter(base: PreTrainedModel, tuned: PreTrainedModel, rank: int,
                     dtype: torch.dtype = torch.float16) -> tuple[PeftModel, dict[str, float]]:
    """A LoRA adapter on a copy of ``base`` whose merged weights approximate ``tuned``'s; and, per adapted module,
    the relative Frobenius error ``||rank-r approximation - difference|| / ||tuned weight||`` it leaves.

    Args:
        base: the encoder fine-tuning started from (left unchanged).
        tuned: an encoder of the same architecture.
        rank: the largest rank of each difference kept (a smaller matrix keeps at most its smaller side).
        dtype: the adapter's stored dtype (float16 halves the file; the error reported includes its rounding).
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank={rank!r} must be a positive int, e.g. 64")
    tuned_state = tuned.state_dict()
    base_state = base.state_dict()
    if {k: v.shape for k, v in tuned_state.items()} != {k: v.shape for k, v in base_state.items()}:
        raise ValueError(f"{type(tuned).__name__} does not have the weights of {type(base).__name__} (other names or "
                         "shapes); pass the encoder it was fine-tuned from as the base")
    targets, whole, ranks = [], [], {}
    for name, module in base.named_modules():
        own = [f"{name}.{key}" if name else key for key, _ in module.named_parameters(recurse=False)]
        if not own or all(torch.equal(base_state[key], tuned_state[key]) for key in own):
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)):
            targets.append(name)
            if min(module.weight.shape) < rank:
                ranks[name] = min(module.weight.shape)
        else:
            whole.append(name)
    if not targets and not whole:
        raise ValueError("the tuned encoder has the base's weights; there is no difference to keep")
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, modules_to_save=whole or None, bias="all",
                        rank_pattern=ranks, alpha_pattern=dict(ranks), lora_dropout=0.0)
    model = get_peft_model(copy.deepcopy(base), config)
    errors = {}
    with torch.no_grad():
        for name in targets:
            errors[name] = _set_low_rank(model.base_model.model.get_submodule(name), base_state[f"{name}.weight"],
                                         tuned_state[f"{name}.weight"], dtype)
        for key, value in tuned_state.items():
            if key.endswith("bias") and key.rpartition(".")[0] not in whole:
                _parameter(model, key).copy_(value)
        for name in whole:
            wrapper = model.base_model.model.get_submodule(name)
            wrapper.modules_to_save["default"].load_state_dict(tuned.get_submodule(name).state_dict())
    return model, errors


def _set_low_rank(layer: nn.Module, base: torch.Tensor, tuned: torch.Tensor, dtype: torch.dtype) -> float:
    """Write the truncated SVD of ``tuned - base`` into ``layer``'s LoRA pair; returns the relative error left."""
    embedding = hasattr(layer, "lora_embedding_A") and "default" in layer.lora_embedding_A
    difference = (tuned - base).double()
    # LoRA adds B @ A to a linear weight (out, in) and (B @ A).T to an embedding table (rows, dim).
    u, s, vh = torch.linalg.svd(difference.T if embedding else difference, full_matrices=False)
    r = layer.r["default"]
    first, second = (u[:, :r] * s[:r]).to(dtype), vh[:r].to(dtype)
    if embedding:
        layer.lora_embedding_B["default"].data = first.to(layer.lora_embedding_B["default"].dtype)
        layer.lora_embedding_A["default"].data = second.to(layer.lora_embedding_A["default"].dtype)
    else:
        layer.lora_B["default"].weight.data = first.to(layer.lora_B["default"].weight.dtype)
        layer.lora_A["default"].weight.data = second.to(layer.lora_A["default"].weight.dtype)
    kept = (first.double() @ second.double())
    return float((kept - (difference.T if embedding else difference)).norm() / tuned.double().norm())


def _parameter(model: PeftModel, key: str) -> torch.Tensor:
    """The bias ``key`` of the unwrapped model inside ``model`` (a LoRA layer keeps it in its ``base_layer``)."""
    module_name, _, attribute = key.rpartition(".")
    module = model.base_model.model.get_submodule(module_name)
    return getattr(getattr(module, "base_layer", module), attribute)


def is_adapter(folder: str | Path) -> bool:
    """A folder written by ``PeftModel.save_pretrained`` (an ``adapter_config.json``, no full weights needed)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> str:
    """The name or path of the model the adapter in ``folder`` was made for."""
    return json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8"))["base_model_name_or_path"]


def load_merged(base: PreTrainedModel, folder: str | Path) -> PreTrainedModel:
    """``base`` with the adapter in ``folder`` merged into its weights: a plain model again, as fast as ``base``."""
    return PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
