"""Prompt -> top-k documents -> phrases -> dynamic-vocabulary generation, timed by stage."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from transformers import StoppingCriteriaList

from dynvocab import DynamicVocabLM, Phrase, Segment
from dynvocab.decoding import (
    CharacterBudget,
    Citation,
    DocumentDrafter,
    VerifiedBatch,
    VerifiedOutput,
    VerifiedRow,
    cited_share,
    generate_continuations,
    generate_verified_batch,
    grounded_proposers,
)
from dynvocab.states import DocumentStates, StateKeys, row_state_keys
from dynvocab.states.kv import DocumentKV
from dynvocab.tokens import pad_id

from .config import PipelineConfig
from .corpus_drafts import corpus_drafts
from .document_states import attach_document_states, document_token_ids, stored_documents
from .index.dense import DocumentIndex
from .phrase_vectors import attach_phrase_vectors
from .reading import DocumentReader
from .timing import STAGES, StageTimer

#: LM -> dynvocab.states.store.DocumentStates, made by the first request with a state gate on any pipeline of it
_DOCUMENT_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: LM -> dynvocab.states.kv.DocumentKV, made by the first request with ``document_kv`` on any pipeline of it
_DOCUMENT_KV: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def character_budget(model: DynamicVocabLM, prompt_length: int, max_chars: int | None) -> StoppingCriteriaList:
    return StoppingCriteriaList([CharacterBudget(model.decode, prompt_length, max_chars)] if max_chars else [])


@dataclass
class PipelineResult:
    """One answered prompt: the continuation, its segments with sources, and the time of each stage."""

    prompt: str
    text: str
    segments: list[Segment]
    documents: list[dict]
    num_phrases: int
    steps: int
    latency: dict[str, float]
    citations: list[Citation] = field(default_factory=list)
    kept_spans: list[int] = field(default_factory=list)  # the tokens each step kept beyond the LM's own (grounded)
    grounded: bool = False

    @property
    def copied_tokens(self) -> int:
        """Tokens kept from drafts and phrases beyond the LM's own (grounded decoding)."""
        return sum(self.kept_spans)

    @property
    def phrase_steps(self) -> int:
        return sum(s.is_phrase for s in self.segments)

    @property
    def cited_share(self) -> float:
        """The share of the continuation's non-space characters in cited spans."""
        return cited_share(self.citations, self.text)

    def marked(self, open_mark: str = "[", close_mark: str = "]") -> str:
        """The continuation with cited spans (grounded decoding) or else phrase spans marked and numbered by their
        source document."""
        if self.citations:
            parts, last = [], 0
            for c in self.citations:
                parts += [self.text[last : c.start], f"{open_mark}{c.text}{close_mark}^{c.document + 1}"]
                last = c.end
            return "".join(parts + [self.text[last:]])
        sources = list(dict.fromkeys(s.source for s in self.segments if s.is_phrase and s.source))
        parts = [
            f"{open_mark}{s.text}{close_mark}" + (f"^{sources.index(s.source) + 1}" if s.source in sources else "")
            if s.is_phrase else s.text
            for s in self.segments
        ]
        return "".join(parts)

    def sources(self) -> list[str]:
        """What ``marked()``'s numbers stand for, one line each: the cited documents with the characters where each
        cited span starts in them, or the phrases' source documents."""
        if self.citations:
            lines = []
            for number in sorted({c.document for c in self.citations}):
                document = self.documents[number]
                starts = ", ".join(str(c.document_start) for c in self.citations if c.document == number)
                lines.append(f"^{number + 1} {document.get('title') or document.get('id')} (characters {starts})")
            return lines
        phrased = dict.fromkeys(s.source for s in self.segments if s.is_phrase and s.source)
        return [f"^{number} {source}" for number, source in enumerate(phrased, 1)]

    def to_dict(self) -> dict:
        result = asdict(self)
        result["documents"] = [{k: d[k] for k in ("id", "title", "score") if k in d} for d in self.documents]
        result["cited_share"], result["copied_tokens"] = self.cited_share, self.copied_tokens
        return result


def check_prompts(prompts: Sequence[str]) -> None:
    """Refuse a prompt that is not text or holds none: retrieval and generation both need something to go on."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of str, got {type(prompts).__name__}; pass [prompt]")
    for number, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise TypeError(f"prompt {number} is {type(prompt).__name__}, not str; pass the prompt's text")
        if not prompt.strip():
            raise ValueError(f"prompt {number} is empty ({prompt!r}): retrieval and generation need text to continue; "
                             "pass a prompt with at least one word")


class PhrasePipeline(DocumentReader):
    """Retrieval-augmented generation with a dynamic phrase vocabulary: a ``DocumentReader`` that retrieves first.

    Each request retrieves the top-k documents for the prompt, cuts phrases from them
    (each remembering its document), plugs them into ``model`` and generates; every
    stage is timed. With ``config.realtime`` phrases join during decoding. When the index
    folder holds phrase vectors (``dynvocab phrase-vectors``), the model reads them
    instead of encoding those phrases; when it holds the LM's document states
    (``dynvocab document-states``), the state gate reads them instead of the LM.
    """

    def __init__(self, model: DynamicVocabLM, index: DocumentIndex, config: PipelineConfig | None = None) -> None:
        super().__init__(model, config)
        self.index = index
        if self.config.max_phrases:  # vectors computed beside the index, when it has them and phrases are cut
            attach_phrase_vectors(model, index)

    def document_kv(self) -> DocumentKV:
        """The LM's documents' keys and values, one ``DocumentKV`` per LM for every pipeline on it (a document is read
        once), reading the store beside the index when there is one (``dynvocab document-kv``)."""
        lm = self.model.lm
        if lm not in _DOCUMENT_KV:
            _DOCUMENT_KV[lm] = DocumentKV(lm)
        attach_document_states(_DOCUMENT_KV[lm], self.index)
        return _DOCUMENT_KV[lm]

    def stored_documents(self) -> int:
        """How many of the read documents come as keys and values read once (``retrieval.document_states.
        stored_documents``): ``config.document_kv``, or with None 1 where the index keeps them beside it in float32
        for this LM, else 0."""
        try:
            kv = self.document_kv() if self.config.grounded and self.config.document_kv is None else None
        except ValueError:  # an LM without rotary embeddings cannot take stored keys
            kv = None
        return stored_documents(self.config, kv, [self.index])

    def state_keys(self, documents: list[list[dict]], phrases: list[list[Phrase]]) -> StateKeys | None:
        """With ``config.state_threshold``, the keys of each prompt's phrases in its own documents, once the phrases
        are set on the model (``generate``'s ``phrase_state_keys``, ``dynvocab.states.keys``); None when it is off."""
        c, model = self.config, self.model
        if c.state_threshold is None:
            return None
        if model.lm not in _DOCUMENT_STATES:  # one per LM, for every pipeline on it: a document is read once
            _DOCUMENT_STATES[model.lm] = DocumentStates(model.lm)
        states = _DOCUMENT_STATES[model.lm]
        attach_document_states(states, self.index)  # states computed beside the index, when it has them
        ids = [document_token_ids(model.tokenizer, found) for found in documents]
        return row_state_keys(states, model.phrase_table, ids,
                              [[p.text for p in chosen] for chosen in phrases], c.state_threshold)

    @torch.no_grad()
    def __call__(self, prompt: str) -> PipelineResult:
        check_prompts([prompt])
        if not self.config.realtime:
            return self.batch([prompt])[0]
        timer = self._timer()
        with timer.stage("retrieve"):
            documents = self.index.search_documents([prompt], k=self.config.top_k)[0]
        with timer.stage("extract"):
            phrases = self.candidates(documents)
            contexts = self.phrase_contexts(documents, phrases)
        prompt_ids = self.model.tokenizer(prompt, return_tensors="pt").input_ids.to(self.model.device)
        ids = self._generate_realtime(prompt_ids, phrases, contexts, timer)
        new = ids[0, prompt_ids.shape[1] :].tolist()
        return self._result(prompt, new, documents, len(phrases), len(new), timer.totals())

    @torch.no_grad()
    def batch(self, prompts: list[str], max_chars: Sequence[int] | None = None) -> list[PipelineResult]:
        """Answer ``prompts`` in one left-padded batch, each row with its own phrase set.

        ``max_chars`` gives each prompt its own character budget (default:
        ``config.max_chars``). Stage times are the batch's, split evenly over its prompts.
        """
        c, model = self.config, self.model
        check_prompts(prompts)
        if c.realtime:
            raise ValueError("real-time mode answers one prompt at a time; call the pipeline on each prompt")
        timer = self._timer()
        with timer.stage("retrieve"):
            documents = self.index.search_documents(prompts, k=c.top_k)
        with timer.stage("extract"):
            phrases = [self.candidates(found) for found in documents]
            contexts = [self.phrase_contexts(found, row) for found, row in zip(documents, phrases)]
            corpus = corpus_drafts(self.index, model.tokenizer) if c.grounded and c.fill_tokens else None
            drafters = [self.drafter(self.read(found) if c.grounded else found, corpus) for found in documents] \
                if c.draft_tokens else None
        gate = {"phrase_contexts": contexts} if c.context_tokens else {}
        with timer.stage("encode"):
            model.set_phrases(phrases if len(prompts) > 1 else phrases[0], mid_sentence_forms=False)
            keys = self.state_keys(documents, phrases)
        if keys is not None:
            gate["phrase_state_keys"] = keys
        budgets = max_chars if max_chars is not None else [c.max_chars] * len(prompts) if c.max_chars else None
        spans: list[list[int]] = [[] for _ in prompts]
        with timer.stage("decode"):
            if c.grounded:
                outputs = self._generate_grounded(prompts, documents, budgets, contexts, drafters, keys)
                new = [out.sequences[0, length:].tolist() for out, length in outputs]
                steps, spans = [out.steps for out, _ in outputs], [out.kept_spans for out, _ in outputs]
            elif c.verify_top_k:
                new, steps = self._generate_verified(prompts, budgets, contexts, drafters, keys)
            else:
                new = generate_continuations(
                    model, model.tokenizer(prompts)["input_ids"], pad_id(model.tokenizer), c.max_new_tokens,
                    decode=model.decode, max_chars=budgets, **c.generation_kwargs(), **gate,
                )
                steps = [len(ids) for ids in new]
        shares = {stage: seconds / len(prompts) for stage, seconds in timer.totals().items()}
        rows = zip(prompts, new, documents, map(len, phrases), steps)
        results = [self._result(*fields, shares, row=i if len(prompts) > 1 else None) for i, fields in enumerate(rows)]
        if c.grounded:
            for result, ids, kept in zip(results, new, spans):
                result.citations, result.kept_spans = self.citations(result.documents, ids), kept
                result.grounded = True
        return results

    def _generate_verified(self, prompts: list[str], budgets: Sequence[int] | None, contexts: list[dict | None],
                           drafters: list[DocumentDrafter] | None,
                           keys: StateKeys | None = None) -> tuple[list[list[int]], list[int]]:
        """The prompts by ``generate_verified_batch``, each row with its own phrases: the new ids and the steps they
        took."""
        c, model = self.config, self.model
        rows = []
        for row, prompt in enumerate(prompts):
            gate = {"phrase_contexts": contexts[row]} if contexts[row] is not None else {}
            ids = model.tokenizer(prompt)["input_ids"]
            rows.append(VerifiedRow(
                ids, row=row if len(prompts) > 1 else None, draft=drafters[row].draft if drafters else None,
                logits_processor=model.phrase_processors_in(c.generation_kwargs() | gate),
                stopping_criteria=character_budget(model, len(ids), budgets[row] if budgets is not None else None)))
        outputs = self._decode_rows(rows, keys, accept_top_k=c.verify_top_k)
        return [out.sequences[0, len(row.input_ids) :].tolist() for out, row in zip(outputs, rows)], \
            [out.steps for out in outputs]

    def _generate_grounded(self, prompts: list[str], documents: list[list[dict]], budgets: Sequence[int] | None,
                           contexts: list[dict | None], drafters: list[DocumentDrafter] | None,
                           keys: StateKeys | None = None) -> list[tuple[VerifiedOutput, int]]:
        """The prompts by ``generate_verified_batch``, each with its documents in the LM's context and the grounded
        rule: each output and the prompt's length in it."""
        c, model = self.config, self.model
        # the n-gram guard judges what this call writes: the continuation may copy the documents, never repeat itself
        kwargs, rows = c.generation_kwargs() | {"no_repeat_ngram_scope": "new"}, []
        stored = self.stored_documents()
        parts = [self.context_parts(found, stored) for found in documents]
        for row, (prompt, found) in enumerate(zip(prompts, documents)):
            gate = {"phrase_contexts": contexts[row]} if contexts[row] is not None else {}
            context = [token for part in parts[row] for token in part]
            ids = model.tokenizer(prompt, add_special_tokens=not context)["input_ids"]
            rows.append(VerifiedRow(
                ids, context, row if len(prompts) > 1 else None,
                logits_processor=model.phrase_processors_in(kwargs | gate),
                stopping_criteria=character_budget(model, len(ids), budgets[row] if budgets is not None else None),
                **grounded_proposers(drafters[row] if drafters else None, c.relax_after)))
        caches = [self.document_kv().cache(read[:stored]) for read in parts] if stored else None
        outputs = self._decode_rows(rows, keys, caches, gamma=c.gamma)
        return [(out, len(row.input_ids)) for out, row in zip(outputs, rows)]

    def _decode_rows(self, rows: list[VerifiedRow], keys: StateKeys | None, caches: list | None = None,
                     **rule) -> list[VerifiedOutput]:
        """``rows`` in one batch by ``generate_verified_batch``; with ``caches`` (each row's documents' keys and
        values, read before its prompt) each row is read on its own and joins the batch; with state keys (a per-row
        gate on the model) one row at a time."""
        c, model = self.config, self.model
        settings = {"do_sample": c.do_sample, "top_p": c.top_p, "temperature": c.temperature, **rule}
        if keys is None and caches is None:
            return generate_verified_batch(model, rows, c.max_new_tokens, **settings)
        if keys is None:
            batch = VerifiedBatch(model, **settings)
            for row, cache in zip(rows, caches):
                batch.admit([row], c.max_new_tokens, cache)
            while batch:
                batch.step()
            return batch.outputs()
        outputs = []
        for number, row in enumerate(rows):
            cache = {"past_key_values": caches[number]} if caches is not None else {}
            with model.state_gate(keys.for_row(number)):
                outputs += generate_verified_batch(model, [row], c.max_new_tokens, **settings, **cache)
        return outputs

    def _timer(self) -> StageTimer:
        """Stage timing; on a GPU queued kernels are waited for, so each stage is charged its own work."""
        return StageTimer(synchronize=torch.cuda.synchronize if self.model.device.type == "cuda" else None)

    def _result(self, prompt: str, new: list[int], documents: list[dict], num_phrases: int, steps: int,
                latency: dict, row: int | None = None) -> PipelineResult:
        segments = self.model.segments(new, skip_special_tokens=True, row=row)
        return PipelineResult(
            prompt=prompt, text="".join(s.text for s in segments), segments=segments, documents=documents,
            num_phrases=num_phrases, steps=steps, latency={stage: latency.get(stage, 0.0) for stage in STAGES},
        )

    def _generate_realtime(self, prompt_ids: torch.Tensor, phrases: list[Phrase], contexts: dict | None,
                           timer: StageTimer) -> torch.Tensor:
        """Decode ``realtime_every`` steps at a time, adding the next share of candidates before each chunk."""
        c, model = self.config, self.model
        chunk = max(1, round(len(phrases) * c.realtime_fraction))
        ids, cache, added = prompt_ids, None, 0
        gate = {"phrase_contexts": contexts} if contexts is not None else {}
        with timer.stage("encode"):
            model.set_phrases([], mid_sentence_forms=False)
        while ids.shape[1] - prompt_ids.shape[1] < c.max_new_tokens:
            with timer.stage("encode"):
                if c.drop_unused and added:
                    ids = self._drop_unused(ids, prompt_ids.shape[1])
                model.add_phrases(phrases[added : added + chunk], mid_sentence_forms=False)
                added += chunk
            steps = min(c.realtime_every, c.max_new_tokens - (ids.shape[1] - prompt_ids.shape[1]))
            with timer.stage("decode"):
                out = model.generate(
                    ids, past_key_values=cache, max_new_tokens=steps, return_dict_in_generate=True,
                    stopping_criteria=character_budget(model, prompt_ids.shape[1], c.max_chars), **c.generation_kwargs(),
                    **gate,
                )
            finished = out.sequences.shape[1] - ids.shape[1] < steps
            ids, cache = out.sequences, out.past_key_values
            if finished:
                break
        return ids

    def _drop_unused(self, ids: torch.Tensor, prompt_length: int) -> torch.Tensor:
        """Remove phrases not used so far and renumber the phrase ids already generated."""
        model, vocab = self.model, self.model.vocab_size
        used = {int(i) - vocab for i in ids[0, prompt_length:] if i >= vocab}
        texts = [p.text for p in model.phrase_table.phrases]
        model.remove_phrases([t for i, t in enumerate(texts) if i not in used])
        renumber = torch.arange(vocab + len(texts), device=ids.device)
        for old in used:
            renumber[vocab + old] = model.phrase_table.id_of(texts[old])
        return renumber[ids]
