"""Weight averages of fine-tuned document encoders: a uniform model soup, and its interpolation toward the encoder they
all started from (WiSE-FT).

Contrastive fine-tuning runs that start from the same encoder and differ only in their seed end in one basin of the
loss, so the mean of their weights is itself a good encoder, usually better than each run (Wortsman et al., 2022,
"Model soups"). Mixing some of the starting weights back in keeps more of what the starting encoder knew, which
fine-tuning on one kind of query loses on another (Wortsman et al., 2022, "Robust fine-tuning of zero-shot models").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from dynvocab.assets import resolve_model
from dynvocab.atomic import atomic_directory

__all__ = ["soup_encoders"]


def soup_encoders(encoders: Sequence[str | Path], output: str | Path, base: str | Path | None = None,
                  base_weight: float = 0.0) -> Path:
    """Write ``(1 - base_weight) * mean(encoders) + base_weight * base`` into ``output``; returns it.

    Args:
        encoders: Hugging Face encoder folders of one architecture (``dynvocab finetune-encoder --encoder dense``
            outputs), averaged with equal weights.
        base: the encoder they were fine-tuned from (a name such as ``"minilm"`` or a folder); needed when
            ``base_weight > 0``.
        base_weight: the share of ``base``'s weights in the result, in ``[0, 1)``.
    """
    from transformers import AutoModel, AutoTokenizer

    if not encoders:
        raise ValueError("soup_encoders needs at least one encoder folder; pass the fine-tuned runs' final folders")
    if not 0.0 <= base_weight < 1.0 or (base_weight > 0 and base is None):
        raise ValueError(f"base_weight={base_weight} must be in [0, 1), and base must be given when it is above 0")
    tokenizer = next((path for path in [*encoders, base] if path is not None and _has_tokenizer(path)), None)
    if tokenizer is None:
        raise ValueError(f"neither the encoders {list(map(str, encoders))} nor the base hold a tokenizer; save one "
                         "beside the weights (finetune-encoder does) or pass base=")
    sources = [*encoders, base] if base_weight else list(encoders)
    models = [AutoModel.from_pretrained(resolve_model(str(path))) for path in sources]
    weights = [(1.0 - base_weight) / len(encoders)] * len(encoders) + ([base_weight] if base_weight else [])
    states = [model.state_dict() for model in models]
    for path, state in zip(sources[1:], states[1:]):
        if {k: v.shape for k, v in state.items()} != {k: v.shape for k, v in states[0].items()}:
            raise ValueError(f"{path} does not have the architecture of {encoders[0]} (other weights or shapes); "
                             "soup only encoders fine-tuned from the same one")
    mixed = {name: _mix([state[name] for state in states], weights) for name in states[0]}
    models[0].load_state_dict(mixed)
    with atomic_directory(output) as staging:
        models[0].save_pretrained(staging)
        AutoTokenizer.from_pretrained(resolve_model(str(tokenizer))).save_pretrained(staging)
    return Path(output)


def _has_tokenizer(path: str | Path) -> bool:
    """A local folder with tokenizer files, or a name the Hub resolves (checked when it loads)."""
    folder = Path(resolve_model(str(path)))
    if not folder.is_dir():
        return True
    return any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"))


def _mix(tensors: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """The weighted sum of float tensors; an integer buffer (position ids) is the first one's."""
    if not tensors[0].is_floating_point():
        return tensors[0]
    return sum(weight * tensor.double() for weight, tensor in zip(weights, tensors)).to(tensors[0].dtype)
