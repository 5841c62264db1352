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

``draft`` (e.g. ``dynvocab.decoding.drafting.DocumentDrafter.draft``) proposes tokens to follow the text so far.
``generate_verified`` decodes one prompt; ``generate_verified_batch`` decodes several in one forward call a step, each
row with its own documents, drafts, phrase set and safeguards, and writes what each row writes alone. Both run a
``VerifiedBatch``, which rows may also join between steps (the server's continuous batching).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, LogitsProcessorList, StoppingCriteriaList

from .kv_slots import check_layers, drop_leading_slots, join_rows, pad_leading_slots
from .sampling import choose, sampling_warpers

__all__ = ["VerifiedBatch", "VerifiedOutput", "VerifiedRow", "accept_relaxed", "accept_sampled", "draft_step_cost",
           "forward_seconds", "generate_grounded", "generate_verified", "generate_verified_batch", "grounded_fill",
           "grounded_proposers", "grounded_relax"]


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


@dataclass
class VerifiedRow:
    """One prompt of ``generate_verified_batch`` with what is its own: ``input_ids`` its token ids, ``context`` the
    token ids read before them (its documents), ``row`` its phrase set after per-row ``set_phrases`` (None: every
    phrase), and its ``draft``, ``relax``, ``logits_processor``, ``stopping_criteria`` and ``on_step``, as
    ``generate_verified`` takes them (a row's own processors: the n-gram guard keeps the width it first sees).
    ``phrases``, the table indices of its phrases, names its set instead of ``row`` (a row joining a running
    ``VerifiedBatch`` whose table grew by its phrases). ``fill`` (grounded decoding, e.g. ``grounded_fill``) drafts
    after the LM's own token where ``draft`` has nothing there, kept as far as the LM's own greedy tokens agree."""

    input_ids: Sequence[int]
    context: Sequence[int] = ()
    row: int | None = None
    draft: Callable[[list[int]], list[int]] | None = None
    relax: Callable[[list[int]], int] | None = None
    logits_processor: LogitsProcessorList | None = None
    stopping_criteria: StoppingCriteriaList | None = None
    on_step: Callable[[list[int]], bool] | None = None
    phrases: Sequence[int] | None = None
    fill: Callable[[list[int]], list[int]] | None = None


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
    relax: Callable[[list[int]], int] | None = None,
    on_step: Callable[[list[int]], bool] | None = None,
    past_key_values: DynamicCache | None = None,
    fill: Callable[[list[int]], list[int]] | None = None,
) -> VerifiedOutput:
    """Decode ``max_new_tokens`` steps from ``input_ids`` ``(1, L)`` (token ids) with verified phrases and drafts.

    ``model`` is a ``DynamicVocabLM`` or, with ``gamma``, any causal LM (its drafts alone are proposed); ``row`` picks
    one row's phrase set after per-row ``set_phrases`` (default: every phrase). ``gamma`` in (0, 1] switches to
    grounded acceptance (module docstring); ``context`` ``(1, C)`` token ids are read before the prompt.
    ``logits_processor`` sees the mixed ids and the ``(1, V + P)`` scores of each step, like ``generate``'s. ``draft``
    maps the text so far as token ids (prompt included) to the tokens proposed after it; ``relax(text)`` says how many
    leading tokens of the draft just made for ``text`` may be kept by ``gamma``: the draft is then cut there, and 0
    keeps it whole but only as the LM's own greedy tokens (default: all of every draft). ``on_step`` hears the mixed
    ids each step kept (a phrase, a token, or a token and its kept draft), as they are written; returning True ends
    decoding there (a server's stop string, cancellation or token limit). ``fill`` drafts after the LM's own token
    where ``draft`` has nothing (grounded: ``grounded_fill``).
    ``past_key_values`` may hold the first tokens of ``context`` + ``input_ids`` already (a prefix shared with earlier
    calls): only the rest is read; decoding appends to it.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"generate_verified decodes one prompt: input_ids must be (1, L), got "
                         f"{tuple(input_ids.shape)}; decode several with generate_verified_batch")
    if context is not None and (context.dim() != 2 or context.shape[0] != 1):
        raise ValueError(f"context must be (1, C) token ids read before the prompt, got {tuple(context.shape)}")
    spec = VerifiedRow(input_ids[0].tolist(), context[0].tolist() if context is not None else (), row, draft, relax,
                       logits_processor, stopping_criteria, on_step, fill=fill)
    return generate_verified_batch(model, [spec], max_new_tokens, accept_top_k=accept_top_k, gamma=gamma,
                                   do_sample=do_sample, top_p=top_p, temperature=temperature,
                                   eos_token_id=eos_token_id, past_key_values=past_key_values)[0]


@torch.no_grad()
def generate_verified_batch(
    model,
    rows: Sequence[VerifiedRow],
    max_new_tokens: int,
    *,
    accept_top_k: int = 3,
    gamma: float | None = None,
    do_sample: bool = False,
    top_p: float = 1.0,
    temperature: float = 1.0,
    eos_token_id: int | None = None,
    past_key_values: DynamicCache | None = None,
    on_batch_step: Callable[[list[list[int]]], None] | None = None,
) -> list[VerifiedOutput]:
    """``generate_verified`` for several prompts in one batch: one forward call per step reads every row's proposal
    (``VerifiedBatch``, every row admitted at once). One output per row, in order; ``past_key_values`` (a shared
    prefix) only with one row. ``on_batch_step`` hears each step once, after every row's ``on_step``: the mixed ids
    each row in it wrote."""
    batch = VerifiedBatch(model, accept_top_k=accept_top_k, gamma=gamma, do_sample=do_sample, top_p=top_p,
                          temperature=temperature, eos_token_id=eos_token_id, on_batch_step=on_batch_step)
    if not rows:
        return []
    batch.admit(rows, max_new_tokens, past_key_values)
    while batch:
        batch.step()
    return batch.outputs()


class VerifiedBatch:
    """Rows decoded by one rule, one forward call a step; rows join between steps (``admit``) and leave as they end,
    as the server's running batch does (continuous batching).

    The rows are left-padded; a step reads ``K`` slots of every row (its longest proposal), and the slots a row
    did not keep (its rejected and padding tokens) stay in the KV cache masked out, each row's positions counting
    its own kept tokens only, so every row reads what it would read alone. Slots no row kept are cropped, and so are
    the leading slots no row attends to once the rows that held them leave. A joining group is read on its own and
    laid into the batch's cache, left-padded to the longer of the two.

    ``model``, ``accept_top_k``, ``gamma``, ``do_sample``, ``top_p``, ``temperature`` and ``eos_token_id`` are
    ``generate_verified``'s; ``on_batch_step`` hears each step's mixed ids, one list per row in it.
    """

    def __init__(self, model, *, accept_top_k: int = 3, gamma: float | None = None, do_sample: bool = False,
                 top_p: float = 1.0, temperature: float = 1.0, eos_token_id: int | None = None,
                 on_batch_step: Callable[[list[list[int]]], None] | None = None) -> None:
        if not isinstance(accept_top_k, int) or accept_top_k < 1:
            raise ValueError(f"accept_top_k must be a positive int, got {accept_top_k!r}")
        if gamma is not None and not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma={gamma!r} must be in (0, 1] (1: the LM's own text), or None for the top-k rule")
        table = getattr(model, "phrase_table", None)
        if table is None and gamma is None:
            raise ValueError(f"{type(model).__name__} has no phrase table: pass gamma (grounded decoding proposes "
                             "drafts to any causal LM), or wrap it in DynamicVocabLM")
        eos = model.generation_config.eos_token_id if eos_token_id is None else eos_token_id
        self.rule = _Rule(table, model.vocab_size if table is not None else model.get_output_embeddings().out_features,
                          accept_top_k, gamma, do_sample, sampling_warpers(do_sample, temperature, top_p=top_p),
                          set(eos) if isinstance(eos, list) else set() if eos is None else {eos})
        self.model, self.on_batch_step = model, on_batch_step
        self.states: list[_RowDecoding] = []  # every row admitted, by number
        self.active: list[int] = []  # the numbers of the rows decoding, in the cache's row order
        self.cache: DynamicCache | None = None
        self.attention: torch.Tensor | None = None  # (B, S); None: one row with no padding (its cache is its own)
        self._masks: tuple[tuple, torch.Tensor | None] = ((), None)

    def __len__(self) -> int:
        return len(self.active)

    def admit(self, rows: Sequence[VerifiedRow], max_new_tokens: int,
              past_key_values: DynamicCache | None = None) -> list[int]:
        """Read ``rows`` (each row's context and prompt) and add them to the batch, to decode up to
        ``max_new_tokens`` steps each; returns their numbers (``outputs()`` order). ``past_key_values`` may hold a
        prefix of one joining row (its documents' keys and values, say): only the rest is read."""
        if past_key_values is not None and len(rows) > 1:
            raise ValueError(f"past_key_values holds one prompt's prefix, but {len(rows)} rows were given: admit "
                             "them one at a time, each with its own")
        if any(not len(spec.input_ids) for spec in rows):
            raise ValueError("every row needs at least one prompt token")
        device = self.model.device
        states = [_RowDecoding(spec, self.rule, device, max_new_tokens) for spec in rows]
        reads = [list(spec.context) + list(spec.input_ids) for spec in rows]
        cache = past_key_values if past_key_values is not None else DynamicCache()
        logits, attention = _prefill(self.model, reads, cache, self._phrase_mask(states))
        for state, read, row_logits in zip(states, reads, logits):
            state.logits, state.position = row_logits[None], len(read)
        numbers = list(range(len(self.states), len(self.states) + len(rows)))
        self.states += states
        going = [n for n, state in enumerate(states) if not state.finished()]
        if going:
            if len(going) < len(states):
                index = torch.tensor(going, device=device)
                cache.batch_select_indices(index)
                attention = attention[index] if attention is not None else None
            self._join([numbers[n] for n in going], cache, attention)
        return numbers

    def step(self) -> list[int]:
        """One forward call over every row's proposal; returns the numbers of the rows that ended (they leave)."""
        states, device = [self.states[i] for i in self.active], self.model.device
        proposals = [state.propose() for state in states]
        width = max(map(len, proposals))
        ids = torch.tensor([tokens + tokens[-1:] * (width - len(tokens)) for tokens in proposals], device=device)
        positions = None
        if self.attention is not None:
            new = torch.tensor([[1] * len(tokens) + [0] * (width - len(tokens)) for tokens in proposals], device=device)
            self.attention = torch.cat([self.attention, new], dim=1)
            positions = torch.tensor([[state.position + j for j in range(width)] for state in states], device=device)
        out = _forward(self.model, ids, self.cache, self._phrase_mask(states), attention_mask=self.attention,
                       position_ids=positions)
        kept = [state.verify(out[n, : len(tokens)]) for n, (state, tokens) in enumerate(zip(states, proposals))]
        if self.on_batch_step is not None:
            self.on_batch_step([state.written for state in states])
        if self.attention is not None:
            for n, count in enumerate(kept):
                self.attention[n, self.attention.shape[1] - width + count :] = 0
        if max(kept) < width:  # the slots no row kept
            self.cache.crop(max(kept) - width)  # transformers 5: a negative count removes that many slots
            if self.attention is not None:
                self.attention = self.attention[:, : self.attention.shape[1] - width + max(kept)]
        staying = [n for n, state in enumerate(states) if not state.finished()]
        ended = [self.active[n] for n in range(len(states)) if n not in staying]
        if ended and staying:
            index = torch.tensor(staying, device=device)
            self.cache.batch_select_indices(index)
            if self.attention is not None:  # and the slots no row attends to any more, from the left
                self.attention = self.attention[index]
                unused = int(self.attention.any(0).long().argmax())
                drop_leading_slots(self.cache, unused)
                self.attention = self.attention[:, unused:]
        self.active = [self.active[n] for n in staying]
        if not self.active:
            self.cache = self.attention = None
        return ended

    def outputs(self) -> list[VerifiedOutput]:
        """Every admitted row's output, by number."""
        return [state.output() for state in self.states]

    def _join(self, numbers: list[int], cache: DynamicCache, attention: torch.Tensor | None) -> None:
        """Lay the joining rows' ``cache`` (and ``attention`` ``(b, S')``, None: one row) into the batch's."""
        if not self.active:
            self.active, self.cache, self.attention = numbers, cache, attention
            return
        check_layers(cache)
        held = self.attention if self.attention is not None else _all_slots(self.cache)
        added = attention if attention is not None else _all_slots(cache)
        length = max(held.shape[1], added.shape[1])
        pad_leading_slots(self.cache, length - held.shape[1])
        join_rows(self.cache, cache, torch.arange(length - added.shape[1], length, device=held.device))
        self.attention = torch.cat([_left_padded(held, length), _left_padded(added, length)])
        self.active += numbers

    def _phrase_mask(self, states: list[_RowDecoding]) -> torch.Tensor | None:
        """The ``(B, P)`` phrases each of ``states`` may use (None: every row, every phrase), kept while the rows
        and the table stay as they are."""
        table = self.rule.table
        key = (tuple(map(id, states)), len(table) if table is not None else 0)
        if key != self._masks[0]:
            masks = [state.phrase_mask() for state in states]
            mask = None if all(m is None for m in masks) else torch.stack(
                [m if m is not None else torch.ones(len(table), dtype=torch.bool) for m in masks]).to(self.model.device)
            self._masks = (key, mask)
        return self._masks[1]


def _all_slots(cache: DynamicCache) -> torch.Tensor:
    """The ``(1, S)`` attention of a one-row cache whose slots are all its own."""
    return torch.ones(1, cache.get_seq_length(), dtype=torch.long, device=cache.layers[0].keys.device)


def _left_padded(attention: torch.Tensor, length: int) -> torch.Tensor:
    """``attention`` ``(b, S)`` with ``length - S`` masked slots before its first."""
    return torch.cat([attention.new_zeros(attention.shape[0], length - attention.shape[1]), attention], dim=1)


def generate_grounded(model, input_ids: torch.LongTensor, max_new_tokens: int, *, gamma: float, drafter=None,
                      relax_after: int = 0, **kwargs) -> VerifiedOutput:
    """Grounded decoding (``generate_verified`` with ``gamma``) with drafts from ``drafter`` (a
    ``dynvocab.decoding.drafting.DocumentDrafter`` over the documents read), relaxed as ``grounded_relax`` says, and
    its corpus's drafts where it has none (``grounded_fill``). ``kwargs`` go to ``generate_verified`` (``context``,
    ``do_sample``, ``logits_processor``, ...)."""
    return generate_verified(model, input_ids, max_new_tokens, gamma=gamma, **grounded_proposers(drafter, relax_after),
                             **kwargs)


def grounded_proposers(drafter, relax_after: int) -> dict[str, Callable | None]:
    """What a row of grounded decoding proposes by, from one ``drafter`` (or None): its ``draft``, the ``relax`` of
    ``grounded_relax`` and the ``fill`` of ``grounded_fill``, as ``VerifiedRow`` and ``generate_verified`` take
    them."""
    relax = grounded_relax(drafter, relax_after)
    return {"draft": drafter.draft if drafter is not None else None, "relax": relax,
            "fill": grounded_fill(drafter, relax)}


def grounded_relax(drafter, relax_after: int) -> Callable[[list[int]], int] | None:
    """The ``relax`` of grounded decoding: ``drafter`` 's drafts are relaxed by gamma only inside a copy under way,
    where at least ``relax_after`` of the text's last tokens stand verbatim before the draft in its document, and only
    as far as the read documents holding those tokens agree on what follows (``DocumentDrafter.agreed``; 0, or
    no drafter: everywhere)."""
    if drafter is None or not relax_after:
        return None
    return lambda text: drafter.agreed(text, relax_after) if drafter.anchored(text) >= relax_after else 0


def grounded_fill(drafter, relax: Callable[[list[int]], int] | None) -> Callable[[list[int]], list[int]] | None:
    """The ``fill`` of grounded decoding: ``drafter``'s corpus draft (``DocumentDrafter.fill``) where the step would
    write the LM's own token, cut before the first text where it would not (a quiet text: neither the text nor the
    documents hold a follower there, ``DocumentDrafter.proposes``, and ``relax`` relaxes nothing). Kept at gamma 1,
    a filled token is the one that step would have written, and the next step starts where it would have (None: no
    drafter or no corpus)."""
    if drafter is None or drafter.corpus is None:
        return None

    def quiet(text: list[int]) -> bool:
        return not drafter.proposes(text) and not (relax is not None and relax(text))

    def fill(text: list[int]) -> list[int]:
        if not quiet(text):
            return []
        draft = drafter.fill(text)
        return next((draft[:j] for j in range(1, len(draft)) if not quiet(text + draft[:j])), draft)

    return fill


def _forward(model, ids: torch.Tensor, cache: DynamicCache, mask: torch.Tensor | None, last_only: bool = False,
             **inputs: torch.Tensor | None) -> torch.Tensor:
    """The model's scores ``(B, n, V [+ P])`` after each of ``ids`` ``(B, n)``, appending to ``cache``; ``inputs``:
    the ``attention_mask`` ``(B, S + n)`` and ``position_ids`` ``(B, n)`` of a padded batch (None: one row)."""
    kwargs = {"logits_to_keep": 1} if last_only else {}
    if mask is not None:
        kwargs["phrase_mask"] = mask
    kwargs |= {name: value for name, value in inputs.items() if value is not None}
    return model(ids, past_key_values=cache, use_cache=True, **kwargs).logits


def _prefill(model, reads: list[list[int]], cache: DynamicCache,
             phrase_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Read every row's context and prompt (``reads``) into ``cache``: the scores ``(B, V [+ P])`` after each, and
    the batch's attention mask ``(B, S)`` over the left-padded rows. One row has no padding and no mask (its cache is
    cropped to what it keeps), and its cache may hold a prefix already: only the rest is read."""
    device, done = model.device, cache.get_seq_length()
    if done >= len(reads[0]):
        raise ValueError(f"past_key_values holds {done} tokens of an input of {len(reads[0])}: keep at least its last "
                         "token out of it, to be read now")
    if len(reads) == 1:
        rest = torch.tensor([reads[0][done:]], device=device)
        return _forward(model, rest, cache, phrase_mask, last_only=True)[:, -1], None
    width = max(map(len, reads))
    ids = torch.tensor([[0] * (width - len(read)) + read for read in reads], device=device)
    attention = torch.tensor([[0] * (width - len(read)) + [1] * len(read) for read in reads], device=device)
    logits = _forward(model, ids, cache, phrase_mask, last_only=True, attention_mask=attention,
                      position_ids=(attention.cumsum(-1) - 1).clamp(min=0))
    return logits[:, -1], attention


@dataclass
class _Rule:
    """What every row of a batch decodes by: the phrase table (or None), the LM's vocabulary size, the acceptance
    rule, the sampling warpers and the end-of-text ids."""

    table: Any
    vocab: int
    accept_top_k: int
    gamma: float | None
    do_sample: bool
    warpers: LogitsProcessorList
    ends: set[int]


class _RowDecoding:
    """One row's decoding so far: its mixed ids ``(1, L + n)``, its text as token ids (for its drafts), the scores
    ``(1, V [+ P])`` its next step chooses from, its position (tokens read and kept), and the step being verified."""

    def __init__(self, spec: VerifiedRow, rule: _Rule, device: torch.device, max_new_tokens: int) -> None:
        self.spec, self.rule, self.max_new_tokens = spec, rule, max_new_tokens
        self.processors = spec.logits_processor or LogitsProcessorList()
        self.stopping = spec.stopping_criteria or StoppingCriteriaList()
        mask = self.phrase_mask()
        self.mask = mask[None].to(device) if mask is not None else None
        self.ids = torch.tensor([list(spec.input_ids)], device=device)
        self.text = rule.table.spell(list(spec.input_ids)) if rule.table is not None else list(spec.input_ids)
        self.logits: torch.Tensor | None = None
        self.position = self.steps = self.cut = 0
        self.kept_spans: list[int] = []
        self.refused: int | None = None  # a sampled proposal the LM refused: left out of the next draw
        self.written: list[int] = []  # the mixed ids the last step wrote
        self.ended = False

    def propose(self) -> list[int]:
        """The tokens this step reads back: the chosen token or phrase and what is drafted after it (the top-k
        rule), or the grounded rule's proposal."""
        rule, vocab = self.rule, self.rule.vocab
        self.scores = self.processors(self.ids, self.logits.float())
        if rule.gamma is None:
            chosen = _choose(self.scores[0], rule.do_sample, rule.warpers, self.ids)
            tokens = list(rule.table.token_ids[chosen - vocab]) if chosen >= vocab else [chosen]
            first = len(tokens)  # the tokens the model chose itself (a phrase's after its first are verified too)
            own = int(chosen < vocab)  # of them, the LM's own token
            if self.spec.draft is not None and chosen < vocab and chosen not in rule.ends:
                tokens += self.spec.draft(self.text + tokens)
            step_gamma = None
        else:
            probs = _token_probs(self.scores[0, :vocab], rule.do_sample, rule.warpers, self.ids, self.refused)
            proposals = _Proposals(self.spec.draft, self.spec.relax, rule.gamma)
            tokens, own, phrase = _grounded_proposal(probs, self.scores[0, vocab:], rule.table, self.text, proposals,
                                                     rule.do_sample, rule.ends, self.spec.fill)
            chosen, first, step_gamma = (tokens[0] if phrase is None else vocab + phrase), 1, proposals.gamma
        self.step = (tokens, chosen, first, own, step_gamma)
        return tokens

    def verify(self, logits: torch.Tensor) -> int:
        """Keep what the rule allows of the proposal, given the model's scores ``(k, V [+ P])`` after each of its
        ``k`` tokens; write it and hear ``on_step``. Returns how many tokens were kept."""
        rule, vocab = self.rule, self.rule.vocab
        tokens, chosen, first, own, step_gamma = self.step
        rows = _processed_rows(logits.float(), tokens, self.processors, self.ids)
        if rule.gamma is None:
            kept = 1 + _count_agreeing(rows, tokens, lambda row, token: token in row[:vocab].topk(
                min(rule.accept_top_k, vocab)).indices.tolist())
        else:
            kept, self.refused = _grounded_kept(rows, tokens, vocab, step_gamma, rule.do_sample, rule.warpers, self.ids)
        kept = next((j + 1 for j, t in enumerate(tokens[:kept]) if t in rule.ends), kept)  # nothing after an end
        if kept > first and _stops(self.stopping, self.ids, tokens[:kept], self.scores):  # nor past the stop
            kept = next(j for j in range(first, kept + 1) if _stops(self.stopping, self.ids, tokens[:j], self.scores))
        self.cut += kept < len(tokens)
        if kept > own:
            self.kept_spans.append(kept - own)
        whole = chosen if chosen >= vocab and kept == len(tokens) else None
        written = tokens[:kept] if rule.table is None else _as_ids(tokens[:kept], whole, rule.table, vocab, self.mask)
        self.ids = torch.cat([self.ids, torch.tensor([written], device=self.ids.device)], dim=1)
        self.text, self.written = self.text + tokens[:kept], written
        self.logits, self.position, self.steps = logits[kept - 1][None], self.position + kept, self.steps + 1
        heard_enough = self.spec.on_step is not None and self.spec.on_step(written)
        self.ended = heard_enough or tokens[kept - 1] in rule.ends or _stops(self.stopping, self.ids, [], self.scores)
        return kept

    def phrase_mask(self) -> torch.Tensor | None:
        """The ``(P,)`` phrases of the table this row may use: its ``phrases``, its row of per-row ``set_phrases``
        (``row``), or None (every phrase)."""
        table, spec = self.rule.table, self.spec
        if table is None or (spec.phrases is None and spec.row is None):
            return None
        if spec.phrases is None:
            masks = table.row_masks()
            return masks[spec.row] if masks is not None else None
        mask = torch.zeros(len(table), dtype=torch.bool)
        mask[list(spec.phrases)] = True
        return mask

    def finished(self) -> bool:
        return self.ended or self.steps >= self.max_new_tokens

    def output(self) -> VerifiedOutput:
        return VerifiedOutput(self.ids, self.steps, self.cut, self.kept_spans)


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
    """One step's drafts, each with the relaxation it may be kept by: ``gamma`` over the leading tokens ``relax``
    allows (all at ``gamma`` 1, or without ``relax``), the draft cut after them; else the whole draft at 1. ``gamma``
    is that of the last draft made."""

    def __init__(self, draft: Callable[[list[int]], list[int]] | None, relax: Callable[[list[int]], int] | None,
                 gamma: float) -> None:
        self.draft, self.relax, self.relaxed, self.gamma = draft, relax, gamma, gamma

    def __call__(self, text: list[int]) -> list[int]:
        if self.draft is None:
            return []
        proposal = self.draft(text)
        relaxed = len(proposal) if self.relax is None or self.relaxed >= 1 else self.relax(text)
        self.gamma = self.relaxed if relaxed else 1.0
        return proposal[:relaxed] if relaxed else proposal


def _grounded_proposal(probs: torch.Tensor, phrase_scores: torch.Tensor, table, text: list[int], draft: _Proposals,
                       do_sample: bool, ends: set[int],
                       fill: Callable[[list[int]], list[int]] | None = None) -> tuple[list[int], int, int | None]:
    """The tokens to read back this step, how many of them the LM chose itself (1 or 0), and the phrase they are.

    A proposal whose first token the LM vouches for here (``accept_relaxed``; sampled: the token drawn) is read back
    whole: the draft that continues the text, else the row's best phrase. Otherwise the LM's own token (the best, or
    drawn from ``probs``) comes first, followed by the draft after it, else by ``fill``'s (kept at gamma 1: no draft
    there, so ``draft.gamma`` is 1).
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
    if own in ends:
        return [own], 1, None
    after = draft(text + [own])
    if not after and fill is not None:
        after = fill(text + [own])
    return [own] + after, 1, None


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
    if index is not None and (mask is None or (index < mask.shape[1] and bool(mask[0, index]))):
        return [vocab + index]
    return tokens
