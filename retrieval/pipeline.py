"""Prompt -> top-k documents -> phrases -> dynamic-vocabulary generation, timed by stage."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from transformers import StoppingCriteriaList

from dynvocab import DynamicVocabLM, Phrase, Segment
from dynvocab.citations import Citation, cite, cited_share
from dynvocab.config import check_at_least, check_field_types
from dynvocab.drafting import DocumentDrafter
from dynvocab.generation import generate_continuations
from dynvocab.padding import pad_id
from dynvocab.state_keys import StateKeys, row_state_keys
from dynvocab.state_store import DocumentStates
from dynvocab.stopping import CharacterBudget
from dynvocab.verification import VerifiedOutput, draft_step_cost, generate_grounded, generate_verified

from .document_states import attach_document_states, document_token_ids
from .index.dense import DocumentIndex
from .phrase_vectors import attach_phrase_vectors
from .phrases import document_contexts, extract_phrases, tokenized_phrases
from .timing import STAGES, StageTimer

logger = logging.getLogger(__name__)
#: model -> {draft length: dynvocab.verification.draft_step_cost}, measured at a pipeline's first drafted request
_DRAFT_STEP_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: LM -> dynvocab.state_store.DocumentStates, made by the first request with a state gate on any pipeline of it
_DOCUMENT_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: what ``None`` means for the settings whose best value depends on the decoding, by measurement on 200
#: held-out Wikipedia leads (README, "Benchmarks"): greedy text keeps to phrases the LM ranks in its top 3;
#: sampled text keeps the LM's own next-token distribution and lets phrases carry on what it starts, with the
#: phrase bias chosen for the shipped encoder on development leads (results/nucleus-dev/; greedy's stays 0 for
#: the reason in results/wikipedia-greedy-bias2/).
#: grounded decoding's defaults, chosen on development prompts (docs/grounded.md): the relaxation, the verbatim run
#: of the text a document must hold before it applies, and the draft length
GROUNDED_GAMMA = 0.05
GROUNDED_RELAX_AFTER = 4
GROUNDED_DRAFT_TOKENS = 8

DECODING_DEFAULTS = {
    "greedy": {"agreement_top_k": 3, "first_token_mass": False, "phrase_bias": 0.0},
    "sampling": {"agreement_top_k": 0, "first_token_mass": True, "phrase_bias": 1.5},
}


def decoding_settings(do_sample: bool, settings: Any) -> dict[str, Any]:
    """The ``DECODING_DEFAULTS`` names as ``settings`` (any object with them as attributes) gives them, a ``None``
    replaced by the default for the decoding."""
    defaults = DECODING_DEFAULTS["sampling" if do_sample else "greedy"]
    return {name: default if getattr(settings, name) is None else getattr(settings, name) for name, default in defaults.items()}


@dataclass
class PipelineConfig:
    """Settings of one retrieval-augmented generation request."""

    top_k: int = field(default=32, metadata={"help": "Documents retrieved per prompt (the paper uses 32)."})
    grounded: bool = field(
        default=True,
        metadata={"help": "Grounded decoding: the LM reads the top documents and writes every token; phrases and drafts "
                          "only propose, kept while the LM vouches for them (gamma), and copied spans cite their "
                          "document. Off (--no_grounded): the paper's mode, where the phrase head decides."},
    )
    gamma: float = field(
        default=GROUNDED_GAMMA,
        metadata={"help": "Grounded decoding: keep a proposed token while its probability is at least gamma times the "
                          "LM's best (1: exactly the LM's text given the documents; chosen on development prompts)."},
    )
    relax_after: int = field(
        default=GROUNDED_RELAX_AFTER,
        metadata={"help": "Grounded decoding: relax a draft to gamma only where the text's last n tokens stand verbatim "
                          "just before it in its document (a copy under way; 0: always); elsewhere gamma is 1."},
    )
    read_documents: int = field(default=2, metadata={"help": "Grounded decoding: top documents put in the LM's context."})
    read_tokens: int = field(default=384, metadata={"help": "Grounded decoding: tokens the LM reads of each of them."})
    cite_tokens: int = field(default=4, metadata={"help": "Grounded decoding: cite a copied span of at least n tokens."})
    unit: str = field(default="tokens", metadata={"help": "Phrase unit: 'tokens' (2-8 LM tokens) or 'words'."})
    min_length: int = field(default=2, metadata={"help": "Shortest phrase, in units."})
    max_length: int = field(default=8, metadata={"help": "Longest phrase, in units."})
    min_count: int = field(default=1, metadata={"help": "Drop phrases seen fewer times in the retrieved documents."})
    max_phrases: int = field(default=2048, metadata={"help": "Phrases plugged in per prompt at most."})
    edges: str = field(default="content", metadata={"help": "Phrase edges: 'content' (no stopword first or last) or 'any'."})
    ranking: str = field(default="relevance", metadata={"help": "Phrase order: 'relevance' (by document rank) or 'frequency'."})
    no_repeat_ngram_size: int = field(default=4, metadata={"help": "No n-gram of tokens twice, phrases spelled out (0: off)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "CTRL repetition penalty, phrases spelled out (1: off)."})
    agreement_top_k: int | None = field(
        default=None,
        metadata={"help": "A phrase may start only with one of the LM's top-k tokens (0: off; None: 3 greedy, 0 sampling)."},
    )
    context_tokens: int = field(
        default=0,
        metadata={"help": "A phrase may follow only the last n tokens it follows in a retrieved document "
                          "(dynvocab.context_gate; 0: off)."},
    )
    state_threshold: float | None = field(
        default=None,
        metadata={"help": "A phrase may compete only where the cosine of the LM's state and its state just before the "
                          "phrase in a retrieved document reaches this (dynvocab.state_keys; one LM pass over the "
                          "documents; None: off)."},
    )
    phrase_max_uses: int = field(default=1, metadata={"help": "Each phrase emitted at most this often per continuation (0: no limit)."})
    first_token_mass: bool | None = field(
        default=None,
        metadata={"help": "Keep the LM's next-token distribution; phrases share their first token's probability "
                          "(None: off greedy, on sampling).", "nargs": "?", "const": True},  # a bare flag turns it on
    )
    phrase_bias: float | None = field(
        default=None,
        metadata={"help": "Added to every phrase score at decoding time (None: 0 greedy, +1.5 sampling)."},
    )
    verify_top_k: int = field(
        default=0,
        metadata={"help": "Verified decoding: keep an emitted phrase only while each token is in the LM's top-k there "
                          "(one prompt at a time; 0: off)."},
    )
    draft_tokens: int | None = field(
        default=None,
        metadata={"help": "Grounded or verified decoding: draft up to n tokens that followed the text's last tokens "
                          "in a retrieved document or earlier in the text (dynvocab.drafting; 0: off; None: 8 grounded, "
                          "0 otherwise)."},
    )
    draft_step_cost: float | None = field(
        default=None,
        metadata={"help": "Drafting: what a forward call over a drafted step costs beyond a one-token call, in one-token "
                          "calls; a source drafts only while its drafts keep more tokens than that (None: measured on "
                          "this machine at the first request, about 0.3 on a 2-core CPU; 0: always draft)."},
    )
    max_new_tokens: int = field(default=128, metadata={"help": "Decoding steps at most."})
    max_chars: int | None = field(default=None, metadata={"help": "Stop once the continuation has this many characters."})
    do_sample: bool = field(default=False, metadata={"help": "Sample instead of greedy decoding."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus mass when sampling."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    realtime: bool = field(default=False, metadata={"help": "Add phrases during decoding instead of all up front."})
    realtime_every: int = field(default=10, metadata={"help": "Decoding steps between two additions."})
    realtime_fraction: float = field(default=0.05, metadata={"help": "Share of the candidates added each time."})
    drop_unused: bool = field(default=False, metadata={"help": "Real-time mode: drop phrases unused since the last addition."})

    def __post_init__(self) -> None:
        check_field_types(self)
        check_at_least(self, 1, ("top_k", "max_new_tokens", "realtime_every", "min_length", "cite_tokens"))
        check_at_least(self, 0, ("read_documents", "read_tokens", "relax_after"))
        if self.draft_tokens is None:
            self.draft_tokens = GROUNDED_DRAFT_TOKENS if self.grounded else 0
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma} must be in (0, 1] (1: the LM's own text given the documents)")
        if self.grounded and (self.verify_top_k or self.realtime):
            raise ValueError("grounded decoding verifies every proposal with the LM and decodes one prompt as it goes; "
                             "pass grounded=False for verify_top_k or real-time phrases (the paper's modes)")
        if self.max_phrases < 0:
            raise ValueError(f"PipelineConfig.max_phrases={self.max_phrases} must be >= 0 (0: no phrases, the bare LM)")
        if self.min_length > self.max_length:
            raise ValueError(f"min_length={self.min_length} > max_length={self.max_length}; pass min_length <= max_length")
        if self.max_chars is not None and self.max_chars < 1:
            raise ValueError(f"max_chars={self.max_chars} must be >= 1, or None for no character budget")
        if not self.temperature > 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"temperature={self.temperature} must be > 0 and top_p={self.top_p} in (0, 1]")
        for name in ("realtime_fraction",):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in (0, 1]")
        if self.unit not in ("tokens", "words"):
            raise ValueError(f"unit={self.unit!r}; choose 'tokens' or 'words'")
        if self.edges not in ("content", "any") or self.ranking not in ("relevance", "frequency"):
            raise ValueError(f"edges={self.edges!r}, ranking={self.ranking!r}; choose edges 'content' or 'any', "
                             "ranking 'relevance' or 'frequency'")
        counts = ("no_repeat_ngram_size", "agreement_top_k", "phrase_max_uses", "verify_top_k", "context_tokens",
                  "draft_tokens")
        if min(getattr(self, name) or 0 for name in counts) < 0 or self.repetition_penalty <= 0:
            raise ValueError(", ".join(f"{name}={getattr(self, name)}" for name in counts)
                             + f" must be >= 0 and repetition_penalty={self.repetition_penalty} > 0")
        if self.draft_step_cost is not None and self.draft_step_cost < 0:
            raise ValueError(f"draft_step_cost={self.draft_step_cost} must be >= 0 (0: always draft), or None to measure it")
        if self.state_threshold is not None and not -1.0 <= self.state_threshold <= 1.0:
            raise ValueError(f"state_threshold={self.state_threshold} is a cosine: pass a value in [-1, 1] "
                             "(e.g. 0.97), or None for no state gate")
        if self.state_threshold is not None and self.realtime:
            raise ValueError("state_threshold gates a phrase set chosen up front; real-time mode adds phrases while it "
                             "decodes: pass one of them")
        if self.draft_tokens and not (self.verify_top_k or self.grounded):
            raise ValueError(f"draft_tokens={self.draft_tokens} needs verified decoding: pass grounded=True (the "
                             "default), verify_top_k=1 (a draft is kept as far as the LM's own greedy text agrees) or "
                             "more, or draft_tokens=0")

    def generation_kwargs(self) -> dict[str, Any]:
        # pure nucleus sampling: top_k=0 lifts the default top-50 cut of the generation config
        sampling = {"top_p": self.top_p, "top_k": 0, "temperature": self.temperature} if self.do_sample else {}
        guards = {"no_repeat_ngram_size": self.no_repeat_ngram_size} if self.no_repeat_ngram_size else {}
        if self.repetition_penalty != 1.0:
            guards["repetition_penalty"] = self.repetition_penalty
        chosen = self.decoding_settings()
        if chosen["agreement_top_k"]:
            guards["phrase_agreement_top_k"] = chosen["agreement_top_k"]
        if self.phrase_max_uses:
            guards["phrase_max_uses"] = self.phrase_max_uses
        if chosen["first_token_mass"]:
            guards["phrase_first_token_mass"] = True
        if chosen["phrase_bias"]:
            guards["phrase_bias"] = chosen["phrase_bias"]
        return {"do_sample": self.do_sample, **sampling, **guards}

    def decoding_settings(self) -> dict[str, Any]:
        """The ``DECODING_DEFAULTS`` settings as this request uses them: a ``None`` is the default for its decoding."""
        return decoding_settings(self.do_sample, self)


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
    copied_tokens: int = 0
    grounded: bool = False

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
        result["cited_share"] = self.cited_share
        return result


def in_context_ids(tokenizer, documents: list[dict], read_tokens: int) -> list[int]:
    """``documents``' texts, each cut to ``read_tokens`` tokens, joined by blank lines and followed by one, as the token
    ids an LM reads before a prompt (tokenized without special tokens after these); [] for no documents."""
    if not documents or not read_tokens:
        return []
    cut = [tokenizer.decode(ids[:read_tokens])
           for ids in tokenizer([d["text"] for d in documents], add_special_tokens=False).input_ids]
    return tokenizer("\n\n".join(cut) + "\n\n").input_ids


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


class PhrasePipeline:
    """Retrieval-augmented generation with a dynamic phrase vocabulary.

    Each request retrieves the top-k documents for the prompt, cuts phrases from them
    (each remembering its document), plugs them into ``model`` and generates; every
    stage is timed. With ``config.realtime`` phrases join during decoding. When the index
    folder holds phrase vectors (``dynvocab phrase-vectors``), the model reads them
    instead of encoding those phrases; when it holds the LM's document states
    (``dynvocab document-states``), the state gate reads them instead of the LM.
    """

    def __init__(self, model: DynamicVocabLM, index: DocumentIndex, config: PipelineConfig | None = None) -> None:
        self.model, self.index, self.config = model, index, config or PipelineConfig()
        attach_phrase_vectors(model, index)  # vectors computed beside the index, when it has them

    def candidates(self, documents: list[dict]) -> list[Phrase]:
        """Phrases of ``documents`` that the model's phrase table accepts, best first."""
        c = self.config
        found = extract_phrases(  # a few spares: a phrase whose text re-tokenizes too long is dropped below
            documents, self.model.tokenizer, unit=c.unit, min_length=c.min_length, max_length=c.max_length,
            min_count=c.min_count, max_phrases=c.max_phrases + c.max_phrases // 8 + 8, edges=c.edges, ranking=c.ranking,
        )
        table = self.model.phrase_table  # its tokenize remembers the ids for set_phrases and the context gate
        kept = tokenized_phrases(found, self.model.tokenizer, table.max_phrase_tokens, table.tokenize)
        return [phrase for phrase, _ in kept][: c.max_phrases]

    def phrase_contexts(self, documents: list[dict], phrases: Sequence[Phrase]) -> dict | None:
        """With ``config.context_tokens``, where each of ``phrases`` follows in ``documents`` (``generate``'s
        ``phrase_contexts`` for one prompt, ``dynvocab.context_gate``); None when the gate is off."""
        n, tokenizer = self.config.context_tokens, self.model.tokenizer
        if not n:
            return None
        if not phrases:
            return {}
        return document_contexts(documents, tokenizer, self.model.phrase_table.tokenize([p.text for p in phrases]), n)

    def state_keys(self, documents: list[list[dict]], phrases: list[list[Phrase]]) -> StateKeys | None:
        """With ``config.state_threshold``, the keys of each prompt's phrases in its own documents, once the phrases
        are set on the model (``generate``'s ``phrase_state_keys``, ``dynvocab.state_keys``); None when it is off."""
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
            drafters = [self.drafter(self.read(found) if c.grounded else found) for found in documents] \
                if c.draft_tokens else None
        gate = {"phrase_contexts": contexts} if c.context_tokens else {}
        with timer.stage("encode"):
            model.set_phrases(phrases if len(prompts) > 1 else phrases[0], mid_sentence_forms=False)
            keys = self.state_keys(documents, phrases)
        if keys is not None:
            gate["phrase_state_keys"] = keys
        budgets = max_chars if max_chars is not None else [c.max_chars] * len(prompts) if c.max_chars else None
        copied = [0] * len(prompts)
        with timer.stage("decode"):
            if c.grounded:
                outputs = self._generate_grounded(prompts, documents, budgets, contexts, drafters, keys)
                new = [out.sequences[0, length:].tolist() for out, length in outputs]
                steps, copied = [out.steps for out, _ in outputs], [out.copied_tokens for out, _ in outputs]
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
            for result, ids, count in zip(results, new, copied):
                result.citations, result.copied_tokens, result.grounded = self.citations(result, ids), count, True
        return results

    def read(self, documents: list[dict]) -> list[dict]:
        """The documents the LM reads in grounded decoding: the top ``config.read_documents``."""
        return documents[: self.config.read_documents]

    def context_ids(self, documents: list[dict]) -> list[int]:
        """What the LM reads before the prompt: ``read(documents)``, each cut to ``config.read_tokens`` tokens, joined
        and followed by blank lines, as token ids ([] when there is nothing to read)."""
        return in_context_ids(self.model.tokenizer, self.read(documents), self.config.read_tokens)

    def citations(self, result: PipelineResult, new: list[int]) -> list[Citation]:
        """The spans of ``result``'s continuation (its new mixed ids ``new``) that stand in the documents the LM read."""
        model = self.model
        tokens = [t for t in model.phrase_table.spell(new) if t not in model.tokenizer.all_special_ids]
        return cite(tokens, [d["text"] for d in self.read(result.documents)], model.tokenizer, self.config.cite_tokens)

    def drafter(self, documents: list[dict]) -> DocumentDrafter:
        """Drafts of ``config.draft_tokens`` tokens from ``documents`` and the text so far, for one prompt."""
        c, texts = self.config, [d["text"] for d in documents]
        cost = c.draft_step_cost
        if cost is None:  # measured once per model and draft length
            costs = _DRAFT_STEP_COSTS.setdefault(self.model, {})
            if c.draft_tokens not in costs:
                costs[c.draft_tokens] = draft_step_cost(self.model, c.draft_tokens)
                logger.info("a forward call over a token and %d drafted ones costs %.2fx a one-token call here",
                            c.draft_tokens, 1 + costs[c.draft_tokens])
            cost = costs[c.draft_tokens]
        return DocumentDrafter(self.model.tokenizer(texts, add_special_tokens=False).input_ids if texts else [],
                               c.draft_tokens, no_repeat_ngram_size=c.no_repeat_ngram_size, step_cost=cost)

    def _generate_verified(self, prompts: list[str], budgets: Sequence[int] | None, contexts: list[dict | None],
                           drafters: list[DocumentDrafter] | None,
                           keys: StateKeys | None = None) -> tuple[list[list[int]], list[int]]:
        """Each prompt by ``generate_verified`` with its row's phrases: the new ids and the steps they took."""
        c, model = self.config, self.model
        kwargs = c.generation_kwargs()
        new, steps = [], []
        for row, prompt in enumerate(prompts):
            gate = {"phrase_contexts": contexts[row]} if contexts[row] is not None else {}
            processors = model.phrase_processors_in(kwargs | gate)
            ids = model.tokenizer(prompt, return_tensors="pt").input_ids
            budget = budgets[row] if budgets is not None else None
            with model.state_gate(keys.for_row(row) if keys is not None else None):
                out = generate_verified(
                    model, ids, c.max_new_tokens, accept_top_k=c.verify_top_k, do_sample=c.do_sample, top_p=c.top_p,
                    temperature=c.temperature, logits_processor=processors, row=row if len(prompts) > 1 else None,
                    stopping_criteria=character_budget(model, ids.shape[1], budget),
                    draft=drafters[row].draft if drafters else None,
                )
            new.append(out.sequences[0, ids.shape[1] :].tolist())
            steps.append(out.steps)
        return new, steps

    def _generate_grounded(self, prompts: list[str], documents: list[list[dict]], budgets: Sequence[int] | None,
                           contexts: list[dict | None], drafters: list[DocumentDrafter] | None,
                           keys: StateKeys | None = None) -> list[tuple[VerifiedOutput, int]]:
        """Each prompt by ``generate_verified`` with its documents in the LM's context and the grounded rule: the
        output and the prompt's length in it."""
        c, model = self.config, self.model
        # the n-gram guard judges what this call writes: the continuation may copy the documents, never repeat itself
        kwargs, outputs = c.generation_kwargs() | {"no_repeat_ngram_scope": "new"}, []
        for row, (prompt, found) in enumerate(zip(prompts, documents)):
            gate = {"phrase_contexts": contexts[row]} if contexts[row] is not None else {}
            context = self.context_ids(found)
            ids = model.tokenizer(prompt, add_special_tokens=not context, return_tensors="pt").input_ids
            budget = budgets[row] if budgets is not None else None
            with model.state_gate(keys.for_row(row) if keys is not None else None):
                drafter = drafters[row] if drafters else None
                out = generate_grounded(
                    model, ids, c.max_new_tokens, gamma=c.gamma, drafter=drafter, relax_after=c.relax_after,
                    context=torch.tensor([context], device=model.device) if context else None, do_sample=c.do_sample,
                    top_p=c.top_p, temperature=c.temperature, logits_processor=model.phrase_processors_in(kwargs | gate),
                    row=row if len(prompts) > 1 else None, stopping_criteria=character_budget(model, ids.shape[1], budget),
                )
            outputs.append((out, ids.shape[1]))
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
