"""Question answering with citations: numbered documents, document-numbered phrases, ``[n]`` markers from provenance.

``CitationQA(model, index)(question)`` retrieves the top-k documents (or takes the ones given),
writes a one-shot instruction prompt that numbers them (through the tokenizer's chat template
when it has one), plugs in the phrases cut from each document (marked with its number, see
``retrieval.qa.citations``), generates greedily and returns the answer with inline ``[n]``
markers and the documents it cites. ``answer_many`` answers one question under several
settings at once: the settings that see the same documents share one prompt, one prefill
and one batched decode, each row with its own phrase set (under ``verify_top_k`` each row decodes
alone, by ``dynvocab.generate_verified``).
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from dynvocab import DynamicVocabLM, Phrase, generate_grounded, generate_verified
from dynvocab.config import check_at_least, check_field_types
from dynvocab.decoding.drafting import DocumentDrafter
from dynvocab.decoding.repetition import check_no_repeat_scope
from dynvocab.states.keys import row_state_keys
from dynvocab.states.store import DocumentStates

from ..config import GROUNDED_GAMMA, GROUNDED_RELAX_AFTER
from ..phrases import document_contexts, extract_phrases
from .citations import SENTENCE_END, Citation, cite_copies, cite_segments, document_block, marker, numbered_phrases

__all__ = ["CitationQA", "QAConfig", "QAResult", "build_messages", "cited_phrase_contexts", "document_phrases"]

logger = logging.getLogger(__name__)

INSTRUCTION = (
    "Answer the question in one short sentence, using only the documents below. Cite a document by writing its "
    "number in brackets, like [1], right after the words taken from it."
)

#: the one-shot example (hand-written; its documents are in no index)
EXAMPLE_QUESTION = "Which river flows through Paris?"
EXAMPLE_DOCUMENTS = (
    {"title": "Seine", "text": "The Seine is a 777-kilometre-long river in northern France. It flows through Paris "
                               "and into the English Channel at Le Havre."},
    {"title": "Loire", "text": "The Loire is the longest river in France. It rises in the Massif Central and flows "
                               "into the Bay of Biscay."},
)
EXAMPLE_ANSWER = "The Seine[1] flows through Paris[1] and into the English Channel[1]."

PHRASE_MODES = ("none", "ngram", "content")


@dataclass
class QAConfig:
    """Settings of one QA system: documents, phrases and decoding."""

    top_k: int = field(default=3, metadata={"help": "Documents retrieved per question (when none are given)."})
    phrases: str = field(
        default="ngram",
        metadata={"help": "'none' (the bare LM), 'ngram' (every token n-gram, edges='any') or 'content' "
                          "(constituent-like: no stopword first or last, edges='content')."},
    )
    markers: bool = field(default=True, metadata={"help": "Phrase texts end with their document's [n] (the paper's phrase[2])."})
    document_words: int = field(default=100, metadata={"help": "Words of each document shown (ALCE passages: 100)."})
    max_phrases: int = field(default=256, metadata={"help": "Phrases per document at most."})
    min_length: int = field(default=2, metadata={"help": "Shortest phrase body, in LM tokens."})
    max_new_tokens: int = field(default=48, metadata={"help": "Decoding steps at most."})
    agreement_top_k: int = field(default=3, metadata={"help": "A phrase may start only with one of the LM's top-k tokens (0: off)."})
    phrase_max_uses: int = field(default=1, metadata={"help": "Each phrase at most this often per answer (0: no limit)."})
    context_tokens: int = field(
        default=4,
        metadata={"help": "A phrase may follow only the last n tokens its body follows in its document "
                          "(dynvocab.decoding.context_gate; 0: off; the figures per setting are in docs/qa.md)."},
    )
    state_threshold: float | None = field(
        default=None,
        metadata={"help": "A phrase may compete only where the cosine of the LM's state and its state just before the "
                          "phrase in the prompt, whose documents it was cut from, reaches this (dynvocab.states.keys; "
                          "None: off). Needs markers off: a marked phrase ends with its [n], which the prompt lacks."},
    )
    phrase_bias: float = field(
        default=0.0,
        metadata={"help": "Added to every phrase score at decoding time, on top of the checkpoint's own calibration "
                          "(0: none; see docs/qa.md for the figures per bias)."},
    )
    no_repeat_ngram_size: int = field(
        default=4, metadata={"help": "No token n-gram twice, phrases spelled out (0: off; docs/qa.md has the figures)."})
    no_repeat_ngram_scope: str = field(
        default="new",
        metadata={"help": "Which n-grams no_repeat_ngram_size counts: 'new' (the answer's own, so it may copy the "
                          "documents) or 'all' (the prompt's too)."},
    )
    verify_top_k: int = field(
        default=0,
        metadata={"help": "Verified decoding: keep an emitted phrase only while each of its tokens, its first "
                          "included, is in the LM's top-k there (1: the answer is the LM's own, and its spans "
                          "copied from a document cite it; 0: off). Each row decodes alone."},
    )
    grounded: bool = field(
        default=True,
        metadata={"help": "The LM reading the documents writes every token; phrases and drafts from the documents only "
                          "propose (dynvocab.generate_grounded), and a span copied verbatim from document n is followed "
                          "by [n]. False: the paper's mode, where the phrase head decides."},
    )
    gamma: float = field(
        default=GROUNDED_GAMMA,
        metadata={"help": "Grounded: a proposed token is kept while its probability is at least gamma times the best "
                          "token's (1: the LM's own greedy answer)."},
    )
    relax_after: int = field(
        default=GROUNDED_RELAX_AFTER,
        metadata={"help": "Grounded: gamma < 1 relaxes a draft only inside a copy under way, this many tokens long (0: "
                          "everywhere)."},
    )
    draft_tokens: int = field(default=8, metadata={"help": "Grounded: tokens drafted from the documents per LM call."})
    cite_tokens: int = field(default=4, metadata={"help": "Grounded: a span of this many tokens copied verbatim cites."})
    stop_at_newline: bool = field(default=True, metadata={"help": "End the answer at its first line break."})
    max_sentences: int = field(default=1, metadata={"help": "End the answer after this many sentences (0: no limit)."})
    one_shot: bool = field(default=True, metadata={"help": "Show one worked example before the question."})
    chat_template: str = field(default="auto", metadata={"help": "'auto' (the tokenizer's chat template if it has one) or 'never'."})

    def __post_init__(self) -> None:
        check_field_types(self)
        check_at_least(self, 1, ("top_k", "document_words", "max_new_tokens", "min_length", "draft_tokens", "cite_tokens"))
        check_at_least(self, 0, ("max_phrases", "agreement_top_k", "phrase_max_uses", "no_repeat_ngram_size", "max_sentences",
                                 "context_tokens", "verify_top_k"))
        if self.phrases not in PHRASE_MODES:
            raise ValueError(f"QAConfig.phrases={self.phrases!r}; choose one of {', '.join(PHRASE_MODES)}")
        check_no_repeat_scope(self.no_repeat_ngram_scope)
        if self.state_threshold is not None and not -1.0 <= self.state_threshold <= 1.0:
            raise ValueError(f"QAConfig.state_threshold={self.state_threshold} is a cosine: pass a value in [-1, 1] "
                             "(e.g. 0.95), or None for no state gate")
        if self.state_threshold is not None and self.markers and self.phrases != "none":
            raise ValueError("QAConfig.state_threshold keys a phrase by its tokens in the prompt's documents, and with "
                             "markers=True each phrase ends with its [n], which they do not hold: pass markers=False")
        if self.grounded and self.verify_top_k:
            raise ValueError("QAConfig: grounded decoding lets the LM decide every token already; pass grounded=False "
                             f"for verify_top_k={self.verify_top_k} (the paper's mode with verification)")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"QAConfig.gamma={self.gamma} must be in (0, 1]: 1 keeps the LM's own tokens only")
        check_at_least(self, 0, ("relax_after",))
        if self.chat_template not in ("auto", "never"):
            raise ValueError(f"QAConfig.chat_template={self.chat_template!r}; choose 'auto' or 'never'")

    def generation_kwargs(self) -> dict:
        kwargs = {"do_sample": False}
        if self.agreement_top_k:
            kwargs["phrase_agreement_top_k"] = self.agreement_top_k
        if self.phrase_max_uses:
            kwargs["phrase_max_uses"] = self.phrase_max_uses
        if self.no_repeat_ngram_size:
            kwargs |= {"no_repeat_ngram_size": self.no_repeat_ngram_size, "no_repeat_ngram_scope": self.no_repeat_ngram_scope}
        if self.phrase_bias:
            kwargs["phrase_bias"] = self.phrase_bias
        return kwargs


#: settings that must agree for two systems to share one prompt and one batched decode
SHARED = ("document_words", "max_new_tokens", "agreement_top_k", "phrase_max_uses", "no_repeat_ngram_size",
          "no_repeat_ngram_scope", "phrase_bias", "verify_top_k", "state_threshold", "grounded", "gamma", "relax_after",
          "draft_tokens", "cite_tokens",
          "stop_at_newline", "max_sentences", "one_shot", "chat_template")


@dataclass
class QAResult:
    """One answered question: the answer with ``[n]`` markers, its citations, and the numbered documents."""

    question: str
    answer: str
    text: str  # what the model wrote (markers of phrases included when they carry them)
    citations: list[Citation]
    documents: list[dict]  # numbered 1..k in this order, each {"id", "title", "text"} as shown in the prompt
    num_phrases: int
    steps: int
    phrase_steps: int
    seconds: float
    settings: dict

    @property
    def cited(self) -> list[int]:
        """Numbers of the documents the answer cites, ascending."""
        return sorted({c.number for c in self.citations})

    def to_dict(self) -> dict:
        return asdict(self) | {"cited": self.cited}


def shown_document(document: Mapping, words: int) -> dict:
    """The document as the prompt shows it: ``id``, ``title`` and its first ``words`` words."""
    if not isinstance(document, Mapping) or not isinstance(document.get("text"), str):
        raise TypeError(f"a document must be a dict with a str 'text' (and 'title', 'id'), got {document!r:.80}")
    text = " ".join(document["text"].split()[:words])
    return {"id": str(document.get("id", document.get("title", ""))), "title": str(document.get("title", "")), "text": text}


def build_messages(question: str, documents: Sequence[Mapping], one_shot: bool = True) -> list[dict]:
    """Chat messages: the instruction as system turn, the worked example as one exchange, then the question."""
    messages = [{"role": "system", "content": INSTRUCTION}]
    if one_shot:
        messages += [{"role": "user", "content": _user_turn(EXAMPLE_QUESTION, EXAMPLE_DOCUMENTS)},
                     {"role": "assistant", "content": EXAMPLE_ANSWER}]
    return messages + [{"role": "user", "content": _user_turn(question, documents)}]


def _user_turn(question: str, documents: Sequence[Mapping]) -> str:
    blocks = "\n".join(document_block(n, d) for n, d in enumerate(documents, start=1))
    return f"Question: {question}\n\n{blocks}"


def prompt_ids(tokenizer, question: str, documents: Sequence[Mapping], config: QAConfig) -> list[int]:
    """Token ids of the prompt, through the chat template when the tokenizer has one (and ``config`` allows it)."""
    messages = build_messages(question, documents, config.one_shot)
    if config.chat_template == "auto" and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
    turns = [messages[0]["content"], ""]
    for message in messages[1:]:
        turns.append(message["content"] + ("\nAnswer:" if message["role"] == "user" else "\n"))
    return tokenizer("\n".join(turns), add_special_tokens=True)["input_ids"]


def document_phrases(documents: Sequence[Mapping], tokenizer, config: QAConfig, max_tokens: int) -> list[Phrase]:
    """Phrases of each document, numbered by it (see ``numbered_phrases``), at most ``config.max_phrases`` each.

    A phrase body leaves room for a marker within ``max_tokens`` (the phrase table's limit) whether
    or not markers are on.
    """
    if config.phrases == "none" or not config.max_phrases:
        return []
    edges = "content" if config.phrases == "content" else "any"
    # the same bodies with and without markers, so that the two differ by the marker alone
    room = max_tokens - max(_token_count(tokenizer, marker(n)) for n in range(1, len(documents) + 1))
    if room < config.min_length:
        raise ValueError(f"markers take {max_tokens - room} of the phrase table's {max_tokens} tokens, leaving less "
                         f"than min_length={config.min_length}; raise the model's max_phrase_tokens")
    per_document = [
        extract_phrases([d], tokenizer, min_length=config.min_length, max_length=room, edges=edges, ranking="frequency",
                        max_phrases=config.max_phrases + config.max_phrases // 8 + 8)
        for d in documents
    ]
    phrases = numbered_phrases(per_document, config.markers)
    lengths = tokenizer([p.text for p in phrases], add_special_tokens=False)["input_ids"] if phrases else []
    fits = [p for p, ids in zip(phrases, lengths) if 2 <= len(ids) <= max_tokens]
    kept, count = [], {}
    for phrase in fits:  # at most max_phrases per document
        count[phrase.source] = count.get(phrase.source, 0) + 1
        if count[phrase.source] <= config.max_phrases:
            kept.append(phrase)
    return kept


def cited_phrase_contexts(documents: Sequence[Mapping], phrases: Sequence[Phrase], tokenizer, n: int,
                          markers: bool) -> dict[tuple[int, ...], set[tuple[int, ...]]]:
    """``generate``'s ``phrase_contexts`` for ``document_phrases``: where each phrase's body follows ``n`` tokens in
    its own document, keyed to the phrase's own tokens (its marker included)."""
    contexts: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
    for number, document in enumerate(documents, start=1):
        own = [p.text for p in phrases if p.source == str(number)]
        if not own:
            continue
        bodies = [text.removesuffix(marker(number)) if markers else text for text in own]
        by_body: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        for body, ids in zip(tokenizer(bodies, add_special_tokens=False)["input_ids"],
                             tokenizer(own, add_special_tokens=False)["input_ids"]):
            by_body.setdefault(tuple(body), set()).add(tuple(ids))
        for context, found in document_contexts([document], tokenizer, by_body, n).items():
            contexts.setdefault(context, set()).update(ids for body in found for ids in by_body[body])
    return contexts


def _token_count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


class AnswerEnd(StoppingCriteria):
    """Stop each row once its answer has a line break after some text (``newline``) or ``sentences`` finished sentences."""

    def __init__(self, decode, prompt_length: int, newline: bool = True, sentences: int = 0) -> None:
        self.decode, self.prompt_length, self.newline, self.sentences = decode, prompt_length, newline, sentences

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        texts = [self.decode(row[self.prompt_length :].tolist()).lstrip() for row in input_ids]
        done = [answer_end(text, self.newline, self.sentences) < len(text) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def answer_end(text: str, newline: bool = True, sentences: int = 0) -> int:
    """Where the answer in ``text`` ends: its first line break (after some text), or the end of its
    ``sentences``-th sentence (markers right after the period included); ``len(text)`` if neither comes."""
    end = len(text)
    if newline and "\n" in text.lstrip():
        start = len(text) - len(text.lstrip())
        end = text.index("\n", start)
    if sentences:
        ends = [m.end() for m in SENTENCE_END.finditer(text[:end]) if m.end() < len(text)]
        if len(ends) >= sentences:
            end = min(end, ends[sentences - 1])
    return end


class PrefixCache:
    """KV caches of recent prompts: a new prompt is prefilled only past its longest common prefix with one of them.

    Prompts of one question under k = 3 and k = 5 documents, or with the evidence page put in,
    share everything up to the documents that differ; every prompt shares the instruction and
    the worked example.
    """

    def __init__(self, lm, size: int = 4) -> None:
        self.lm, self.size, self.entries = lm, size, []  # [(ids, cache)], most recent last

    @torch.no_grad()
    def __call__(self, ids: list[int]):
        """A cache holding ``ids[:-1]`` (the last id is fed by ``generate``); the caller may change it."""
        target = len(ids) - 1
        best, common = None, 0
        for entry_ids, cache in self.entries:
            shared = _common_prefix(entry_ids, ids, target)
            if shared > common:
                best, common = cache, shared
        if best is None:
            from transformers import DynamicCache

            cache = DynamicCache()
        else:
            cache = copy.deepcopy(best)
            cache.crop(common - cache.get_seq_length())  # transformers 5: a negative count removes that many slots
        if target > common:
            rest = torch.tensor([ids[common:target]], device=self.lm.device)
            self.lm(input_ids=rest, past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.entries = [e for e in self.entries if e[0] != ids[:target]][-(self.size - 1) :] + [(ids[:target], cache)]
        return copy.deepcopy(cache)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    for x, y in zip(a[:limit], b[:limit]):
        if x != y:
            break
        n += 1
    return n


class CitationQA:
    """Answers questions with citations; ``index`` retrieves documents when a question comes without them."""

    def __init__(self, model: DynamicVocabLM, index=None, config: QAConfig | None = None) -> None:
        if not isinstance(model, DynamicVocabLM):
            raise TypeError(f"model must be a dynvocab.DynamicVocabLM (DynamicVocabLM.from_causal_lm(lm, tokenizer)), "
                            f"got {type(model).__name__}")
        self.model, self.index, self.config = model, index, config or QAConfig()
        self.prefixes = PrefixCache(model.lm)
        # the state gate's keys are the LM's states over the prompt itself, read once per prompt
        self.prompt_states = DocumentStates(model.lm, max_tokens=4096)

    def retrieve(self, question: str, k: int) -> list[dict]:
        if self.index is None:
            raise ValueError("no documents given and no index to retrieve them from; pass documents= or an index")
        return self.index.search_documents([question], k=k)[0]

    def __call__(self, question: str, documents: Sequence[Mapping] | None = None) -> QAResult:
        return self.answer_many(question, [self.config], documents)[0]

    @torch.no_grad()
    def answer_many(self, question: str, configs: Sequence[QAConfig],
                    documents: Sequence[Mapping] | None = None) -> list[QAResult]:
        """One result per config. ``documents`` (numbered in this order) overrides each config's retrieval.

        Configs that see the same documents run as rows of one batch; configs must agree on
        the settings in ``SHARED`` (they shape the prompt or the decoding).
        """
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question={question!r} must be a non-empty str")
        if not configs:
            raise ValueError("configs is empty; pass at least one QAConfig")
        different = [name for name in SHARED if len({getattr(c, name) for c in configs}) > 1]
        if different:
            raise ValueError(f"configs answered together must agree on {', '.join(different)}; answer them separately")
        if documents is not None and not len(documents):
            raise ValueError("documents is empty; pass at least one document, or None to retrieve them")
        found = list(documents) if documents is not None else self.retrieve(question, max(c.top_k for c in configs))
        results: list[QAResult | None] = [None] * len(configs)
        groups: dict[int, list[int]] = {}
        for i, config in enumerate(configs):
            groups.setdefault(len(found) if documents is not None else min(config.top_k, len(found)), []).append(i)
        for k, members in groups.items():
            shown = [shown_document(d, configs[0].document_words) for d in found[:k]]
            for i, result in zip(members, self._answer_group(question, shown, [configs[i] for i in members])):
                results[i] = result
        return results

    def _answer_group(self, question: str, documents: list[dict], configs: list[QAConfig]) -> list[QAResult]:
        model, tokenizer, first = self.model, self.model.tokenizer, configs[0]
        start = time.perf_counter()
        ids = prompt_ids(tokenizer, question, documents, first)
        rows = [document_phrases(documents, tokenizer, c, model.phrase_table.max_phrase_tokens) for c in configs]
        model.set_phrases(rows if len(rows) > 1 else rows[0], mid_sentence_forms=False)
        contexts = [cited_phrase_contexts(documents, phrases, tokenizer, c.context_tokens, c.markers)
                    if c.context_tokens else None for c, phrases in zip(configs, rows)]
        gate = {"phrase_contexts": contexts} if any(c is not None for c in contexts) else {}
        keys = None
        if first.state_threshold is not None:
            # keys from the prompt, not from each document alone: the answer is written in the prompt's context, and
            # on FanOutQA the prompt's keys let phrases through where the documents' own did not (results/qa/state-gate/);
            # only the question's documents give keys, the instructions and the worked example before them do not
            before = _common_prefix(ids, prompt_ids(tokenizer, question, [], first), len(ids))
            keys = row_state_keys(self.prompt_states, model.phrase_table, [[ids]] * len(rows),
                                  [[p.text for p in phrases] for phrases in rows], first.state_threshold,
                                  first_key=[[before]] * len(rows))
            gate["phrase_state_keys"] = keys
        stopping = StoppingCriteriaList([AnswerEnd(model.decode, len(ids), first.stop_at_newline, first.max_sentences)])
        if first.verify_top_k or first.grounded:
            answers = []
            decode = functools.partial(self._grounded, documents=documents) if first.grounded else self._verified
            for i, context in enumerate(contexts):
                with model.state_gate(keys.for_row(i) if keys is not None else None):
                    answers.append(decode(ids, first, stopping, context, row=i if len(rows) > 1 else None))
        else:
            cache = self.prefixes(ids)
            if len(rows) > 1:
                cache.batch_repeat_interleave(len(rows))
            inputs = torch.tensor([ids] * len(rows), device=model.device)
            out = model.generate(inputs, attention_mask=torch.ones_like(inputs), past_key_values=cache,
                                 max_new_tokens=first.max_new_tokens, stopping_criteria=stopping,
                                 pad_token_id=_pad(tokenizer), **first.generation_kwargs(), **gate)
            answers = [(new, len(new)) for new in out[:, len(ids) :].tolist()]
        seconds = (time.perf_counter() - start) / len(rows)
        return [self._result(question, documents, new, len(phrases), config, seconds, steps,
                             row=i if len(rows) > 1 else None)
                for i, ((new, steps), phrases, config) in enumerate(zip(answers, rows, configs))]

    def _grounded(self, ids: list[int], config: QAConfig, stopping: StoppingCriteriaList, context, row: int | None,
                  documents: list[dict]) -> tuple[list[int], int]:
        """One row's answer by ``generate_grounded``, drafts from the shown documents, the prompt's prefix read from the
        prefix cache: its new ids and steps."""
        model, kwargs = self.model, config.generation_kwargs()
        processors = model.phrase_processors_in(kwargs | ({"phrase_contexts": context} if context is not None else {}))
        shown = model.tokenizer([" " + d["text"] for d in documents], add_special_tokens=False)["input_ids"]
        out = generate_grounded(model, torch.tensor([ids], device=model.device), config.max_new_tokens,
                                gamma=config.gamma, drafter=DocumentDrafter(
                                    shown, config.draft_tokens, no_repeat_ngram_size=config.no_repeat_ngram_size),
                                relax_after=config.relax_after, logits_processor=processors,
                                stopping_criteria=stopping, row=row, past_key_values=self.prefixes(ids))
        return out.sequences[0, len(ids) :].tolist(), out.steps

    def _verified(self, ids: list[int], config: QAConfig, stopping: StoppingCriteriaList, context,
                  row: int | None) -> tuple[list[int], int]:
        """One row's answer by ``generate_verified``: its new mixed ids and the steps they took. A phrase's first token
        must be in the LM's top ``verify_top_k`` too, so ``verify_top_k=1`` writes the LM's own answer."""
        model, kwargs = self.model, config.generation_kwargs()
        agreement = kwargs.get("phrase_agreement_top_k") or config.verify_top_k
        kwargs["phrase_agreement_top_k"] = min(agreement, config.verify_top_k)
        processors = model.phrase_processors_in(kwargs | ({"phrase_contexts": context} if context is not None else {}))
        out = generate_verified(model, torch.tensor([ids], device=model.device), config.max_new_tokens,
                                accept_top_k=config.verify_top_k, logits_processor=processors,
                                stopping_criteria=stopping, row=row)
        return out.sequences[0, len(ids) :].tolist(), out.steps

    def _result(self, question: str, documents: list[dict], new: list[int], num_phrases: int, config: QAConfig,
                seconds: float, steps: int, row: int | None = None) -> QAResult:
        eos = self.model.generation_config.eos_token_id
        eos = {eos} if isinstance(eos, int) else set(eos or [])
        end = next((i for i, token in enumerate(new) if token in eos), len(new))
        new = new[:end]
        segments = _lstrip(self.model.segments(new, skip_special_tokens=True, row=row))
        if config.grounded:  # a kept phrase is a copy like any other: cited when cite_tokens long, by where it stands
            answer, citations = cite_segments([replace(s, source=None) for s in segments], len(documents))
            answer, citations = cite_copies(answer, citations, documents, self.model.tokenizer, config.cite_tokens)
        else:
            answer, citations = cite_segments(segments, len(documents))
        cut = answer_end(answer, config.stop_at_newline, config.max_sentences)
        text = "".join(s.text for s in segments)
        text = text[: answer_end(text, config.stop_at_newline, config.max_sentences)]
        return QAResult(
            question=question, answer=answer[:cut].rstrip(), text=text.rstrip(),
            citations=[c for c in citations if c.start < cut], documents=documents, num_phrases=num_phrases,
            steps=min(steps, len(new)),  # the steps up to the end of text (ids that a verified step kept count once)
            phrase_steps=sum(s.is_phrase for s in segments), seconds=seconds, settings=asdict(config),
        )


def _lstrip(segments: list) -> list:
    """Segments without the whitespace the answer starts with."""
    while segments and not segments[0].text.strip():
        segments = segments[1:]
    if segments and segments[0].text != segments[0].text.lstrip():
        segments = [replace(segments[0], text=segments[0].text.lstrip()), *segments[1:]]
    return segments


def _pad(tokenizer) -> int:
    from dynvocab.tokens.padding import pad_id

    return pad_id(tokenizer)
