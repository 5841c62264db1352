"""Verified decoding: an emitted phrase is read back as its tokens and kept only as far as the LM agrees.

The forward call that reads a phrase's ``k`` tokens back gives the LM's own scores at
every one of them for free. ``generate_verified`` accepts the longest prefix whose every
token after the first is among the LM's ``accept_top_k`` tokens at its position (a
relaxed acceptance rule like NEST's, Li et al. 2024: ``accept_top_k=1`` keeps only what
greedy decoding of the bare LM would write), drops the rest from the KV cache
(``DynamicCache.crop``) and goes on from the last kept token. Whatever was kept, the step
counts as one. A kept prefix that is itself a phrase of the row's set is emitted as that
phrase; otherwise its tokens are. The LM's scores at each read-back position pass through
``logits_processor`` first, so the safeguards (``no_repeat_ngram_size``, ...) judge a
phrase's tokens as they judge the bare LM's, and ``accept_top_k=1`` stays lossless under them.

``draft`` (e.g. ``dynvocab.drafting.DocumentDrafter.draft``) proposes tokens to follow a
chosen token: they are read back in the same forward call and kept the same way, so a step
that writes a token may write several (speculative decoding with drafts from documents).

It decodes one prompt at a time, like speculative decoding in ``transformers``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

__all__ = ["VerifiedOutput", "draft_step_cost", "forward_seconds", "generate_verified"]


@dataclass
class VerifiedOutput:
    """``sequences`` ``(1, L + n)`` mixed ids (prompt first); ``steps`` decoding steps; ``cut`` phrases and drafts
    cut short."""

    sequences: torch.LongTensor
    steps: int
    cut: int


def _choose(scores: torch.Tensor, do_sample: bool, warpers: LogitsProcessorList, ids: torch.Tensor) -> int:
    """The next id from one row's ``(V + P,)`` scores: the best, or sampled after the warpers (which take batches)."""
    if not do_sample:
        return int(scores.argmax(-1))
    probs = torch.softmax(warpers(ids, scores[None])[0], dim=-1)
    return int(torch.multinomial(probs, 1))


@torch.no_grad()
def generate_verified(
    model,
    input_ids: torch.LongTensor,
    max_new_tokens: int,
    *,
    accept_top_k: int = 3,
    do_sample: bool = False,
    top_p: float = 1.0,
    temperature: float = 1.0,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    eos_token_id: int | None = None,
    row: int | None = None,
    draft: Callable[[list[int]], list[int]] | None = None,
    on_step: Callable[[list[int]], bool] | None = None,
) -> VerifiedOutput:
    """Decode ``max_new_tokens`` steps from ``input_ids`` ``(1, L)`` (token ids) with verified phrases.

    ``model`` is a ``DynamicVocabLM``; ``row`` picks one row's phrase set after per-row
    ``set_phrases`` (default: every phrase). ``logits_processor`` sees the mixed ids and
    the ``(1, V + P)`` scores of each step, like ``generate``'s. ``draft`` maps the text so far as token ids
    (prompt included, the chosen token last) to the tokens proposed after it. ``on_step`` hears the mixed ids each
    step kept (a phrase, a token, or a token and its kept draft), as they are written; returning True ends decoding
    there (a server's stop string, cancellation or token limit).
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"generate_verified decodes one prompt: input_ids must be (1, L), got {tuple(input_ids.shape)}")
    if not isinstance(accept_top_k, int) or accept_top_k < 1:
        raise ValueError(f"accept_top_k must be a positive int, got {accept_top_k!r}")
    vocab, table = model.vocab_size, model.phrase_table
    masks = model.phrase_table.row_masks()
    mask = None if row is None or masks is None else masks[row : row + 1].to(model.device)
    processors = logits_processor or LogitsProcessorList()
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p)] if do_sample else [])
    stopping = stopping_criteria or StoppingCriteriaList()
    eos = model.generation_config.eos_token_id if eos_token_id is None else eos_token_id
    ends = set(eos) if isinstance(eos, list) else set() if eos is None else {eos}
    ids = input_ids.to(model.device)
    text = _spelled(ids[0].tolist(), table, vocab)  # the text so far as token ids, for ``draft``
    cache = DynamicCache()
    logits = model(ids, past_key_values=cache, use_cache=True, phrase_mask=mask, logits_to_keep=1).logits[:, -1]
    steps = cut = 0
    while steps < max_new_tokens:
        scores = processors(ids, logits.float())
        chosen = _choose(scores[0], do_sample, warpers, ids)
        tokens = list(table.token_ids[chosen - vocab]) if chosen >= vocab else [chosen]
        chosen_length = len(tokens)
        if draft is not None and chosen < vocab and chosen not in ends:
            tokens += draft(text + tokens)
        out = model(torch.tensor([tokens], device=ids.device), past_key_values=cache, use_cache=True, phrase_mask=mask)
        kept = _accepted(out.logits[0].float(), tokens, accept_top_k, processors, ids, vocab)
        kept = next((j + 1 for j, t in enumerate(tokens[:kept]) if t in ends), kept)  # nothing after an end of text
        if kept > chosen_length and _stops(stopping, ids, tokens[:kept], scores):  # nor drafted tokens past the stop
            kept = next(j for j in range(chosen_length, kept + 1) if _stops(stopping, ids, tokens[:j], scores))
        if kept < len(tokens):
            cache.crop(kept - len(tokens))  # transformers 5: a negative count removes that many slots
            cut += 1
        whole = chosen if chosen >= vocab and kept == len(tokens) else None
        written = _as_ids(tokens[:kept], whole, table, vocab, mask)
        ids = torch.cat([ids, torch.tensor([written], device=ids.device)], dim=1)
        text += tokens[:kept]
        logits = out.logits[:, kept - 1]
        steps += 1
        heard_enough = on_step is not None and on_step(written)
        if heard_enough or tokens[kept - 1] in ends or _stops(stopping, ids, [], scores):
            break
    return VerifiedOutput(ids, steps, cut)


@torch.no_grad()
def forward_seconds(model, lengths: Sequence[int], context_tokens: int = 64, repeats: int = 5) -> dict[int, float]:
    """Median seconds of the LM's forward call over each of ``lengths`` new tokens after ``context_tokens`` cached
    ones: ``repeats`` rounds after a warm-up round, the lengths in turn and in reverse order every other round. Of a
    ``DynamicVocabLM`` its LM is timed."""
    model = getattr(model, "lm", model)
    device = model.device
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (1, context_tokens + max(lengths)), generator=torch.Generator().manual_seed(0)).to(device)
    cache = DynamicCache()
    model(ids[:, :context_tokens], past_key_values=cache, use_cache=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seconds: dict[int, list[float]] = {n: [] for n in lengths}
    for repeat in range(repeats + 1):
        for n in lengths if repeat % 2 else reversed(lengths):
            sync()
            start = time.perf_counter()
            model(ids[:, context_tokens : context_tokens + n], past_key_values=cache, use_cache=True)
            sync()
            if repeat:  # the first round warms up
                seconds[n].append(time.perf_counter() - start)
            cache.crop(-n)
    return {n: statistics.median(times) for n, times in seconds.items()}


def draft_step_cost(model, draft_tokens: int, context_tokens: int = 64, repeats: int = 5) -> float:
    """What a forward call over a token and ``draft_tokens`` drafted ones costs beyond a call over the token alone,
    in such one-token calls (``forward_seconds``): about 0.3 on a 2-core CPU with the loader's prepacked linear layers
    (0.6 on torch's own MKL path; near 0 expected on a GPU). ``DocumentDrafter(step_cost=...)`` drafts only what is
    expected to save more than that."""
    if draft_tokens < 1:
        raise ValueError(f"draft_tokens={draft_tokens} must be >= 1")
    seconds = forward_seconds(model, (1, draft_tokens + 1), context_tokens, repeats)
    return max(0.0, seconds[draft_tokens + 1] / seconds[1] - 1.0)


def _stops(stopping: StoppingCriteriaList, ids: torch.Tensor, tokens: list[int], scores: torch.Tensor) -> bool:
    """Whether ``stopping`` ends the text ``ids`` followed by ``tokens``."""
    if not len(stopping):
        return False
    return bool(stopping(torch.cat([ids, torch.tensor([tokens], dtype=ids.dtype, device=ids.device)], 1), scores).all())


def _spelled(ids: list[int], table, vocab: int) -> list[int]:
    """Mixed ids as the token ids they spell."""
    return [t for i in ids for t in (table.token_ids[i - vocab] if i >= vocab else (i,))]


def _accepted(lm_logits: torch.Tensor, tokens: list[int], top_k: int, processors: LogitsProcessorList | None = None,
              ids: torch.Tensor | None = None, vocab: int | None = None) -> int:
    """How many of ``tokens`` the LM accepts: the first always, then each while it is in the LM's top-k there.

    ``lm_logits`` ``(k, V [+ P])``: row ``j`` is the LM's scores after ``tokens[j]``, its first ``vocab`` columns
    (default: all) the tokens'. With ``processors`` each row is judged as they leave it, seeing ``ids`` ``(1, L)`` and
    the tokens up to it, one position at a time and only up to the first token refused.
    """
    vocab = vocab or lm_logits.shape[-1]
    if not processors:
        best = lm_logits[:-1, :vocab].topk(min(top_k, vocab), dim=-1).indices  # (k - 1, top_k)
        agrees = (best == torch.tensor(tokens[1:], device=best.device)[:, None]).any(-1).tolist()
        return 1 + next((j for j, ok in enumerate(agrees) if not ok), len(agrees))
    for j in range(1, len(tokens)):
        seen = torch.cat([ids, torch.tensor([tokens[:j]], device=ids.device)], dim=1)
        scores = processors(seen, lm_logits[j - 1 : j].clone())  # processors may write in place
        if tokens[j] not in scores[0, :vocab].topk(min(top_k, vocab)).indices.tolist():
            return j
    return len(tokens)


def _as_ids(tokens: list[int], whole: int | None, table, vocab: int, mask: torch.Tensor | None) -> list[int]:
    """The ids a kept prefix is emitted as: the chosen phrase if whole, a phrase of the row's set, or its tokens."""
    if whole is not None:
        return [whole]
    index = table.index_of_ids(tuple(tokens)) if len(tokens) > 1 else None
    if index is not None and (mask is None or bool(mask[0, index])):
        return [vocab + index]
    return tokens
