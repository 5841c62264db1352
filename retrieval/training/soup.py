"""Weight averages of fine-tuned document encoders: a uniform model soup, and its interpolation toward the encoder they
all started from (WiSE-FT).

Contrastive fine-tuning runs that start from the same encoder and differ only in their seed end in one basin of the
loss, so the mean of their weights is itself a good encoder, usually better than each run (Wortsman et al., 2022,
"Model soups"). Mixing some of the starting weights back in keeps more of what the starting encoder knew, which
fine-tuning on one kind of query loses on another (Wortsman et al., 2022, "Robust fine-tuning of zero-shot models").

Hybrid encoders (``finetune-encoder --encoder hybrid``) soup the same way: every weight of the masked LM and the
dense projection is averaged, and so is the fusion weight. Only the body (the transformer) and the projection are mixed
with the base, whose projection counts as the identity: the MLM head that makes the sparse part is learned in
fine-tuning (MiniLM ships none), so the base has no head worth mixing in.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from dynvocab.data.assets import resolve_model
from dynvocab.io.atomic import atomic_directory

__all__ = ["soup_encoders"]


def soup_encoders(encoders: Sequence[str | Path], output: str | Path, base: str | Path | None = None,
                  base_weight: float = 0.0) -> Path:
    """Write ``(1 - base_weight) * mean(encoders) + base_weight * base`` into ``output``; returns it.

    Args:
        encoders: encoder folders of one architecture (``dynvocab finetune-encoder`` outputs, all dense or all
            hybrid), averaged with equal weights.
        base: the encoder they were fine-tuned from (a name such as ``"minilm"`` or a folder); needed when
            ``base_weight > 0``.
        base_weight: the share of ``base``'s weights in the result, in ``[0, 1)``.
    """
    from transformers import AutoModel, AutoTokenizer

    _check_soup(encoders, base, base_weight)
    if _is_hybrid(encoders[0]):
        return _soup_hybrids(encoders, output, base, base_weight)
    tokenizer = next((path for path in [*encoders, base] if path is not None and _has_tokenizer(path)), None)
    if tokenizer is None:
        raise ValueError(f"neither the encoders {list(map(str, encoders))} nor the base hold a tokenizer; save one "
                         "beside the weights (finetune-encoder does) or pass base=")
    sources = [*encoders, base] if base_weight else list(encoders)
    models = [AutoModel.from_pretrained(resolve_model(str(path))) for path in sources]
    weights = [(1.0 - base_weight) / len(encoders)] * len(encoders) + ([base_weight] if base_weight else [])
    states = [model.state_dict() for model in models]
    _check_shapes(sources, states, encoders[0])
    mixed = {name: _mix([state[name] for state in states], weights) for name in states[0]}
    models[0].load_state_dict(mixed)
    with atomic_directory(output) as staging:
        models[0].save_pretrained(staging)
        AutoTokenizer.from_pretrained(resolve_model(str(tokenizer))).save_pretrained(staging)
    return Path(output)


def _check_soup(encoders: Sequence[str | Path], base: str | Path | None, base_weight: float) -> None:
    if not encoders:
        raise ValueError("soup_encoders needs at least one encoder folder; pass the fine-tuned runs' final folders")
    if not 0.0 <= base_weight < 1.0 or (base_weight > 0 and base is None):
        raise ValueError(f"base_weight={base_weight} must be in [0, 1), and base must be given when it is above 0")


def _check_shapes(sources: Sequence[str | Path | None], states: list[dict[str, torch.Tensor]], first: str | Path) -> None:
    for path, state in zip(sources[1:], states[1:]):
        if {k: v.shape for k, v in state.items()} != {k: v.shape for k, v in states[0].items()}:
            raise ValueError(f"{path} does not have the architecture of {first} (other weights or shapes); "
                             "soup only encoders fine-tuned from the same one")


def _is_hybrid(path: str | Path) -> bool:
    from encoders.hybrid import CONFIG_FILE

    return (Path(resolve_model(str(path))) / CONFIG_FILE).is_file()


def _soup_hybrids(encoders: Sequence[str | Path], output: str | Path, base: str | Path | None, base_weight: float) -> Path:
    """The soup of hybrid encoders; with a base, its body and (identity) projection are mixed in by ``base_weight``."""
    from encoders.hybrid import HybridEncoder

    if not all(_is_hybrid(path) for path in encoders):
        odd = next(path for path in encoders if not _is_hybrid(path))
        raise ValueError(f"{odd} is not a hybrid encoder folder, but {encoders[0]} is; soup only encoders of one kind")
    parts = [HybridEncoder.from_pretrained(resolve_model(str(path))) for path in encoders]
    first = parts[0]
    for path, part in zip(encoders[1:], parts[1:]):
        if (part.config.dense_dim, part.config.pooling) != (first.config.dense_dim, first.config.pooling):
            raise ValueError(f"{path} has another dense part ({part.config.label}) than {encoders[0]} "
                             f"({first.config.label}); soup only encoders fine-tuned alike")
    states = [{**part.model.state_dict(), **{f"projection.{k}": v for k, v in part.projection.state_dict().items()}}
              for part in parts]
    _check_shapes(encoders, states, encoders[0])
    mixed = {name: _mix([state[name] for state in states], [1.0 / len(parts)] * len(parts)) for name in states[0]}
    if base_weight:
        if first.config.dense_dim != first.model.config.hidden_size:
            raise ValueError(f"{encoders[0]} projects to {first.config.dense_dim} dims, not its hidden size "
                             f"{first.model.config.hidden_size}, so the base has no projection to mix in; soup without "
                             "--base, or fine-tune with --dense_dim equal to the hidden size (an identity start)")
        start = HybridEncoder.from_pretrained(resolve_model(str(base)), dense_dim=first.config.dense_dim,
                                              pooling=first.config.pooling)
        body = {f"{first.model.base_model_prefix}.{k}": v for k, v in start.model.base_model.state_dict().items()}
        body |= {f"projection.{k}": v for k, v in start.projection.state_dict().items()}
        missing = [name for name in body if name not in mixed or mixed[name].shape != body[name].shape]
        if missing:
            raise ValueError(f"{base} does not have the body of {encoders[0]} ({missing[0]} differs); pass the encoder "
                             "the hybrids were fine-tuned from")
        for name, tensor in body.items():
            mixed[name] = _mix([mixed[name], tensor], [1.0 - base_weight, base_weight])
        for names in _tied(first.model.state_dict()):  # the MLM decoder tied to the word embeddings follows them
            body_name = next((name for name in names if name in body), names[0])
            mixed.update({name: mixed[body_name] for name in names})
    first.model.load_state_dict({k: v for k, v in mixed.items() if not k.startswith("projection.")})
    first.projection.load_state_dict({k.removeprefix("projection."): v for k, v in mixed.items()
                                      if k.startswith("projection.")})
    soup = first.with_sparse_weight(sum(part.config.sparse_weight for part in parts) / len(parts))
    with atomic_directory(output) as staging:
        soup.save_pretrained(staging)
    return Path(output)


def _tied(state: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names of ``state`` that share one tensor (tied weights), in groups of two or more."""
    groups: dict[int, list[str]] = {}
    for name, tensor in state.items():
        groups.setdefault(tensor.data_ptr(), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


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
