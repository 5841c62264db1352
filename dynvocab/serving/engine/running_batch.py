"""Iteration-level (continuous) batching: requests join a running batch between decoding steps and leave it as
soon as they end, instead of waiting for the batch's longest row (Orca's scheduling, Yu et al., OSDI 2022).

Each row keeps its own phrase set (a row of the ``(B, P)`` mask over one shared phrase table), its own stopping
terms, its own phrase contexts and, in a batch with a state gate, its own state keys (``dynvocab.states.keys``). A
joining group is prefilled on its own and its first id chosen from the prefill's scores, as ``generate()`` chooses
it; its KV cache is then laid into the batch's slots, left-padded to the batch's logical length, each of its ids in
the last slot of its step (a step that read a phrase back as its ``k`` tokens takes ``k`` slots of every row:
``dynvocab.decoding.readback``). Rows that leave take their slots with them, and the slots no row attends to any more are
dropped from the left.

A step is the model's ``forward`` on the ids the cache lacks, the phrase-aware logits processors of
``DynamicVocabLM.phrase_logits_processors`` and ``dynvocab.decoding.sampling``'s warpers and draw, in ``generate()``'s order.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, LogitsProcessorList

from ...decoding.kv_slots import check_layers, drop_leading_slots, join_rows, pad_leading_slots, select_rows
from ...decoding.readback import WIDTHS_ATTRIBUTE
from ...decoding.sampling import choose, sampling_warpers
from ...model import PHRASE_PROCESSOR_ARGS, DynamicVocabLM
from ...phrases.table import Phrase
from ...states.keys import StateKeys, state_keys
from ...states.store import DocumentStates
from ...tokens.padding import pad_sequences, position_ids_from_mask
from .rows import Row

__all__ = ["ActiveRow", "Admission", "RunningBatch"]

#: a table holding more phrases than this beyond its rows' own is compacted (ids renumbered)
SPARE_PHRASES = 4096


@dataclass
class Admission:
    """One request ready to join: its prompt, phrases (with sources), phrase contexts, its ``Row``, the seed to
    sample with (set as it joins), the caller's own ``handle`` on it (the server's request) and, in a batch with a
    state gate, the token ids of the documents whose states key its phrases."""

    prompt_ids: list[int]
    phrases: list[Phrase]
    contexts: dict | None
    row: Row
    seed: int | None = None
    handle: Any = None
    documents: list[list[int]] | None = None


@dataclass
class ActiveRow:
    """An admitted request: its phrases' table ``indices``, when it joined, and a serial number (the key of the
    batch's derived tensors: ``id()`` may come back for another row)."""

    admission: Admission
    indices: torch.Tensor  # (n,) the row's phrases in the table
    started: float
    serial: int = field(default_factory=itertools.count().__next__)
    keys: StateKeys | None = None  # the row's state keys (a batch with a state gate), their phrases table indices

    @property
    def row(self) -> Row:
        return self.admission.row


class RunningBatch:
    """The rows being decoded together, their ids ``(B, L)``, logical mask ``(B, L)`` and KV cache (which holds
    the first ``L - 1`` steps: the last column is fed at the next step).

    With ``state_threshold`` a row's phrase competes only where the LM's state is that close (cosine) to its state
    before the phrase in one of the row's documents; ``document_states`` keeps documents' states across batches.
    """

    def __init__(self, model: DynamicVocabLM, generation_kwargs: dict, readback: str | None, eos: set[int],
                 pad: int, state_threshold: float | None = None, document_states: DocumentStates | None = None) -> None:
        self.model, self.eos, self.pad = model, eos, pad
        if state_threshold is not None and document_states is None:
            document_states = DocumentStates(model.lm)
        self.state_threshold, self.document_states = state_threshold, document_states
        self.readback = readback or model.dynvocab_config.readback
        kwargs = dict(generation_kwargs)
        self.do_sample = bool(kwargs.pop("do_sample", False))
        sampling = {name: kwargs.pop(name) for name in ("temperature", "top_k", "top_p") if name in kwargs}
        self.warpers = sampling_warpers(self.do_sample, **sampling)
        unknown = set(kwargs) - set(PHRASE_PROCESSOR_ARGS)
        if unknown:
            raise ValueError(f"continuous batching does not take the generation settings {sorted(unknown)}; pass only "
                             f"do_sample, temperature, top_k, top_p and the phrase rules {PHRASE_PROCESSOR_ARGS}")
        self.phrase_settings = kwargs
        self.active: list[ActiveRow] = []
        self.phrase_steps = 0  # rows that wrote a phrase at the last step
        self.encode_seconds = 0.0  # the last admit's phrase table set-up: tokens checked, vectors found or encoded
        self.ids = self.mask = self.widths = self.cache = None
        self._processors_key: tuple | None = None
        self._processors = LogitsProcessorList()
        self._masks_key: tuple | None = None
        self._masks: torch.Tensor | None = None
        self._keys_key: tuple | None = None
        self._keys: StateKeys | None = None
        if len(model.phrase_table) or model.phrase_table.num_rows is not None:
            model.phrase_table.keep([])  # a fresh table (the phrase cache keeps the vectors)

    def __len__(self) -> int:
        return len(self.active)

    # ------------------------------------------------------------------ joining
    @torch.no_grad()
    def admit(self, admissions: list[Admission]) -> list[ActiveRow]:
        """Prefill ``admissions`` together, choose their first ids, and add the rows that go on to the batch.
        Returns the rows that already ended (one step asked, end-of-text, a stop string or cancelled)."""
        table, vocab = self.model.phrase_table, self.model.vocab_size
        joining, start = [], time.perf_counter()
        for admission in admissions:
            checked = table.validate(admission.phrases)
            table.add_validated(checked)
            indices = sorted({table.index_of_ids(ids) for _, ids in checked})
            joining.append(ActiveRow(admission, torch.tensor(indices, dtype=torch.long), time.perf_counter()))
            if admission.seed is not None:
                torch.manual_seed(admission.seed)
        self.model.refresh_phrase_vectors(only_new=True)
        if self.state_threshold is not None:
            for active in joining:
                active.keys = self._row_keys(active)
        self.encode_seconds = time.perf_counter() - start
        ids, mask = pad_sequences([a.admission.prompt_ids for a in joining], self.pad, side="left",
                                  device=self.model.device)
        cache = DynamicCache(config=self.model.lm.config)
        scores = self._forward(ids, mask, cache, joining)
        chosen = self._choose(ids, scores, joining)
        widths = self._widths_after(cache, torch.ones(ids.shape[1], dtype=torch.long, device=ids.device))
        ids, mask = torch.cat([ids, chosen[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        ended = [j for j, token in zip(joining, chosen.tolist()) if self._step(j.row, token, vocab)]
        going = torch.tensor([not j.row.done for j in joining])
        if bool(going.any()):
            check_layers(cache)
            rows = going.nonzero().flatten()
            select_rows(cache, rows.to(ids.device))
            self._join([j for j, go in zip(joining, going.tolist()) if go], ids[rows], mask[rows], widths, cache)
        return ended

    def _join(self, joining: list[ActiveRow], ids: torch.Tensor, mask: torch.Tensor, widths: torch.Tensor,
              cache: DynamicCache) -> None:
        if not self.active:
            self.active, self.ids, self.mask, self.widths, self.cache = joining, ids, mask, widths, cache
            return
        extra = ids.shape[1] - self.ids.shape[1]
        if extra > 0:  # the newcomers' prompts are longer than the batch so far: it gains masked steps on the left
            self.ids = torch.cat([self.ids.new_full((len(self), extra), self.pad), self.ids], 1)
            self.mask = torch.cat([self.mask.new_zeros(len(self), extra), self.mask], 1)
            self.widths = torch.cat([self.widths.new_ones(extra), self.widths])
            pad_leading_slots(self.cache, extra)
        length = self.ids.shape[1]
        missing = length - ids.shape[1]
        ends = torch.cumsum(self.widths, 0) - 1  # the last slot of every cached step
        join_rows(self.cache, cache, ends[missing + torch.arange(widths.numel(), device=ends.device)])
        self.ids = torch.cat([self.ids, torch.cat([ids.new_full((len(joining), missing), self.pad), ids], 1)])
        self.mask = torch.cat([self.mask, torch.cat([mask.new_zeros(len(joining), missing), mask], 1)])
        self.active += joining
        self._remember_widths()

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def step(self) -> list[ActiveRow]:
        """One decoding step of every row; returns the rows that ended (they leave the batch)."""
        scores = self._forward(self.ids, self.mask, self.cache, self.active)
        chosen = self._choose(self.ids, scores, self.active)
        self.phrase_steps = int((chosen >= self.model.vocab_size).sum())
        self.widths = self._widths_after(self.cache, torch.cat([self.widths, self.widths.new_ones(1)]))
        self.ids = torch.cat([self.ids, chosen[:, None]], 1)
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], 1)
        ended = [a for a, token in zip(self.active, chosen.tolist()) if self._step(a.row, token, self.model.vocab_size)]
        if ended:
            self._leave()
        return ended

    def _step(self, row: Row, token: int, vocab: int) -> bool:
        row.step(token, self._text, self.eos, vocab)
        return row.done

    def _text(self, ids: list[int]) -> str:
        return self.model.decode(ids, skip_special_tokens=True)

    def _leave(self) -> None:
        """Drop the rows that ended, then the slots no row attends to."""
        kept = [i for i, a in enumerate(self.active) if not a.row.done]
        self.active = [self.active[i] for i in kept]
        if not kept:
            self.ids = self.mask = self.widths = self.cache = None
            return
        rows = torch.tensor(kept, device=self.ids.device)
        self.ids, self.mask = self.ids[rows], self.mask[rows]
        select_rows(self.cache, rows)
        cached = self.widths.numel()
        unused = int(self.mask[:, :cached].any(0).long().argmax()) if bool(self.mask[:, :cached].any()) else cached
        if unused:
            drop_leading_slots(self.cache, int(self.widths[:unused].sum()))
            self.ids, self.mask, self.widths = self.ids[:, unused:], self.mask[:, unused:], self.widths[unused:]
        self._remember_widths()

    def compact(self) -> None:
        """Past ``SPARE_PHRASES`` phrases that no running row may use, drop them from the table and renumber the
        rows' phrase ids (call it once the rows that ended are read: their ids may name dropped phrases)."""
        table, vocab = self.model.phrase_table, self.model.vocab_size
        used = torch.unique(torch.cat([a.indices for a in self.active] or [torch.zeros(0, dtype=torch.long)]))
        if len(table) - used.numel() <= SPARE_PHRASES:
            return
        renumber = torch.full((len(table),), -1, dtype=torch.long)
        renumber[used] = torch.arange(used.numel())
        table.keep(used.tolist())
        if self.ids is None:
            return
        is_phrase = self.ids >= vocab
        self.ids = torch.where(is_phrase, vocab + renumber.to(self.ids.device)[(self.ids - vocab).clamp(min=0)], self.ids)
        for active in self.active:
            active.indices = renumber[active.indices]
            if active.keys is not None:
                keys = active.keys
                active.keys = StateKeys(keys.keys, renumber.to(keys.phrases.device)[keys.phrases], keys.threshold)
            active.row.ids = [vocab + int(renumber[i - vocab]) if i >= vocab else i for i in active.row.ids]

    def _widths_after(self, cache: DynamicCache, one_slot_each: torch.Tensor) -> torch.Tensor:
        """``(steps,)`` slots of every cached step, after a forward call: what the token read-back recorded on the
        cache, else one slot per step (``one_slot_each``)."""
        return getattr(cache, WIDTHS_ATTRIBUTE) if self.readback == "tokens" else one_slot_each

    def _remember_widths(self) -> None:
        """Record the batch's widths on its cache, where the token read-back reads them."""
        if self.readback == "tokens":
            setattr(self.cache, WIDTHS_ATTRIBUTE, self.widths)

    # ------------------------------------------------------------------ one forward and one choice
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache, rows: list[ActiveRow]) -> torch.Tensor:
        """``(B, V + P)`` float32 scores of the next id of every row, the ids the cache lacks fed."""
        model = self.model
        if self.readback == "tokens":
            inputs = model.token_readback_inputs(ids, past_key_values=cache, attention_mask=mask)
        else:  # one slot per step: phrases are fed as their input vectors
            cached = cache.get_seq_length()
            inputs = {"input_ids": ids[:, cached:], "attention_mask": mask, "past_key_values": cache,
                      "position_ids": position_ids_from_mask(mask)[:, cached:]}
        with model.state_gate(self._state_keys(rows)):
            out = model(**inputs, phrase_mask=self._phrase_masks(rows), use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].to(torch.float32)

    def _choose(self, ids: torch.Tensor, scores: torch.Tensor, rows: list[ActiveRow]) -> torch.Tensor:
        return choose(self._processors_for(rows)(ids, scores), self.do_sample)

    def _phrase_masks(self, rows: list[ActiveRow]) -> torch.Tensor:
        """``(B, P)``: each row's own phrases."""
        table = self.model.phrase_table
        key = (table.version, len(table), tuple(r.serial for r in rows))
        if key != self._masks_key:
            masks = torch.zeros(len(rows), len(table), dtype=torch.bool)
            for position, active in enumerate(rows):
                masks[position, active.indices] = True
            self._masks, self._masks_key = masks.to(self.model.device), key
        return self._masks

    def _row_keys(self, active: ActiveRow) -> StateKeys:
        """The keys of a joining row's phrases: its documents' states before each place one of them starts."""
        documents = active.admission.documents or []
        return state_keys(self.document_states, documents, self.model.phrase_table.token_ids, self.state_threshold,
                          rows=[0] * len(documents), allowed=[set(active.indices.tolist())], num_rows=1)

    def _state_keys(self, rows: list[ActiveRow]) -> StateKeys | None:
        """The batch's state keys, each row's own (None: no state gate)."""
        if self.state_threshold is None:
            return None
        table = self.model.phrase_table
        key = (table.version, len(table), tuple(r.serial for r in rows))
        if key != self._keys_key:
            keys = [r.keys for r in rows]
            owners = [torch.full((k.keys.shape[0],), n, dtype=torch.long) for n, k in enumerate(keys)]
            self._keys = StateKeys(torch.cat([k.keys for k in keys]), torch.cat([k.phrases for k in keys]),
                                   self.state_threshold, torch.cat(owners).to(self.model.device), len(rows))
            self._keys_key = key
        return self._keys

    def _processors_for(self, rows: list[ActiveRow]) -> LogitsProcessorList:
        """The phrase-aware processors over the current table (with the rows' contexts, in batch order), then the
        sampling warpers: ``generate()``'s list and order."""
        table = self.model.phrase_table
        key = (table.version, len(table), tuple(r.serial for r in rows))
        if key != self._processors_key:
            contexts = [r.admission.contexts for r in rows]
            gated = {"phrase_contexts": contexts} if any(c is not None for c in contexts) else {}
            processors = self.model.phrase_logits_processors(**self.phrase_settings, **gated)
            self._processors, self._processors_key = LogitsProcessorList([*processors, *self.warpers]), key
        return self._processors
