"""Verified and grounded decoding: whatever a phrase or a draft proposes is kept only as far as the LM agrees.

The forward call that reads ``k`` proposed tokens back gives the LM's own scores at every one of them for free.
``generate_verified`` keeps the longest prefix the LM vouches for, drops the rest from the KV cache
(``DynamicCache.crop``) and goes on from the last kept token; whatever was kept, the step counts as one. The LM's
scores at each read-back position pass through ``logits_processor`` first, so the safeguards
(``no_repeat_ngram_size``, ...) judge a proposed token as they judge the LM's own.

Two rules decide what is kept:

- ``accept_top_k`` (the paper's model decides): the model picks a token or a phrase among all of them; a phrase's
  tokens after the first are kept while each is among the LM's top-k there.
- ``gamma`` (grounded: the LM decides): the LM's token distribution picks every token. The best phrase of the row and
  the drafts are proposals; a proposed token is kept while its probability is at least ``gamma`` times the best
  token's there (NEST's relaxed verification, Li et al. 2024). ``gamma=1`` keeps only the LM's own greedy tokens:
  the text is exactly the LM's, in fewer steps. Sampled, a proposed token is kept with the LM's probability of it and
  a refused one is left out of the next draw (speculative sampling, Leviathan et al. 2023, with a one-token draft
  distribution), so the text keeps the LM's own distribution exactly whatever ``gamma`` is.

``context`` ``(1, C)`` is read by the LM before the prompt (the retrieved documents of grounded decoding); the
processors, the drafts' text and the output see the prompt and what follows only, so the n-gram guard judges the
continuation and leaves copying from the documents alone.

``draft`` (e.g. ``dynvocab.decoding.drafting.DocumentDrafter.draft``) proposes tokens to follow the text so far. It decodes
one prompt at a time, like speculative decoding in ``transformers``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, LogitsProcessorList, StoppingCriteriaList

from .sampling import choose, sampling_warpers

__all__ = ["VerifiedOutput", "accept_relaxed", "accept_sampled", "draft_step_cost", "forward_seconds",
           "generate_grounded", "generate_verified"]


@dataclass
class VerifiedOutput:
    """``sequences`` ``(1, L + n)`` mixed ids (prompt first, ``context`` not included); ``steps`` decoding steps (LM
    calls after the prompt's); ``cut`` proposals cut short; ``kept_spans`` the length of each proposal's kept part
    beyond the LM's own chosen token (tokens copied, one entry per step that kept any)."""

    sequences: torch.LongTensor
    steps: int
    cut: int
    kept_spans: list[int] = field(default_factory=list)

    @property
    def copied_tokens(self) -> int:
        return sum(self.kept_spans)


def _choose(scores: torch.Tensor, do_sample: bool, warpers: LogitsProcessorList, ids: torch.Tensor) -> int:
    """The next id from one row's ``(V + P,)`` scores: the best, or sampled after the warpers (which take batches)."""
    return int(choose(warpers(ids, scores[None]), do_sample)[0])


def accept_relaxed(probs: torch.Tensor, token: int, gamma: float) -> bool:
    """Whether ``token`` is kept where the LM's distribution is ``probs`` ``(V,)``: its probability is at least
    ``gamma`` times the best token's; ``gamma >= 1`` keeps the LM's own greedy token only."""
    if gamma >= 1:
        return token == int(probs.argmax())
    return bool(probs[token] >= gamma * probs.max())


def accept_sampled(probs: torch.Tensor, token: int) -> bool:
    """Speculative sampling's test for a proposal that was certain to be drafted: keep ``token`` with probability
    ``probs[token]`` (``probs`` ``(V,)`` the LM's warped distribution there); when refused, the next token is drawn
    from ``probs`` without it, renormalised, which together keeps the LM's distribution exactly."""
    return bool(torch.rand(()) < probs[token])


@torch.no_grad()
def generate_verified(
    model,
    input_ids: torch.LongTensor,
    max_new_tokens: int,
    *,
    accept_top_k: int = 3,
    gamma: float | None = None,
    context: torch.LongTensor | None = None,
    do_sample: bool = False,
    top_p: float = 1.0,
    temperature: float = 1.0,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    eos_token_id: int | None = None,
    row: int | None = None,
    draft: Callable[[list[int]], list[int]] | None = None,
    relax: Callable[[list[int]], bool] | None = None,
    on_step: Callable[[list[int]], bool] | None = None,
    past_key_values: DynamicCache | None = None,
) -> VerifiedOutput:
    """Decode ``max_new_tokens`` steps from ``input_ids`` ``(1, L)`` (token ids) with verified phrases and drafts.

    ``model`` is a ``DynamicVocabLM`` or, with ``gamma``, any causal LM (its drafts alone are proposed); ``row`` picks
    one row's phrase set after per-row ``set_phrases`` (default: every phrase). ``gamma`` in (0, 1] switches to
    grounded acceptance (module docstring); ``context`` ``(1, C)`` token ids are read before the prompt.
    ``logits_processor`` sees the mixed ids and the ``(1, V + P)`` scores of each step, like ``generate``'s. ``draft``
    maps the text so far as token ids (prompt included) to the tokens proposed after it; ``relax(text)`` says whether
    the proposals drafted for ``text`` may be kept by ``gamma`` (else only as the LM's own greedy tokens; default:
    always). ``on_step`` hears the mixed ids each step kept (a phrase, a token, or a token and its kept draft), as they
    are written; returning True ends decoding there (a server's stop string, cancellation or token limit).
    ``past_key_values`` may hold the first tokens of ``context`` + ``input_ids`` already (a prefix shared with earlier
    calls): only the rest is read; decoding appends to it.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"generate_verified decodes one prompt: input_ids must be (1, L), got {tuple(input_ids.shape)}")
    if not isinstance(accept_top_k, int) or accept_top_k < 1:
        raise ValueError(f"accept_top_k must be a positive int, got {accept_top_k!r}")
    if gamma is not None and not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma={gamma!r} must be in (0, 1] (1: the LM's own text), or None for the top-k rule")
    if context is not None and (context.dim() != 2 or context.shape[0] != 1):
        raise ValueError(f"context must be (1, C) token ids read before the prompt, got {tuple(context.shape)}")
    table = getattr(model, "phrase_table", None)
    if table is None and gamma is None:
        raise ValueError(f"{type(model).__name__} has no phrase table: pass gamma (grounded decoding proposes drafts "
                         "to any causal LM), or wrap it in DynamicVocabLM")
    vocab = model.vocab_size if table is not None else model.get_output_embeddings().out_features
    masks = table.row_masks() if table is not None else None
    mask = None if row is None or masks is None else masks[row : row + 1].to(model.device)
    processors = logits_processor or LogitsProcessorList()
    warpers = sampling_warpers(do_sample, temperature, top_p=top_p)
    stopping = stopping_criteria or StoppingCriteriaList()
    eos = model.generation_config.eos_token_id if eos_token_id is None else eos_token_id
    ends = set(eos) if isinstance(eos, list) else set() if eos is None else {eos}
    ids = input_ids.to(model.device)
    text = table.spell(ids[0].tolist()) if table is not None else ids[0].tolist()  # token ids, for ``draft``
    read = ids if context is None else torch.cat([context.to(ids.device), ids], dim=1)
    cache = past_key_values if past_key_values is not None else DynamicCache()
    done = cache.get_seq_length()
    if done >= read.shape[1]:
        raise ValueError(f"past_key_values holds {done} tokens of an input of {read.shape[1]}: keep at least its last "
                         "token out of it, to be read now")
    logits = _forward(model, read[:, done:], cache, mask, last_only=True)[:, -1]
    steps = cut = 0
    kept_spans: list[int] = []
    refused: int | None = None  # a sampled proposal the LM refused: left out of the next draw
    while steps < max_new_tokens:
        scores = processors(ids, logits.float())
        if gamma is None:
            chosen = _choose(scores[0], do_sample, warpers, ids)
            tokens = list(table.token_ids[chosen - vocab]) if chosen >= vocab else [chosen]
            first = len(tokens)  # the tokens the model chose itself (a phrase's after its first are verified too)
            own = int(chosen < vocab)  # of them, the LM's own token
            if draft is not None and chosen < vocab and chosen not in ends:
                tokens += draft(text + tokens)
        else:
            probs = _token_probs(scores[0, :vocab], do_sample, warpers, ids, refused)
            proposals = _Proposals(draft, relax, gamma)
            tokens, own, phrase = _grounded_proposal(probs, scores[0, vocab:], table, text, proposals, do_sample, ends)
            chosen, first, step_gamma = (tokens[0] if phrase is None else vocab + phrase), 1, proposals.gamma
        out = _forward(model, torch.tensor([tokens], device=ids.device), cache, mask)
        rows = _processed_rows(out[0].float(), tokens, processors, ids)
        if gamma is None:
            kept = 1 + _count_agreeing(rows, tokens, lambda row, token: token in row[:vocab].topk(
                min(accept_top_k, vocab)).indices.tolist())
        else:
            kept, refused = _grounded_kept(rows, tokens, vocab, step_gamma, do_sample, warpers, ids)
        kept = next((j + 1 for j, t in enumerate(tokens[:kept]) if t in ends), kept)  # nothing after an end of text
        if kept > first and _stops(stopping, ids, tokens[:kept], scores):  # nor proposed tokens past the stop
            kept = next(j for j in range(first, kept + 1) if _stops(stopping, ids, tokens[:j], scores))
        if kept < len(tokens):
            cache.crop(kept - len(tokens))  # transformers 5: a negative count removes that many slots
            cut += 1
        if kept > own:
            kept_spans.append(kept - own)
        whole = chosen if chosen >= vocab and kept == len(tokens) else None
        written = _as_ids(tokens[:kept], whole, table, vocab, mask) if table is not None else tokens[:kept]
        ids = torch.cat([ids, torch.tensor([written], device=ids.device)], dim=1)
        text += tokens[:kept]
        logits = out[:, kept - 1]
        steps += 1
        heard_enough = on_step is not None and on_step(written)
        if heard_enough or tokens[kept - 1] in ends or _stops(stopping, ids, [], scores):
            break
    return VerifiedOutput(ids, steps, cut, kept_spans)


def generate_grounded(model, input_ids: torch.LongTensor, max_new_tokens: int, *, gamma: float, drafter=None,
                      relax_after: int = 0, **kwargs) -> VerifiedOutput:
    """Grounded decoding (``generate_verified`` with ``gamma``) with drafts from ``drafter`` (a
    ``dynvocab.decoding.drafting.DocumentDrafter`` over the documents read), relaxed by ``gamma`` only inside a copy under way:
    where at least ``relax_after`` of the text's last tokens stand verbatim before the draft in its document (0:
    everywhere). ``kwargs`` go to ``generate_verified`` (``context``, ``do_sample``, ``logits_processor``, ...)."""
    relax = None
    if drafter is not None and relax_after:
        relax = lambda text: drafter.anchored(text) >= relax_after  # noqa: E731
    return generate_verified(model, input_ids, max_new_tokens, gamma=gamma, relax=relax,
                             draft=drafter.draft if drafter is not None else None, **kwargs)


def _forward(model, ids: torch.Tensor, cache: DynamicCache, mask: torch.Tensor | None,
             last_only: bool = False) -> torch.Tensor:
    """The model's scores ``(1, n, V [+ P])`` after each of ``ids`` ``(1, n)``, appending to ``cache``."""
    kwargs = {"logits_to_keep": 1} if last_only else {}
    if mask is not None:
        kwargs["phrase_mask"] = mask
    return model(ids, past_key_values=cache, use_cache=True, **kwargs).logits


def _token_probs(scores: torch.Tensor, do_sample: bool, warpers: LogitsProcessorList, ids: torch.Tensor,
                 refused: int | None) -> torch.Tensor:
    """The LM's distribution ``(V,)`` over tokens from processed ``scores``: warped when sampling, without the
    token a speculative test just refused (its residual)."""
    if do_sample:
        scores = warpers(ids, scores[None].clone())[0]
    if refused is not None:
        scores = scores.clone()
        scores[refused] = float("-inf")
    return torch.softmax(scores, dim=-1)


class _Proposals:
    """One step's drafts, each with the relaxation it may be kept by: ``gamma`` where ``relax`` allows (or always),
    else 1; ``gamma`` is that of the last draft made."""

    def __init__(self, draft: Callable[[list[int]], list[int]] | None, relax: Callable[[list[int]], bool] | None,
                 gamma: float) -> None:
        self.draft, self.relax, self.relaxed, self.gamma = draft, relax, gamma, gamma

    def __call__(self, text: list[int]) -> list[int]:
        if self.draft is None:
            return []
        proposal = self.draft(text)
        self.gamma = self.relaxed if self.relax is None or self.relax(text) else 1.0
        return proposal


def _grounded_proposal(probs: torch.Tensor, phrase_scores: torch.Tensor, table, text: list[int], draft: _Proposals,
                       do_sample: bool, ends: set[int]) -> tuple[list[int], int, int | None]:
    """The tokens to read back this step, how many of them the LM chose itself (1 or 0), and the phrase they are.

    A proposal whose first token the LM vouches for here (``accept_relaxed``; sampled: the token drawn) is read back
    whole: the draft that continues the text, else the row's best phrase. Otherwise the LM's own token (the best, or
    drawn from ``probs``) comes first, followed by the draft after it.
    """
    own = int(torch.multinomial(probs, 1)) if do_sample else int(probs.argmax())
    proposed = draft(text)

    def vouched(token: int) -> bool:
        return token not in ends and (token == own if do_sample else accept_relaxed(probs, token, draft.gamma))

    if proposed and vouched(proposed[0]):
        return proposed, 0, None
    if phrase_scores.numel() and bool(torch.isfinite(phrase_scores).any()):
        best = int(phrase_scores.argmax())
        phrase = list(table.token_ids[best])
        if vouched(phrase[0]):
            return phrase, 0, best
    return [own] + (draft(text + [own]) if own not in ends else []), 1, None


def _processed_rows(logits: torch.Tensor, tokens: list[int], processors: LogitsProcessorList,
                    ids: torch.Tensor) -> Iterator[torch.Tensor]:
    """The processed scores ``(V [+ P],)`` after each of ``tokens`` but the last, read lazily: ``logits``
    ``(k, V [+ P])`` row ``j`` is the model's after ``tokens[j]``; the processors see ``ids`` and the tokens up to it."""
    for j in range(1, len(tokens)):
        if not processors:
            yield logits[j - 1]
            continue
        seen = torch.cat([ids, torch.tensor([tokens[:j]], device=ids.device)], dim=1)
        yield processors(seen, logits[j - 1 : j].clone())[0]  # processors may write in place


def _count_agreeing(rows: Iterator[torch.Tensor], tokens: list[int],
                    agrees: Callable[[torch.Tensor, int], bool]) -> int:
    """How many of ``tokens`` after the first the LM agrees with in a row (``rows`` as ``_processed_rows`` gives)."""
    for j, row in enumerate(rows, start=1):
        if not agrees(row, tokens[j]):
            return j - 1
    return len(tokens) - 1


def _grounded_kept(rows: Iterator[torch.Tensor], tokens: list[int], vocab: int, gamma: float, do_sample: bool,
                   warpers: LogitsProcessorList, ids: torch.Tensor) -> tuple[int, int | None]:
    """How many of ``tokens`` (the first always) the grounded rule keeps, and the sampled token it refused (or None)."""
    refused = None

    def agrees(row: torch.Tensor, token: int) -> bool:
        nonlocal refused
        if not do_sample:
            return accept_relaxed(torch.softmax(row[:vocab], dim=-1), token, gamma)
        if accept_sampled(_token_probs(row[:vocab], True, warpers, ids, None), token):
            return True
        refused = token
        return False

    return 1 + _count_agreeing(rows, tokens, agrees), refused


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


def _as_ids(tokens: list[int], whole: int | None, table, vocab: int, mask: torch.Tensor | None) -> list[int]:
    """The ids a kept prefix is emitted as: the chosen phrase if whole, a phrase of the row's set, or its tokens."""
    if whole is not None:
        return [whole]
    index = table.index_of_ids(tuple(tokens)) if len(tokens) > 1 else None
    if index is not None and (mask is None or bool(mask[0, index])):
        return [vocab + index]
    return tokens
