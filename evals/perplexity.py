"""Perplexity of texts under a scorer causal LM, optionally conditioned on a prefix.

Two steps, as for every metric here: ``token_logprobs`` runs the model and returns the
log-probability of each scored token; ``perplexity_from_logprobs`` turns those into
numbers. ``perplexity`` does both.

Tokenisation: prefix and text are tokenised separately (``add_special_tokens=False``)
and concatenated, so the scored tokens are exactly the text's own tokens and none of
the prefix's. Without a prefix, the tokenizer's BOS id (else its EOS id) is prepended
as context when ``prepend_bos`` is set, so that the first token is scored too
(lm-evaluation-harness does the same); with neither, the first token is context only.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from dynvocab.tokens.padding import pad_id, pad_sequences

from . import _lm

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PerplexityResult:
    """Token-pooled perplexity ``exp(total_nll / num_tokens)`` plus the counts behind it (nll in nats)."""

    perplexity: float
    mean_nll: float
    total_nll: float
    num_tokens: int
    num_texts: int
    mean_tokens: float
    mean_text_perplexity: float


def _context_ids(tokenizer, prefix: str | None, prepend_bos: bool) -> list[int]:
    if prefix:
        return list(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    if not prepend_bos:
        return []
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return [] if start is None else [int(start)]


def _fit(context: list[int], target: list[int], max_length: int | None) -> tuple[list[int], list[int]]:
    """Cut context from the left (keeping one token when there is one), then target from the right."""
    if max_length is None or len(context) + len(target) <= max_length:
        return context, target
    target = target[: max_length - min(len(context), 1)]
    keep = max_length - len(target)
    return context[len(context) - keep :], target


def _encode(tokenizer, texts, prefixes, prepend_bos, max_length) -> list[tuple[list[int], list[int]]]:
    pairs = []
    for text, prefix in zip(texts, prefixes):
        target = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        pairs.append(_fit(_context_ids(tokenizer, prefix, prepend_bos), target, max_length))
    return pairs


def _score_batch(model, pairs, pad_value: int, side: str) -> list[np.ndarray]:
    """Log-probs of the target tokens of each ``(context, target)`` pair, shape ``(len(target),)`` each."""
    ids, mask = pad_sequences([c + t for c, t in pairs], pad_value, side)
    scored, _ = pad_sequences([[0] * len(c) + [1] * len(t) for c, t in pairs], 0, side)
    logits = _lm.forward(model, ids, mask).logits[:, :-1].float()
    labels = ids[:, 1:].to(logits.device)
    logprobs = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    keep = scored[:, 1:].bool()
    return [logprobs[row][keep[row].to(logprobs.device)].cpu().double().numpy() for row in range(len(pairs))]


def token_logprobs(
    model: str | PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    texts: Sequence[str],
    *,
    prefixes: Sequence[str | None] | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    prepend_bos: bool = True,
    padding_side: str | None = None,
    show_progress_bar: bool | None = None,
) -> list[np.ndarray]:
    """Natural-log probability of every scored token of each text: a list of ``(num_scored_i,)`` float64 arrays.

    ``model`` is a ``PreTrainedModel`` (causal LM) or a name/path to load with
    ``AutoModelForCausalLM``; ``padding_side`` defaults to the tokenizer's and does not
    change the result. ``max_length`` caps context + text tokens per row.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a list of str, got a single str; wrap it in a list: [text]")
    if prefixes is not None and len(prefixes) != len(texts):
        raise ValueError(f"prefixes has {len(prefixes)} items but texts has {len(texts)}; pass one prefix per text")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be None or >= 2, got {max_length}")
    model, tokenizer = _lm.load(model, tokenizer, "AutoModelForCausalLM")
    pairs = _encode(tokenizer, texts, prefixes or [None] * len(texts), prepend_bos, max_length)
    return pair_logprobs(model, tokenizer, pairs, batch_size=batch_size, padding_side=padding_side,
                         show_progress_bar=show_progress_bar)


def pair_logprobs(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[tuple[list[int], list[int]]],
    *,
    batch_size: int = 8,
    padding_side: str | None = None,
    show_progress_bar: bool | None = None,
) -> list[np.ndarray]:
    """``token_logprobs`` of token ids: each ``(context, target)`` pair's target tokens scored after its context
    (a list of ``(len(target),)`` float64 arrays), for contexts a string prefix cannot give exactly (documents
    tokenized as an LM read them)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    side = _lm.check_side(padding_side, tokenizer)
    if show_progress_bar is None:
        show_progress_bar = logger.isEnabledFor(logging.INFO)
    out: list[np.ndarray] = []
    with _lm.eval_mode(model):
        for start in tqdm(range(0, len(pairs), batch_size), desc="perplexity", disable=not show_progress_bar):
            out.extend(_score_batch(model, pairs[start : start + batch_size], pad_id(tokenizer), side))
    return out


def perplexity_from_logprobs(logprobs: Sequence[np.ndarray | Sequence[float]]) -> PerplexityResult:
    """Aggregate per-token log-probs (natural log), one array per text; texts with no scored token are skipped."""
    arrays = [np.asarray(lp, dtype=np.float64) for lp in logprobs]
    arrays = [lp for lp in arrays if lp.size > 0]
    if not arrays:
        raise ValueError("no scored tokens: every text is empty after tokenisation (or truncation)")
    num_tokens = sum(lp.size for lp in arrays)
    total_nll = float(-sum(lp.sum() for lp in arrays))
    mean_nll = total_nll / num_tokens
    return PerplexityResult(
        perplexity=math.exp(mean_nll),
        mean_nll=mean_nll,
        total_nll=total_nll,
        num_tokens=num_tokens,
        num_texts=len(arrays),
        mean_tokens=num_tokens / len(arrays),
        mean_text_perplexity=float(np.mean([math.exp(-lp.mean()) for lp in arrays])),
    )


def perplexity(
    model: str | PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    texts: Sequence[str],
    *,
    prefixes: Sequence[str | None] | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    prepend_bos: bool = True,
    padding_side: str | None = None,
    show_progress_bar: bool | None = None,
) -> PerplexityResult:
    """Perplexity of ``texts`` (each conditioned on its prefix, if given) under ``model``; see ``token_logprobs``."""
    logprobs = token_logprobs(
        model,
        tokenizer,
        texts,
        prefixes=prefixes,
        batch_size=batch_size,
        max_length=max_length,
        prepend_bos=prepend_bos,
        padding_side=padding_side,
        show_progress_bar=show_progress_bar,
    )
    return perplexity_from_logprobs(logprobs)
