"""``dynvocab eval-qa``: citation-aware QA systems on one question set, resumable, scored and reported.

A system is written ``MODE[@K][+oracle][:context=N][:state=T][:bias=B][:verify=N][:gamma=G]``: MODE is ``bare`` (the same LM,
no phrases), ``ngram`` / ``content`` (phrases from every token n-gram, or constituent-like ones, each ending with
its document's ``[n]``) or ``ngram-nomark`` / ``content-nomark`` (the same phrases without markers: ``[n]`` is
written after each from provenance); ``@K`` documents (default 3); ``+oracle`` puts the evidence page in place of
the k-th document when retrieval missed it; ``:context=N`` lets a phrase follow only the N tokens its body follows
in its document (``dynvocab.decoding.context_gate``); ``:state=T`` lets a phrase compete only where the cosine of the LM's
state and its state before the phrase in the prompt reaches T (``dynvocab.states.keys``; unmarked modes only);
``:bias=B`` adds B to every phrase score; ``:verify=N`` keeps an emitted phrase only while each of its tokens is in
the LM's top N (``dynvocab.decoding.verification``: with N = 1 the answer is the LM's own, its spans copied from a document
cite it); ``:gamma=G`` answers grounded (``retrieval.qa.answering``: the LM writes every token, phrases and drafts
from the documents propose, kept while within G of the LM's best token; ``bare:gamma=G`` proposes drafts alone; each
span copied verbatim cites its document). Systems that see the same documents with the same state gate, bias,
verification and grounding for a question share
one prompt, one prefill and one batched decode (a verified system decodes each row alone). Answers are appended to
``generations.jsonl`` question by question, so a stopped run resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tqdm.auto import tqdm

from dynvocab.config import check_at_least, check_encode_dtype, check_field_types
from dynvocab.data.assets import DEFAULT_RETRIEVER, ENCODER_HELP
from dynvocab.decoding.repetition import check_no_repeat_scope
from dynvocab.io.jsonl import iter_jsonl

logger = logging.getLogger(__name__)

MODES = {
    "bare": ("none", False),
    "ngram": ("ngram", True),
    "ngram-nomark": ("ngram", False),
    "content": ("content", True),
    "content-nomark": ("content", False),
}
_SYSTEM = re.compile(r"^(?P<mode>[a-z-]+)(?:@(?P<k>\d+))?(?P<oracle>\+oracle)?(?::context=(?P<context>\d+))?"
                     r"(?::state=(?P<state>[+-]?\d+(?:\.\d+)?))?(?::bias=(?P<bias>[+-]?\d+(?:\.\d+)?))?"
                     r"(?::verify=(?P<verify>\d+))?(?::gamma=(?P<gamma>\d+(?:\.\d+)?))?$")

#: the comparison the targets are judged on; the same 3 documents, so one prefill and one batched decode per question;
#: the phrase systems gated by 4 tokens of left context, as ``dynvocab qa`` answers
DEFAULT_SYSTEMS = "bare@3,ngram@3:context=4,ngram-nomark@3:context=4,content@3:context=4"
#: the diagnostic grid: more documents, and the evidence page forced in
DIAGNOSTIC_SYSTEMS = "bare@5,ngram@5,content@5,bare@3+oracle,ngram@3+oracle,content@3+oracle"


@dataclass(frozen=True)
class QASystem:
    name: str
    mode: str
    k: int
    oracle: bool
    context_tokens: int = 0
    phrase_bias: float = 0.0
    verify_top_k: int = 0
    state_threshold: float | None = None
    gamma: float | None = None  # grounded when set

    @property
    def phrases(self) -> str:
        return MODES[self.mode][0]

    @property
    def markers(self) -> bool:
        return MODES[self.mode][1]


def parse_qa_system(name: str) -> QASystem:
    """``"ngram@5+oracle:context=4:bias=2"`` -> ``QASystem``; raises ``ValueError`` naming what is wrong."""
    match = _SYSTEM.match(name.strip())
    if not match or match["mode"] not in MODES:
        raise ValueError(f"system {name!r} is not MODE[@K][+oracle][:context=N][:state=T][:bias=B][:verify=N]"
                         f"[:gamma=G] with MODE one of {', '.join(MODES)}; e.g. ngram@3, bare@5+oracle or "
                         "ngram@3:context=4:bias=2")
    k = int(match["k"] or 3)
    if k < 1:
        raise ValueError(f"system {name!r}: @{k} documents; pass at least 1")
    context = int(match["context"] or 0)
    if context and match["mode"] == "bare":
        raise ValueError(f"system {name!r}: the bare LM has no phrases to gate; drop :context={context}")
    bias = float(match["bias"] or 0)
    if bias and match["mode"] == "bare":
        raise ValueError(f"system {name!r}: the bare LM has no phrases to bias; drop :bias={match['bias']}")
    verify = int(match["verify"] or 0)
    if verify and match["mode"] == "bare":
        raise ValueError(f"system {name!r}: the bare LM has no phrases to verify; drop :verify={verify}")
    gamma = float(match["gamma"]) if match["gamma"] is not None else None
    if gamma is not None and (verify or not 0.0 < gamma <= 1.0):
        raise ValueError(f"system {name!r}: :gamma=G answers grounded with G in (0, 1] (1: the LM's own answer), and "
                         "grounded decoding verifies every token itself: drop :verify")
    state = float(match["state"]) if match["state"] is not None else None
    if state is not None and (match["mode"] == "bare" or MODES[match["mode"]][1] or not -1.0 <= state <= 1.0):
        raise ValueError(f"system {name!r}: :state=T gates the phrases of an unmarked mode (ngram-nomark, "
                         "content-nomark; a marked phrase ends with [n], which no document holds) at a cosine T in "
                         "[-1, 1]; e.g. content-nomark@3:state=0.95")
    return QASystem(name.strip(), match["mode"], k, bool(match["oracle"]), context, bias, verify, state, gamma)


@dataclass
class QAEvalConfig:
    """Settings of ``dynvocab eval-qa``; every one is recorded in the results."""

    data: str = field(default="fanoutqa", metadata={"help": "'fanoutqa' (the offline set) or the path of an ALCE ASQA JSON file."})
    model: str = field(default="smollm2", metadata={"help": "Causal LM name or path ('smollm2' is the offline asset)."})
    checkpoint: str | None = field(default=None, metadata={"help": "Trained phrase encoder; default: the shipped one (smollm2)."})
    index: str | None = field(default=None, metadata={"help": "Document index dir; default: --encoder + FAISS over every Wikipedia lead."})
    encoder: str = field(default=DEFAULT_RETRIEVER, metadata={"help": ENCODER_HELP})
    systems: str = field(
        default=DEFAULT_SYSTEMS,
        metadata={"help": "Comma-separated MODE[@K][+oracle][:context=N][:state=T][:bias=B][:verify=N][:gamma=G] "
                          f"systems (see the module docs); the diagnostic grid is {DIAGNOSTIC_SYSTEMS}."},
    )
    num_questions: int = field(default=0, metadata={"help": "Questions evaluated (0: all)."})
    document_words: int = field(default=100, metadata={"help": "Words of each document shown (ALCE passages: 100)."})
    max_phrases: int = field(default=256, metadata={"help": "Phrases per document at most."})
    max_new_tokens: int = field(default=48, metadata={"help": "Decoding steps per answer at most (greedy)."})
    agreement_top_k: int = field(default=3, metadata={"help": "A phrase may start only with one of the LM's top-k tokens (0: off)."})
    phrase_max_uses: int = field(default=1, metadata={"help": "Each phrase at most this often per answer (0: no limit)."})
    no_repeat_ngram_size: int = field(
        default=4, metadata={"help": "Every system, the bare LM too: no token n-gram twice, phrases spelled out (0: off)."})
    no_repeat_ngram_scope: str = field(
        default="new", metadata={"help": "'new': only the answer's own n-grams count (it may copy the documents); 'all': the prompt's too."})
    encode_dtype: str = field(default="auto", metadata={"help": "Phrase encoder compute dtype: 'auto', 'float32', 'bfloat16' or 'float16'."})
    nli_model: str | None = field(default=None, metadata={"help": "HF NLI classifier (name or path) for ALCE citation recall/precision; none: skipped."})
    output_dir: str = field(default="runs/qa", metadata={"help": "generations.jsonl, results.json and report.md."})

    def __post_init__(self) -> None:
        check_field_types(self)
        if not self.system_names:
            raise ValueError(f"systems={self.systems!r} names no system; e.g. --systems bare@3,ngram@3")
        parsed = [parse_qa_system(name) for name in self.system_names]
        if len({s.name for s in parsed}) != len(parsed):
            raise ValueError(f"systems={self.systems!r} names a system twice; list each once")
        if self.data != "fanoutqa" and not Path(self.data).is_file():
            raise ValueError(f"data={self.data!r} is neither 'fanoutqa' nor an existing ASQA JSON file; pass one of them")
        if self.data != "fanoutqa" and any(s.oracle for s in parsed):
            raise ValueError("+oracle systems need evidence pages, which only --data fanoutqa has; drop them for ASQA")
        check_encode_dtype(self.encode_dtype)
        check_no_repeat_scope(self.no_repeat_ngram_scope)
        check_at_least(self, 0, ("num_questions", "max_phrases", "agreement_top_k", "phrase_max_uses", "no_repeat_ngram_size"))
        check_at_least(self, 1, ("document_words", "max_new_tokens"))

    @property
    def system_names(self) -> list[str]:
        return [s.strip() for s in self.systems.split(",") if s.strip()]

    def qa_config(self, system: QASystem):
        from retrieval.qa.answering import QAConfig

        return QAConfig(top_k=system.k, phrases=system.phrases, markers=system.markers, document_words=self.document_words,
                        max_phrases=self.max_phrases, max_new_tokens=self.max_new_tokens,
                        agreement_top_k=self.agreement_top_k, phrase_max_uses=self.phrase_max_uses,
                        no_repeat_ngram_size=self.no_repeat_ngram_size, no_repeat_ngram_scope=self.no_repeat_ngram_scope,
                        context_tokens=system.context_tokens,
                        phrase_bias=system.phrase_bias, verify_top_k=system.verify_top_k,
                        state_threshold=system.state_threshold, grounded=system.gamma is not None,
                        **({"gamma": system.gamma} if system.gamma is not None else {}))


#: settings that change what is generated: a run resumes only under the same ones
GENERATION_SETTINGS = ("data", "model", "checkpoint", "index", "encoder", "document_words", "max_phrases",
                       "max_new_tokens", "agreement_top_k", "phrase_max_uses", "encode_dtype", "no_repeat_ngram_size",
                       "no_repeat_ngram_scope")
#: what runs recorded before a setting existed generated with
SETTINGS_BEFORE_THEY_EXISTED = {"no_repeat_ngram_size": 0, "no_repeat_ngram_scope": "all"}


def check_resumable(config: QAEvalConfig) -> None:
    """Refuse to add to ``output_dir`` answers made under other generation settings; then record these."""
    out = Path(config.output_dir)
    path = out / "qa_config.json"
    if path.exists():
        before = json.loads(path.read_text())
        before = _generation_settings({k: before.get(k, SETTINGS_BEFORE_THEY_EXISTED.get(k, "(none)")) for k in GENERATION_SETTINGS})
        now = _generation_settings({k: getattr(config, k) for k in GENERATION_SETTINGS})
        changed = [f"{k}={before[k]!r}" for k in GENERATION_SETTINGS if before[k] != now[k]]
        if changed:
            raise ValueError(f"{out} holds answers made with other settings ({', '.join(changed)}); "
                             "use another --output-dir, or pass the same settings to resume")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(config), indent=2) + "\n")


def _generation_settings(settings: dict) -> dict:
    """``settings`` with the n-gram rule's scope dropped where no rule runs (it changes no answer there)."""
    return settings | {"no_repeat_ngram_scope": None} if not settings["no_repeat_ngram_size"] else settings


def load_items(config: QAEvalConfig) -> list[dict]:
    from .data import fanoutqa_items, load_asqa

    items = fanoutqa_items() if config.data == "fanoutqa" else load_asqa(config.data)
    return items[: config.num_questions] if config.num_questions else items


def load_index(config: QAEvalConfig):
    from retrieval import DocumentIndex
    from retrieval.loading import document_encoder, leads_index

    if config.index is None:
        return leads_index(Path(".cache/demo"), config.encoder)
    encoder = document_encoder(config.encoder)
    return DocumentIndex.load(config.index, encoder=encoder)


def documents_by_system(items: list[dict], systems: list[QASystem], index) -> tuple[dict, dict]:
    """``{system name: [documents per item]}`` and the share of items whose evidence is among each k's documents."""
    documents, evidence = {}, {}
    pages = {d["id"]: d for d in index.documents} if index is not None else {}
    if index is not None and any(s.oracle for s in systems):
        from dynvocab.data.assets import wikipedia_leads

        pages = {d["id"]: d for d in wikipedia_leads()} | pages
    from .data import with_documents

    for k, oracle in dict.fromkeys((s.k, s.oracle) for s in systems):
        if all("documents" in item for item in items):
            found, rate = [item["documents"][:k] for item in items], float("nan")
        else:
            found, rate = with_documents(items, index, k, oracle, pages)
        if not oracle:
            evidence[k] = rate
        for s in systems:
            if (s.k, s.oracle) == (k, oracle):
                documents[s.name] = found
    return documents, evidence


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [r for _, r in iter_jsonl(path, "fix or delete the file to regenerate", drop_cut_last_line=True)]


def generate_answers(config: QAEvalConfig) -> tuple[list[dict], list[dict], dict, dict]:
    """Every (system, question) answer, resuming from ``generations.jsonl``; returns records, items, evidence rates, pages."""
    from dynvocab.loading import SHIPPED_ENCODER, freeze_loaded_objects, load_dynamic_lm
    from retrieval.qa.answering import CitationQA

    check_resumable(config)
    out = Path(config.output_dir)
    systems = [parse_qa_system(name) for name in config.system_names]
    items = load_items(config)
    needs_index = not all("documents" in item for item in items)
    index = load_index(config) if needs_index else None
    documents, evidence = documents_by_system(items, systems, index)
    path = out / "generations.jsonl"
    records = [r for r in read_records(path) if r["system"] in documents]
    done = {(r["system"], r["id"]) for r in records}
    todo = [(i, [s for s in systems if (s.name, item["id"]) not in done]) for i, item in enumerate(items)]
    todo = [(i, left) for i, left in todo if left]
    if done:
        logger.info("%s: %d answers done, %d questions to go", path, len(done), len(todo))
    pages = {}
    for name, per_item in documents.items():
        for found in per_item:
            pages.update({d["id"]: d for d in found})
    if todo:
        checkpoint = config.checkpoint or (SHIPPED_ENCODER if config.model == "smollm2" else None)
        model = load_dynamic_lm(config.model, checkpoint)
        model.dynvocab_config.encode_dtype = config.encode_dtype
        qa = CitationQA(model, index)
        freeze_loaded_objects()
        with open(path, "a", encoding="utf-8") as f:
            for i, left in tqdm(todo, desc="eval-qa", unit="question"):
                finished = answer_item(qa, config, items[i], left, {s.name: documents[s.name][i] for s in left})
                f.write("".join(json.dumps(r) + "\n" for r in finished))  # one write per question
                f.flush()
                records.extend(finished)
    return records, items, evidence, pages


def answer_item(qa, config: QAEvalConfig, item: dict, systems: list[QASystem], documents: dict[str, list[dict]]) -> list[dict]:
    """One record per system; systems seeing the same documents with the same phrase bias, verification and state
    gate are answered in one batch, duplicates once."""
    import torch

    start = time.perf_counter()
    groups: dict[tuple, list[QASystem]] = {}
    for s in systems:
        key = (tuple(d["id"] for d in documents[s.name]), s.phrase_bias, s.verify_top_k, s.state_threshold, s.gamma)
        groups.setdefault(key, []).append(s)
    records = []
    for members in groups.values():
        unique = list(dict.fromkeys((s.phrases, s.markers, s.context_tokens) for s in members))
        configs = [replace(config.qa_config(members[0]), phrases=p, markers=m, context_tokens=c) for p, m, c in unique]
        results = dict(zip(unique, qa.answer_many(item["question"], configs, documents[members[0].name])))
        for s in members:
            r = results[(s.phrases, s.markers, s.context_tokens)]
            records.append({"system": s.name, "id": item["id"], "question": item["question"], "answer": r.answer,
                            "text": r.text, "citations": [asdict(c) for c in r.citations], "cited": r.cited,
                            "documents": [d["id"] for d in r.documents], "steps": r.steps, "phrase_steps": r.phrase_steps,
                            "phrases": r.num_phrases, "seconds": r.seconds})
    wall = time.perf_counter() - start
    threads = torch.get_num_threads()
    for record in records:
        record["question_seconds"], record["threads"] = wall / len(records), threads
    return records
