"""MAUVE between generated and human texts, on features computed by a local model.

``mauve_score`` is the metric: it takes precomputed ``(n, d)`` features and calls
mauve-text's ``compute_mauve(p_features=..., q_features=...)`` once per seed (the
seed drives PCA and k-means), with the paper's scaling factor 2.0 by default.
The featurizers are the optional step that computes the features; each loads what
it is given and keeps nothing global:

* ``causal_lm_features``: final hidden state of the last non-pad token of a causal
  LM (what MAUVE does with gpt2-large); works offline with SmolLM2.
* ``sentence_embedding_features`` / ``minilm_features``: mean-pooled encoder states.
* ``gpt2_large_features``: MAUVE's default featurizer, loaded by name (needs the Hub).

mauve-text is GPL-3.0 and an optional extra: ``pip install dynvocab[evals]``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from dynvocab.tokens.padding import last_token_index, pad_id, pad_sequences

from . import _lm

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Features:
    """``values`` is float32 ``(n, d)``, one row per text; the rest says how it was made."""

    values: np.ndarray
    featurizer: str
    max_tokens: int | None


@dataclass(frozen=True)
class MauveResult:
    """MAUVE mean and std (ddof=1; 0 for one seed) over ``seeds``, and the settings that produced it.

    ``mauve_star`` is the smoothed variant (Pillutla et al., JMLR 2023), averaged the same way.
    """

    mauve: float
    mauve_std: float
    scores: tuple[float, ...]
    frontier_integral: float
    featurizer: str
    max_tokens: int | None
    scaling_factor: float
    num_p: int
    num_q: int
    num_buckets: int
    seeds: tuple[int, ...]
    kmeans_explained_var: float = 0.9
    kmeans_num_redo: int = 5
    kmeans_max_iter: int = 500
    mauve_star: float = float("nan")


@dataclass(frozen=True)
class MauveGain:
    """MAUVE ×100 of a system minus its baseline's on the same prompts, and a paired permutation test of it.

    ``p_value`` is one-sided: the share of ``permutations`` (plus the observed split) in which swapping the two
    systems' texts at random prompts gives a gain at least ``gain``. ``null_low``/``null_high`` are the 2.5th and
    97.5th percentiles of the gain under those swaps: how far apart two systems that write alike land by chance.
    """

    gain: float
    p_value: float
    null_low: float
    null_high: float
    permutations: int


def _import_mauve():
    try:
        import mauve
    except ImportError as err:
        raise ImportError(
            "MAUVE needs the optional package mauve-text (GPL-3.0): pip install dynvocab[evals]"
        ) from err
    return mauve


def _as_array(features, name: str) -> np.ndarray:
    try:
        values = np.asarray(features.values if isinstance(features, Features) else features, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"{name} must be an (n, d) array of feature vectors (e.g. from causal_lm_features), got "
            f"{type(features).__name__}; featurize the texts first"
        ) from error
    if values.ndim != 2 or values.shape[0] < 2:
        raise ValueError(f"{name} must be an (n, d) array with n >= 2, got shape {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError(f"{name} contains nan or inf; check the featurizer's inputs")
    return values


def _describe(p, q, featurizer: str | None, max_tokens: int | None) -> tuple[str, int | None]:
    meta = {(f.featurizer, f.max_tokens) for f in (p, q) if isinstance(f, Features)}
    if len(meta) > 1:
        raise ValueError(f"p and q features come from different featurizers or truncations: {sorted(meta, key=str)}")
    if meta:
        return meta.pop()
    return featurizer or "precomputed", max_tokens


def mauve_score(
    p_features: Features | np.ndarray,
    q_features: Features | np.ndarray,
    *,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    scaling_factor: float = 2.0,
    num_buckets: int | str = "auto",
    kmeans_explained_var: float = 0.9,
    kmeans_num_redo: int = 5,
    kmeans_max_iter: int = 500,
    featurizer: str | None = None,
    max_tokens: int | None = None,
) -> MauveResult:
    """MAUVE of p (e.g. generations, ``(n_p, d)``) against q (e.g. references, ``(n_q, d)``).

    ``num_buckets="auto"`` is mauve-text's ``max(2, round(min(n_p, n_q) / 10))``.
    ``featurizer``/``max_tokens`` only label plain arrays; ``Features`` carry their own.
    """
    mauve = _import_mauve()
    p, q = _as_array(p_features, "p_features"), _as_array(q_features, "q_features")
    if p.shape[1] != q.shape[1]:
        raise ValueError(f"p_features has dim {p.shape[1]} but q_features has dim {q.shape[1]}; use one featurizer")
    if not seeds:
        raise ValueError("seeds is empty; pass at least one seed, e.g. seeds=(0,)")
    if scaling_factor <= 0:
        raise ValueError(f"scaling_factor must be > 0, got {scaling_factor}")
    name, max_tokens = _describe(p_features, q_features, featurizer, max_tokens)
    outs = []
    for seed in seeds:
        outs.append(
            mauve.compute_mauve(
                p_features=p,
                q_features=q,
                num_buckets=num_buckets,
                kmeans_explained_var=kmeans_explained_var,
                kmeans_num_redo=kmeans_num_redo,
                kmeans_max_iter=kmeans_max_iter,
                mauve_scaling_factor=scaling_factor,
                seed=int(seed),
                verbose=False,
            )
        )
        logger.debug("mauve seed %d: %.4f", seed, outs[-1].mauve)
    scores = np.array([float(out.mauve) for out in outs])
    return MauveResult(
        mauve=float(scores.mean()),
        mauve_std=float(scores.std(ddof=1)) if len(scores) > 1 else 0.0,
        scores=tuple(scores.tolist()),
        frontier_integral=float(np.mean([out.frontier_integral for out in outs])),
        featurizer=name,
        max_tokens=max_tokens,
        scaling_factor=float(scaling_factor),
        num_p=p.shape[0],
        num_q=q.shape[0],
        num_buckets=int(outs[0].num_buckets),
        seeds=tuple(int(s) for s in seeds),
        kmeans_explained_var=kmeans_explained_var,
        kmeans_num_redo=kmeans_num_redo,
        kmeans_max_iter=kmeans_max_iter,
        mauve_star=float(np.mean([out.mauve_star for out in outs])),
    )


def _tokenize(tokenizer, texts: Sequence[str], max_tokens: int | None) -> list[list[int]]:
    if isinstance(texts, str):
        raise TypeError("texts must be a list of str, got a single str; wrap it in a list: [text]")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be None or >= 1, got {max_tokens}")
    encoded = []
    for index, text in enumerate(texts):
        ids = list(tokenizer(text)["input_ids"])[:max_tokens]
        if not ids:
            raise ValueError(f"texts[{index}] = {text!r} has no tokens; drop empty texts before featurizing")
        encoded.append(ids)
    return encoded


def _model_name(model, fallback: str) -> str:
    config_name = getattr(getattr(model, "config", None), "_name_or_path", "")
    return getattr(model, "name_or_path", "") or config_name or fallback


def _batched_states(model, tokenizer, texts, max_tokens, batch_size, side, pool: str, desc: str) -> np.ndarray:
    """Run ``model`` over ``texts``; ``pool`` is "last" (last non-pad token of the final layer) or "mean"."""
    encoded = _tokenize(tokenizer, texts, max_tokens)
    rows = []
    with _lm.eval_mode(model):
        show = logger.isEnabledFor(logging.INFO)
        for start in tqdm(range(0, len(encoded), batch_size), desc=desc, disable=not show):
            ids, mask = pad_sequences(encoded[start : start + batch_size], pad_id(tokenizer), side)
            states = _lm.forward(model, ids, mask, output_hidden_states=True).hidden_states[-1].float()
            mask = mask.to(states.device)
            if pool == "last":
                rows.append(states[torch.arange(len(ids)), last_token_index(mask)])
            else:
                weights = mask.unsqueeze(-1).to(states.dtype)
                rows.append((states * weights).sum(1) / weights.sum(1))
    return torch.cat(rows).cpu().numpy().astype(np.float32)


def causal_lm_features(
    texts: Sequence[str],
    model: str | PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    max_tokens: int | None = 1024,
    batch_size: int = 8,
    padding_side: str | None = None,
    device: str | torch.device | None = None,
) -> Features:
    """Final-layer hidden state of each text's last (non-pad) token: ``(len(texts), hidden_size)``.

    ``model`` is a causal LM object or a name/path (loaded with ``AutoModelForCausalLM``);
    texts are tokenised with the tokenizer's special tokens and cut to the first ``max_tokens``.
    """
    model, tokenizer = _lm.load(model, tokenizer, "AutoModelForCausalLM")
    if device is not None:
        model = model.to(device)
    side = _lm.check_side(padding_side, tokenizer)
    values = _batched_states(model, tokenizer, texts, max_tokens, batch_size, side, "last", "featurize (lm)")
    return Features(values, _model_name(model, "causal-lm") + ":last-token", max_tokens)


def sentence_embedding_features(
    texts: Sequence[str],
    model: str | PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    max_tokens: int | None = 256,
    batch_size: int = 32,
    device: str | torch.device | None = None,
) -> Features:
    """Mean over non-pad tokens of an encoder's last hidden states: ``(len(texts), hidden_size)``.

    ``model`` is an encoder object or a name/path loaded with ``AutoModel`` (sentence-transformers' mean pooling).
    """
    model, tokenizer = _lm.load(model, tokenizer, "AutoModel")
    if device is not None:
        model = model.to(device)
    values = _batched_states(model, tokenizer, texts, max_tokens, batch_size, "right", "mean", "featurize (enc)")
    return Features(values, _model_name(model, "encoder") + ":mean-pool", max_tokens)


def minilm_features(texts: Sequence[str], *, max_tokens: int | None = 256, batch_size: int = 32) -> Features:
    """``sentence_embedding_features`` with the offline all-MiniLM-L6-v2 folder from ``dynvocab.data.assets``."""
    from dynvocab.data.assets import minilm_dir

    features = sentence_embedding_features(texts, str(minilm_dir()), max_tokens=max_tokens, batch_size=batch_size)
    return Features(features.values, "all-MiniLM-L6-v2:mean-pool", max_tokens)


def gpt2_large_features(
    texts: Sequence[str],
    *,
    model_name: str = "gpt2-large",
    max_tokens: int | None = 1024,
    batch_size: int = 8,
    device: str | torch.device | None = None,
) -> Features:
    """MAUVE's reference featurizer: ``causal_lm_features`` with gpt2-large loaded by name (needs the Hub)."""
    return causal_lm_features(texts, model_name, max_tokens=max_tokens, batch_size=batch_size, device=device)


def paired_mauve_gain(
    reference: Features | np.ndarray,
    system: Features | np.ndarray,
    baseline: Features | np.ndarray,
    *,
    seeds: Sequence[int] = (0,),
    permutations: int = 100,
    seed: int = 0,
) -> MauveGain:
    """Is ``system``'s MAUVE against ``reference`` above ``baseline``'s by more than chance?

    All three are ``(n, d)`` features in prompt order; row ``i`` of ``system`` and ``baseline`` continues one prompt.
    The seed spread of ``mauve_score`` measures k-means alone; this test also draws which texts each system wrote, by
    swapping the two systems' rows at random prompts, and scores every split with the same ``seeds``.
    """
    if permutations < 1:
        raise ValueError(f"permutations={permutations}; pass at least 1, e.g. 100")
    reference = _as_array(reference, "reference")
    system, baseline = _as_array(system, "system"), _as_array(baseline, "baseline")
    if system.shape != baseline.shape:
        raise ValueError(f"system {system.shape} and baseline {baseline.shape} features must pair row by row: "
                         "featurize both systems' texts of the same prompts")

    def gain(first: np.ndarray, second: np.ndarray) -> float:
        first_score, second_score = (mauve_score(reference, f, seeds=seeds).mauve for f in (first, second))
        return 100 * (first_score - second_score)

    observed = gain(system, baseline)
    rng = np.random.default_rng(seed)
    null = []
    for _ in tqdm(range(permutations), desc="MAUVE permutations", leave=False):
        swap = rng.random(len(system)) < 0.5
        null.append(gain(np.where(swap[:, None], baseline, system), np.where(swap[:, None], system, baseline)))
    low, high = np.percentile(null, [2.5, 97.5])
    p_value = (1 + sum(g >= observed for g in null)) / (1 + permutations)
    return MauveGain(gain=observed, p_value=float(p_value), null_low=float(low), null_high=float(high),
                     permutations=permutations)
