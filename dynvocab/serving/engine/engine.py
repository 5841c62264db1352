"""The engine: check a request against the model, then decode requests together, each row with its own phrase set; a
request joins the running batch at the next step and leaves it when it ends (``running_batch.RunningBatch``).
Requests with verified or grounded decoding run in batches of their own rule
(``dynvocab.decoding.verification.VerifiedBatch``), which they join between steps and leave when they end, alike. A
request's documents are read by the library's ``retrieval.DocumentReader``."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from retrieval import DocumentReader, PipelineConfig
from retrieval.corpus_drafts import corpus_drafts
from retrieval.document_states import attach_document_states, document_token_ids, stored_documents
from retrieval.timing import StageTimer

from ...decoding.citations import cited_share
from ...decoding.verification import VerifiedBatch, VerifiedRow, grounded_proposers
from ...model import DynamicVocabLM
from ...phrases.mixed_ids import Segment, segments as phrase_segments
from ...phrases.table import Phrase, PhraseTable
from ...states.keys import state_keys
from ...states.kv import DocumentKV
from ...states.store import DocumentStates
from ...tokens.padding import pad_id
from ..config import ServerConfig
from .errors import ApiError, invalid
from .requests import PIPELINE_SETTINGS, CompletionRequest, Document
from .rows import Row, StepListener
from .running_batch import Admission, RunningBatch

#: how often the first request of an empty batch looks for others while it waits
POLL_SECONDS = 0.001
#: a batch of verified or grounded decoding takes joining requests while its phrase table holds at most this many
#: phrases: each joining row adds its own, and every step scores them all (the ids are never renumbered, as the rows'
#: guards hold them); past it, new requests wait for the batch to end and start a fresh table
VERIFIED_TABLE_PHRASES = 16384


class CheckedRequest(NamedTuple):
    """What ``Engine.check`` makes of a request."""

    prompt_ids: list[int]
    phrases: list[Phrase]
    documents: list[dict]
    settings: PipelineConfig
    skipped_phrases: list[str]


@dataclass
class Job:
    """A checked request waiting for (or in) a batch; requests with equal ``key`` may share one."""

    request: CompletionRequest
    request_id: str
    prompt_ids: list[int]
    phrases: list[Phrase]
    documents: list[dict]
    settings: PipelineConfig
    key: tuple
    on_step: Callable[[dict], None]
    on_done: Callable[["Completion"], None]
    on_error: Callable[[ApiError], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: the request's phrases that are single tokens of the LM: left out (the LM writes them as tokens already)
    skipped_phrases: list[str] = field(default_factory=list)


@dataclass
class Completion:
    """One finished request: text, why it ended, segments with sources, counts and stage times (seconds)."""

    text: str
    finish_reason: str
    segments: list[dict]
    prompt_tokens: int
    completion_tokens: int
    phrase_steps: int
    num_phrases: int
    documents: list[dict]
    stages: dict[str, float]
    citations: list[dict] = field(default_factory=list)
    cited_share: float | None = None
    skipped_phrases: list[dict] = field(default_factory=list)


class Engine:
    """A ``DynamicVocabLM`` and the corpora it may retrieve from, decoding batches of ``Job`` s (one thread at a time)."""

    def __init__(self, model: DynamicVocabLM, corpora: dict[str, Any], model_name: str, config: ServerConfig) -> None:
        self.model, self.corpora, self.model_name, self.config = model, corpora, model_name, config
        self.eos = _eos_ids(model)
        # requests are checked on the event loop while the worker decodes: a tokenizer of their own, so the two threads
        # never share the Rust tokenizer (whose settings a call may change)
        self.tokenizer = copy.deepcopy(model.tokenizer)
        self.checker = PhraseTable(self.tokenizer, model.vocab_size, model.phrase_table.max_phrase_tokens)
        # the states of documents that state-gated requests brought or retrieved, each document read once, or read
        # from the store beside a corpus's index (`dynvocab document-states`)
        self.document_states = DocumentStates(model.lm)
        for corpus in corpora.values():
            attach_document_states(self.document_states, corpus)
        # grounded requests' first documents as keys and values read once (from a float32 store beside a corpus's
        # index, or kept in memory once read), where the LM's rotary embeddings let them move: None elsewhere
        self.document_kv = _document_kv(model.lm)
        for corpus in corpora.values() if self.document_kv is not None else ():
            attach_document_states(self.document_kv, corpus)

    # ------------------------------------------------------------------ checking, on the event loop
    def check(self, request: CompletionRequest) -> CheckedRequest:
        """The request's prompt ids, phrases, documents, decoding settings and the phrases left out; ``ApiError``
        (4xx) for what the schema cannot say alone: limits, the served model and corpora, phrases the phrase table
        refuses."""
        limits = self.config
        if request.model not in (None, self.model_name):
            raise invalid("model", request.model, f"this server serves {self.model_name!r} only",
                          f"send model={self.model_name!r} (GET /v1/models lists it) or leave it out", status=404)
        if not 1 <= request.max_tokens <= limits.max_tokens_limit:
            raise invalid("max_tokens", request.max_tokens, f"it must be 1..{limits.max_tokens_limit} on this server",
                          f"send max_tokens between 1 and {limits.max_tokens_limit}")
        if not request.prompt.strip():
            raise invalid("prompt", request.prompt, "the prompt is empty or only whitespace",
                          "send at least one word to continue")
        prompt_ids = self.tokenizer(request.prompt)["input_ids"]
        if len(prompt_ids) > limits.max_prompt_tokens:
            raise invalid("prompt", request.prompt, f"it has {len(prompt_ids)} tokens, more than this server's "
                          f"{limits.max_prompt_tokens}", "shorten the prompt")
        if len(request.stops) > 4 or any(not stop for stop in request.stops):
            raise invalid("stop", request.stop, "up to 4 stop strings, none empty", "send at most 4 non-empty strings")
        settings = self._settings(request)
        if settings.state_threshold is not None and not (request.documents or request.retrieve):
            raise invalid("state_threshold", settings.state_threshold, "the state gate lets a phrase compete where the "
                          "LM's state is close to its state before the phrase in a document, and this request has no "
                          "documents", "send documents or retrieve with it, or leave state_threshold out")
        if settings.document_kv and self.document_kv is None:
            raise invalid("document_kv", settings.document_kv, f"{type(self.model.lm).__name__} has no plain rotary "
                          "position embedding, so a document's keys and values cannot be read once and moved to where "
                          "a request reads it", "leave document_kv out, or send 0")
        if settings.document_kv and settings.read_tokens > self.document_kv.max_tokens:
            raise invalid("document_kv", settings.document_kv, f"documents read {settings.read_tokens} tokens long are "
                          f"longer than the {self.document_kv.max_tokens} whose keys and values this server keeps",
                          f"send read_tokens of at most {self.document_kv.max_tokens}, or document_kv 0")
        if settings.verify_top_k and request.readback == "vector":
            raise invalid("readback", request.readback, "verified decoding reads each phrase back as its tokens, the "
                          "only way the LM can judge them", "leave readback out, or verify_top_k and draft_tokens")
        phrases, skipped = self._phrases(request)
        return CheckedRequest(prompt_ids, phrases, self._documents(request), settings, skipped)

    def _phrases(self, request: CompletionRequest) -> tuple[list[Phrase], list[str]]:
        """The request's phrases as the table takes them, and those left out because they are single tokens of the
        LM (a user cannot know the tokenizer: " Augustus" is one token of GPT-2's, "Augustus" two)."""
        phrases = request.phrases or []
        if len(phrases) > self.config.max_phrases:
            raise invalid("phrases", f"<{len(phrases)} phrases>", f"at most {self.config.max_phrases} phrases per request",
                          "send fewer phrases, or documents to cut them from")
        table = self.checker
        special = set(self.tokenizer.all_special_ids)
        single = {text for text, ids in zip(phrases, table.tokenize(phrases))
                  if len(ids) == 1 and ids[0] not in special and text.strip()}
        try:
            kept = table.validate(table.with_mid_sentence_forms([p for p in phrases if p not in single]))
        except (TypeError, ValueError) as error:
            raise invalid("phrases", _offending(phrases, str(error)), str(error), "fix or drop that phrase") from None
        return [phrase for phrase, _ in kept], [p for p in phrases if p in single]

    def _documents(self, request: CompletionRequest) -> list[dict]:
        given, k = request.documents or [], request.retrieve or 0
        if len(given) + k > self.config.max_documents:
            raise invalid("documents", f"<{len(given)} documents, retrieve={k}>",
                          f"at most {self.config.max_documents} documents per request, sent and retrieved together",
                          "send fewer documents or a smaller retrieve")
        if (k or request.corpus is not None) and request.corpus not in (None, *self.corpora):
            served = sorted(self.corpora) or "none"
            raise invalid("corpus", request.corpus, f"the server was started with the corpora {served} only (a "
                          "request names a served corpus, never a path)", f"send corpus as one of {served}, or leave it out")
        if k and not self.corpora:
            raise invalid("retrieve", k, "this server was started with --index none",
                          "send documents instead, or restart the server with an index")
        return [_document(d, n) for n, d in enumerate(given)]

    def _settings(self, request: CompletionRequest) -> PipelineConfig:
        chosen = {name: getattr(request, name) for name in PIPELINE_SETTINGS if getattr(request, name) is not None}
        # grounded by default where there are documents to read, unless the request asks for the paper's verified mode
        grounded = request.grounded if request.grounded is not None else bool(
            (request.documents or request.retrieve) and not request.verify_top_k)
        try:
            return PipelineConfig(grounded=grounded, max_new_tokens=request.max_tokens, do_sample=not request.greedy,
                                  temperature=request.temperature or 1.0, top_p=request.top_p, **chosen)
        except (TypeError, ValueError) as error:
            raise ApiError(400, f"the phrase settings are refused: {error}", code="invalid_phrase_settings") from None

    def batch_key(self, request: CompletionRequest, settings: PipelineConfig, request_id: str) -> tuple:
        """Requests with equal keys decode alike and may share a batch: the paper's decoding in the running batch,
        verified and grounded decoding each in batches of their own rule. A seeded sampled request decodes alone, and
        so does a verified or grounded one with a state gate (the gate is the model's, not a row's)."""
        verified = bool(settings.verify_top_k or settings.grounded)
        alone = request_id if (not request.greedy and request.seed is not None) or (
            verified and settings.state_threshold is not None) else None
        rule = (settings.grounded, settings.gamma if settings.grounded else None, settings.verify_top_k)
        generation = tuple(sorted(settings.generation_kwargs().items()))
        return request.readback, generation, settings.state_threshold, rule, alone

    # ------------------------------------------------------------------ decoding, on the worker thread
    def run(self, jobs: list[Job]) -> list[Completion]:
        """Decode ``jobs`` (one key) together, with no other request joining; each job hears its steps and its end."""
        waiting = list(jobs)
        completions: dict[int, Completion] = {}

        def take(key: tuple | None, room: int) -> list[Job]:
            taken, waiting[:] = waiting[:room], waiting[room:]
            return taken

        self.decode(take, lambda job, completion: completions.__setitem__(id(job), completion))
        return [completions[id(job)] for job in jobs]

    @torch.no_grad()
    def decode(self, take: Callable[[tuple | None, int], list[Job]], finished: Callable[[Job, Completion], None],
               on_step: Callable[[int, int, float], None] | None = None, wait: float = 0.0) -> None:
        """Decode until ``take`` has nothing more: between steps, ``take(key, room)`` hands over up to ``room`` jobs
        of the running batch's ``key`` (None when the batch is empty: any key) and they join at once; each job
        that ends goes to ``finished`` (after its own ``on_done``) and frees its row. ``on_step(rows, phrases,
        seconds)`` hears every decoding step: its rows, how many wrote a phrase, how long it took. The first jobs
        of an empty batch wait ``wait`` seconds for others of their key, while their phrases are prepared."""
        batch, key = None, None
        while True:
            room = self.config.max_batch_size - (len(batch) if batch else 0)
            jobs = take(key, room) if room > 0 else []
            if not jobs and not batch:
                return
            ended = []
            if not batch and (jobs[0].settings.verify_top_k or jobs[0].settings.grounded):  # a batch of one rule
                first = jobs[0].key
                admissions = self._gathered(jobs, lambda room: take(first, room), room, time.perf_counter() + wait)
                self._decode_verified(admissions, lambda room: take(first, room), finished, on_step)
                continue
            if not batch:
                key = jobs[0].key
                settings = jobs[0].settings
                batch = RunningBatch(self.model, settings.generation_kwargs(), jobs[0].request.readback, self.eos,
                                     pad_id(self.model.tokenizer), settings.state_threshold, self.document_states)
                admissions = self._gathered(jobs, lambda room: take(key, room), room, time.perf_counter() + wait)
            else:
                admissions = self._admissions(jobs) if jobs else []
            if admissions:
                ended = batch.admit(admissions)
                for admission in admissions:
                    admission.handle.stages["encode"] = batch.encode_seconds / len(admissions)
            if len(batch):
                start, rows = time.perf_counter(), len(batch)
                ended += batch.step()
                if on_step is not None:
                    on_step(rows, batch.phrase_steps, time.perf_counter() - start)
            for active in ended:
                prepared = active.admission.handle
                prepared.stages["decode"] = time.perf_counter() - active.started
                completion = self._completion(prepared, active.row)
                prepared.job.on_done(completion)
                finished(prepared.job, completion)
            if ended:
                batch.compact()
            if not len(batch):
                batch, key = None, None

    def _decode_verified(self, admissions: list[Admission], take: Callable[[int], list[Job]],
                         finished: Callable[[Job, Completion], None],
                         stepped: Callable[[int, int, float], None] | None = None) -> None:
        """Decode requests of one key with verified or grounded decoding in a ``VerifiedBatch``: each row reads its
        own documents and drafts from them, and each step's kept ids go to its row as they come, so a row streams,
        stops, is cancelled and finishes as a running batch's row does. Between steps ``take(room)`` hands over
        jobs of the key, which join at once (while the table has room: ``VERIFIED_TABLE_PHRASES``);
        ``stepped(rows, phrases, seconds)`` hears each step, as ``decode``'s ``on_step``."""
        model, table = self.model, self.model.phrase_table
        settings = admissions[0].handle.job.settings  # one key: one rule
        last = time.perf_counter()

        def batch_step(written: list[list[int]]) -> None:
            nonlocal last
            if stepped is not None:
                phrases = sum(token >= model.vocab_size for ids in written for token in ids)
                stepped(len(written), phrases, time.perf_counter() - last)
            last = time.perf_counter()

        batch = VerifiedBatch(model, accept_top_k=settings.verify_top_k or 1,
                              gamma=settings.gamma if settings.grounded else None, do_sample=settings.do_sample,
                              top_p=settings.top_p, temperature=settings.temperature, on_batch_step=batch_step)
        joined: list[tuple[Admission, float]] = []  # by row number: each request and when it joined
        ended: set[int] = set()

        def end(number: int) -> None:
            """Hand row ``number``'s completion over as soon as it ends, not when the batch does."""
            ended.add(number)
            admission, started = joined[number]
            admission.handle.stages["decode"] = time.perf_counter() - started
            completion = self._completion(admission.handle, admission.row)
            admission.handle.job.on_done(completion)
            finished(admission.handle.job, completion)

        def heard(number: int) -> Callable[[list[int]], bool]:
            row = joined[number][0].row

            def on_step(ids: list[int]) -> bool:
                for token in ids:
                    row.step(token, lambda new: model.decode(new, skip_special_tokens=True), self.eos, model.vocab_size)
                    if row.done:
                        end(number)
                        return True
                return False

            return on_step

        def rows_of(group: list[Admission]) -> list[tuple[VerifiedRow, list[list[int]]]]:
            """``group`` 's phrases added to the table and its rows made (each with the documents it takes as keys and
            values read once), numbered on from the rows before."""
            start, rows = time.perf_counter(), []
            for admission in group:
                checked = table.validate(admission.phrases)
                table.add_validated(checked)
                rows.append(self._verified_row(admission, sorted({table.index_of_ids(ids) for _, ids in checked})))
            model.refresh_phrase_vectors(only_new=True)
            for admission in group:
                admission.handle.stages["encode"] = (time.perf_counter() - start) / len(group)
            numbers = range(len(joined), len(joined) + len(group))
            joined.extend((admission, time.perf_counter()) for admission in group)
            for number, (row, _) in zip(numbers, rows):
                row.on_step = heard(number)
            if group[0].seed is not None:
                torch.manual_seed(group[0].seed)
            return rows

        if len(table) or table.num_rows is not None:
            table.keep([])  # a fresh table (the phrase cache keeps the vectors)
        first = rows_of(admissions)
        keys = None  # a state gate decodes alone (batch_key)
        if settings.state_threshold is not None and admissions[0].documents:
            keys = state_keys(self.document_states, admissions[0].documents, table.token_ids, settings.state_threshold)
        with model.state_gate(keys):
            self._admit(batch, first, max(admission.row.max_tokens for admission in admissions))
            while batch:
                room = self.config.max_batch_size - len(batch)
                jobs = take(room) if room > 0 and len(table) <= VERIFIED_TABLE_PHRASES else []
                if jobs:
                    group = self._admissions(jobs)
                    self._admit(batch, rows_of(group), max(admission.row.max_tokens for admission in group))
                if batch:
                    for number in batch.step():
                        if number not in ended:  # ended by the decoding itself (its steps), not by its row
                            end(number)
        for number in range(len(joined)):
            if number not in ended:  # asked for no step, or ended while it was read
                end(number)

    def _admit(self, batch: VerifiedBatch, rows: list[tuple[VerifiedRow, list[list[int]]]], max_tokens: int) -> None:
        """Add ``rows`` to ``batch`` in their order: a row with documents to take as keys and values read once
        (``DocumentKV``) on its own, with their cache, so the LM reads only the rest of its context and its prompt;
        the rows between such rows together."""
        together: list[VerifiedRow] = []
        for row, stored in rows:
            if not stored:
                together.append(row)
                continue
            if together:
                batch.admit(together, max_tokens)
                together = []
            batch.admit([row], max_tokens, self.document_kv.cache(stored))
        if together:
            batch.admit(together, max_tokens)

    def _verified_row(self, admission: Admission, phrases: list[int]) -> tuple[VerifiedRow, list[list[int]]]:
        """One request as a row of verified or grounded decoding: its prompt (after its documents, grounded), its
        phrases (table indices), the drafts from its documents and its own safeguards; and the token ids of the first
        documents it reads that come as keys and values read once (``stored_documents``; none: [])."""
        model, prepared = self.model, admission.handle
        settings = prepared.job.settings
        reader = DocumentReader(model, settings)
        read = reader.read(prepared.documents) if settings.grounded else prepared.documents
        corpus = None
        if settings.grounded and settings.fill_tokens and self.corpora:  # lossless: any served corpus may fill
            corpus = corpus_drafts(self.corpora[prepared.job.request.corpus or next(iter(self.corpora))], model.tokenizer)
        drafter = reader.drafter(read, corpus) if settings.draft_tokens else None
        gate = {"phrase_contexts": admission.contexts} if admission.contexts is not None else {}
        if not settings.grounded:
            return VerifiedRow(admission.prompt_ids, draft=drafter.draft if drafter else None,
                               logits_processor=model.phrase_processors_in(settings.generation_kwargs() | gate),
                               phrases=phrases), []
        stored = stored_documents(settings, self.document_kv, self.corpora.values()) if prepared.documents else 0
        parts = reader.context_parts(prepared.documents, stored)
        context = [token for part in parts for token in part]
        prompt = model.tokenizer(prepared.job.request.prompt, add_special_tokens=not context)["input_ids"]
        gate["no_repeat_ngram_scope"] = "new"  # the n-gram guard judges the continuation: copying documents is allowed
        processors = model.phrase_processors_in(settings.generation_kwargs() | gate)
        return VerifiedRow(prompt, context, logits_processor=processors, phrases=phrases,
                           **grounded_proposers(drafter, settings.relax_after)), parts[:stored]

    def _gathered(self, jobs: list[Job], take: Callable[[int], list[Job]], room: int, deadline: float) -> list[Admission]:
        """``jobs`` and those of their key that arrive until ``deadline`` (or until ``room`` is full), prepared as
        they come: a request's retrieval and phrase cutting overlap the wait for others."""
        admissions = self._admissions(jobs)
        while len(admissions) < room:
            more = take(room - len(admissions))
            if more:
                admissions += self._admissions(more)
            elif time.perf_counter() < deadline:
                time.sleep(min(POLL_SECONDS, max(deadline - time.perf_counter(), 0.0)))
            else:
                break
        return admissions

    def _admissions(self, jobs: list[Job]) -> list[Admission]:
        """Each job's phrases, cut from its documents (sent and retrieved), and its phrase contexts; the stage
        times of the group are shared out evenly."""
        timer = StageTimer()
        with timer.stage("retrieve"):
            documents = [job.documents + found for job, found in zip(jobs, self._retrieved(jobs))]
        with timer.stage("extract"):
            readers = [DocumentReader(self.model, job.settings) for job in jobs]
            rows = [job.phrases + (reader.candidates(docs) if docs else [])
                    for job, reader, docs in zip(jobs, readers, documents)]
            contexts = [reader.phrase_contexts(docs, phrases) if docs else None
                        for reader, docs, phrases in zip(readers, documents, rows)]
            keyed = [document_token_ids(self.model.tokenizer, docs) if job.settings.state_threshold is not None and docs
                     else None for job, docs in zip(jobs, documents)]
        stages = {stage: seconds / len(jobs) for stage, seconds in timer.totals().items()}
        admissions = []
        for job, docs, phrases, context, document_ids in zip(jobs, documents, rows, contexts, keyed):
            sources = {phrase.text: phrase.source for phrase in reversed(phrases)}  # the first source of a text wins
            prepared = _Prepared(job, docs, len(phrases), sources, dict(stages))
            row = Row(job.request.max_tokens, job.request.stops, self._listener(job, prepared), job.cancelled)
            seed = job.request.seed if not job.request.greedy else None
            admissions.append(Admission(job.prompt_ids, phrases, context, row, seed, prepared, document_ids))
        return admissions

    def _listener(self, job: Job, prepared: _Prepared) -> StepListener:
        """The row's step listener: each step's text as a segment dict, a phrase's with its source, to ``job.on_step``."""
        table, by_id = self.model.phrase_table, {str(d.get("id")): d for d in prepared.documents}

        def on_step(text: str, phrase: int | None) -> None:
            if phrase is None:
                job.on_step({"type": "token", "text": text})
                return
            entry = table.phrases[phrase]
            source = prepared.sources.get(entry.text, entry.source)
            job.on_step(_segment(Segment(text, True, source), by_id, entry.text))

        return on_step

    def _retrieved(self, jobs: list[Job]) -> list[list[dict]]:
        """Each job's retrieved documents; the jobs that search the same corpus for the same k share one search
        (one encoder pass over their prompts)."""
        found: list[list[dict]] = [[] for _ in jobs]
        groups: dict[tuple, list[int]] = {}
        for position, job in enumerate(jobs):
            if job.request.retrieve:
                groups.setdefault((job.request.corpus or next(iter(self.corpora)), job.request.retrieve), []).append(position)
        for (corpus, k), positions in groups.items():
            results = self.corpora[corpus].search_documents([jobs[i].request.prompt for i in positions], k=k)
            for position, documents in zip(positions, results):
                found[position] = documents
        return found

    def _completion(self, prepared: _Prepared, row: Row) -> Completion:
        new = [token for token in row.ids if token not in self.eos]
        segments = phrase_segments(new, self.model.tokenizer, self.model.phrase_table, True, prepared.sources)
        by_id = {str(d.get("id")): d for d in prepared.documents}
        grounded = prepared.job.settings.grounded
        reader = DocumentReader(self.model, prepared.job.settings)
        read = reader.read(prepared.documents)
        # a cited span cut by a stop string is left out
        citations = [c for c in reader.citations(prepared.documents, new)
                     if c.end <= len(row.text) and row.text[c.start : c.end] == c.text] if grounded else []
        return Completion(
            citations=[{"start": c.start, "end": c.end, "text": c.text, "document": str(read[c.document].get("id")),
                        "title": read[c.document].get("title", ""), "offset": c.document_start} for c in citations],
            cited_share=cited_share(citations, row.text) if grounded else None,
            text=row.text, finish_reason=row.finish_reason,
            segments=[_segment(s, by_id) for s in _cut(segments, len(row.text))],
            prompt_tokens=len(prepared.job.prompt_ids), completion_tokens=len(row.ids),
            phrase_steps=sum(token >= self.model.vocab_size for token in new), num_phrases=prepared.num_phrases,
            documents=[{k: d[k] for k in ("id", "title", "score") if k in d} for d in prepared.documents],
            stages=prepared.stages,
            skipped_phrases=[{"phrase": text, "reason": "a single token of the LM's vocabulary: the LM writes it as "
                              "that token already"} for text in prepared.job.skipped_phrases],
        )


@dataclass
class _Prepared:
    """A job with what it joins with: its documents, how many phrases, phrase text -> source, stage seconds."""

    job: Job
    documents: list[dict]
    num_phrases: int
    sources: dict[str, str | None]
    stages: dict[str, float]


def _eos_ids(model: DynamicVocabLM) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def _document(document: str | Document, position: int) -> dict:
    if isinstance(document, str):
        return {"id": str(position), "title": "", "text": document}
    return {"id": document.id or str(position), "title": document.title or "", "text": document.text}


def _offending(phrases: list[str], message: str) -> str:
    """The phrase an error message quotes (the table names it by its repr), else the list's start."""
    return next((p for p in phrases if repr(p) in message or repr(p.strip()) in message), phrases[:3])


def _cut(segments: list[Segment], length: int) -> list[Segment]:
    """``segments`` cut to their first ``length`` characters (a stop string cuts the text)."""
    kept, used = [], 0
    for segment in segments:
        if used >= length:
            break
        if used + len(segment.text) > length:
            segment = Segment(segment.text[: length - used], segment.is_phrase, segment.source)
        kept.append(segment)
        used += len(segment.text)
    return kept


def _segment(segment: Segment, documents: dict[str, dict], phrase: str | None = None) -> dict:
    """A segment as JSON: a phrase names its source document and the character offset of ``phrase`` (default: the
    segment's text, stripped) in it; a phrase the request sent itself has no source."""
    if not segment.is_phrase:
        return {"type": "token", "text": segment.text}
    document = documents.get(segment.source) if segment.source is not None else None
    source = None
    if document is not None:
        offset = document["text"].find((phrase or segment.text).strip())
        source = {"document": segment.source, "title": document.get("title", ""), "offset": offset}
    return {"type": "phrase", "text": segment.text, "source": source}


def _document_kv(lm: torch.nn.Module) -> DocumentKV | None:
    """The LM's ``DocumentKV``, or None for an LM without plain rotary position embeddings (GPT-2)."""
    try:
        return DocumentKV(lm)
    except ValueError:
        return None
