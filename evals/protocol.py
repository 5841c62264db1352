"""The paper's evaluation protocol: held-out prefixes, continuations by each system, every metric.

Prompts are the first ``prefix_tokens`` tokens of held-out documents; the reference is
the next ``continuation_tokens`` tokens (``windows_per_document`` above 1 cuts later windows of a long document
too; the intervals then resample documents). Every system (the bare LM, the
dynamic-vocabulary systems with phrases from the top-k retrieved training documents,
the MWT baseline) generates until it has the reference's number of characters: one
budget for all, so that Rep-n, Diversity and MAUVE compare texts of the same length
and steps per sequence measure compression alone.

Two passes: every prompt in left-padded batches of ``batch_size`` for the quality
figures (``generations.jsonl``), and the first ``latency_prompts`` prompts one at a
time for latency (``latency.jsonl``). Both files grow as generations finish, so a
stopped run resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessorList

from dynvocab.config import check_at_least, check_encode_dtype, check_field_types
from dynvocab.data.assets import DEFAULT_RETRIEVER, ENCODER_HELP
from dynvocab.decoding.repetition import PhraseNoRepeatNGram
from dynvocab.io.jsonl import iter_jsonl
from dynvocab.loading import SHIPPED_ENCODER, SHIPPED_MWT, freeze_loaded_objects

from .latency import STAGES, StageTimer
from .systems import BASES, GROUNDED, OPTIONS, TRAINED, SystemSpec, parse_system

logger = logging.getLogger(__name__)

@dataclass
class EvalConfig:
    """Settings of ``dynvocab eval``; every one is recorded in the results."""

    data: str = field(default="wikipedia", metadata={"help": "Embedded corpus of the held-out prompts: 'wikipedia', "
                                                             "'licenses', 'licensedb' or 'licensedb-families'."})
    model: str = field(default="smollm2", metadata={"help": "Causal LM name or path ('smollm2' is the offline asset)."})
    checkpoint: str | None = field(default=None, metadata={"help": "Trained phrase encoder; default: the shipped one."})
    index: str | None = field(default=None, metadata={"help": "Document index dir; default: an index of --data's training part."})
    encoder: str = field(default=DEFAULT_RETRIEVER, metadata={"help": ENCODER_HELP})
    mwt_checkpoint: str | None = field(default=None, metadata={"help": "MWT baseline from `dynvocab train-mwt`; default: the shipped one."})
    systems: str = field(
        default="bare,dynamic,dynamic-no-phrases,mwt",
        metadata={"help": f"Comma-separated systems from {sorted(BASES)}, each optionally with '@N' phrases and "
                          f":key=value settings from {sorted(OPTIONS)}, e.g. dynamic@256:readback=vector."},
    )
    num_prompts: int = field(default=200, metadata={"help": "Held-out documents used as prompts."})
    windows_per_document: int = field(default=1, metadata={
        "help": "Prompts cut from each held-out document at most: its opening, then each next run of prefix and "
                "reference tokens while the document lasts (1: the opening only). Intervals then resample documents, "
                "each with all its prompts."})
    skip_prompts: int = field(
        default=0,
        metadata={"help": "Held-out prompts passed over first: 200 gives development prompts after the 200 reported "
                          "ones, to choose settings on."},
    )
    prefix_tokens: int = field(default=32, metadata={"help": "Prompt length in LM tokens."})
    continuation_tokens: int = field(default=128, metadata={"help": "Reference length in LM tokens; every system generates to its number of characters."})
    decoding: str = field(default="greedy", metadata={"help": "'greedy' or 'nucleus'."})
    top_p: float = field(default=0.95, metadata={"help": "Nucleus mass for decoding='nucleus'."})
    top_k_docs: int = field(default=32, metadata={"help": "Documents retrieved per prompt."})
    max_phrases: int = field(default=2048, metadata={"help": "Phrases plugged in per prompt at most."})
    batch_size: int = field(default=8, metadata={"help": "Prompts generated together in the quality pass."})
    latency_prompts: int = field(default=20, metadata={"help": "Prompts timed one at a time (the latency pass; 0 skips it)."})
    readback: str = field(default="tokens", metadata={"help": "Dynamic systems: read an emitted phrase back as 'tokens' or 'vector'."})
    encode_dtype: str = field(default="auto", metadata={"help": "Dynamic systems: phrase encoder compute dtype, 'auto', 'float32', 'bfloat16' or 'float16'."})
    edges: str = field(default="content", metadata={"help": "Dynamic systems: phrase edges, 'content' or 'any'."})
    ranking: str = field(default="relevance", metadata={"help": "Dynamic systems: phrase order, 'relevance' or 'frequency'."})
    phrase_bias: float | None = field(
        default=None,
        metadata={"help": "Dynamic systems: added to every phrase score at decoding time (None: the pipeline's default, "
                          "0 greedy, +4 nucleus)."},
    )
    agreement_top_k: int | None = field(
        default=None,
        metadata={"help": "Dynamic systems: a phrase may start only with one of the LM's top-k tokens (0: off; None: the "
                          "pipeline's default, 3 greedy, 0 nucleus)."},
    )
    phrase_max_uses: int = field(default=1, metadata={"help": "Dynamic systems: each phrase emitted at most this often per continuation (0: no limit)."})
    context_tokens: int = field(default=0, metadata={"help": "Dynamic systems: a phrase may follow only the last n tokens it follows in a retrieved document (0: off)."})
    first_token_mass: bool | None = field(
        default=None,
        metadata={"help": "Dynamic systems: keep the LM's next-token distribution; phrases share their first token's "
                          "probability (None: the pipeline's default, off greedy, on nucleus).", "nargs": "?",
                  "const": True},  # a bare flag turns it on
    )
    verify_top_k: int = field(default=0, metadata={"help": "Dynamic systems: verified decoding, keep a phrase while its tokens are in the LM's top-k (0: off)."})
    draft_tokens: int = field(default=0, metadata={"help": "Dynamic systems with verified decoding: draft up to n tokens from the documents and the text so far (0: off)."})
    no_repeat_ngram_size: int = field(default=0, metadata={"help": "Every system: no repeated token n-gram (phrases spelled out; 0: off)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Every system: CTRL repetition penalty (1: off)."})
    rag_documents: int = field(default=3, metadata={"help": "bare-rag systems: retrieved documents put in the context."})
    rag_document_tokens: int = field(default=192, metadata={"help": "bare-rag systems: tokens kept of each document."})
    lookup_tokens: int = field(default=10, metadata={"help": "bare-rag-lookup: prompt_lookup_num_tokens."})
    gamma: float | None = field(default=None, metadata={
        "help": "Grounded systems: keep a proposed token while its probability is at least gamma times the LM's best "
                "(None: the pipeline's default; :gamma= sets it per system)."})
    relax_after: int | None = field(default=None, metadata={
        "help": "Grounded systems: relax a draft to gamma only inside a verbatim run of this many tokens of its "
                "document (None: the pipeline's default; :relax= per system; 0: always)."})
    cite_tokens: int = field(default=4, metadata={"help": "Cite a continuation's span of at least n tokens found in "
                                                          "the documents in its context (systems that read them)."})
    mauve_featurizer: str = field(default="lm", metadata={"help": "'lm' (the scorer LM's last-token state), 'minilm' or 'gpt2-large'."})
    mauve_seeds: int = field(default=3, metadata={"help": "MAUVE runs with different k-means seeds."})
    mauve_permutations: int = field(default=100, metadata={
        "help": "Random swaps of texts between each system and the bare LM with its safeguards, to test its MAUVE "
                "gain (0: off)."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    output_dir: str = field(default="runs/eval", metadata={"help": "generations.jsonl, results.json, report.md, plots."})

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in self.system_names:
            spec = parse_system(name)
            if spec.get("draft", self.draft_tokens) and not spec.get("verify", self.verify_top_k):
                raise ValueError(f"system {name!r} drafts without verified decoding: add :verify=1 (the bare LM's own "
                                 "text) to it, or pass --verify_top_k 1")
        if not self.system_names:
            raise ValueError(f"systems={self.systems!r} names no system; e.g. --systems bare,dynamic")
        from dynvocab.data.corpora import CORPORA

        if self.data not in CORPORA:
            raise ValueError(f"data={self.data!r}; choose one of {', '.join(CORPORA)}")
        check_encode_dtype(self.encode_dtype)
        if self.decoding not in ("greedy", "nucleus"):
            raise ValueError(f"decoding={self.decoding!r}; choose 'greedy' or 'nucleus'")
        if self.mauve_featurizer not in ("minilm", "lm", "gpt2-large"):
            raise ValueError(f"mauve_featurizer={self.mauve_featurizer!r}; choose 'minilm', 'lm' or 'gpt2-large'")
        check_at_least(self, 1, ("num_prompts", "windows_per_document", "prefix_tokens", "continuation_tokens", "mauve_seeds", "batch_size", "top_k_docs"))
        check_at_least(self, 0, ("skip_prompts", "mauve_permutations"))
        if not 0.0 < self.top_p <= 1.0 or self.repetition_penalty <= 0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] and repetition_penalty={self.repetition_penalty} > 0")
        if self.latency_prompts < 0:
            raise ValueError(f"latency_prompts={self.latency_prompts} must be >= 0")
        self._resolve_decoding_defaults()

    def _resolve_decoding_defaults(self) -> None:
        """A ``None`` among the decoding-dependent settings becomes the pipeline's default, so results record values."""
        from retrieval.config import GROUNDED_GAMMA, GROUNDED_RELAX_AFTER, decoding_settings

        for name, value in decoding_settings(self.decoding == "nucleus", self).items():
            setattr(self, name, value)
        self.gamma = GROUNDED_GAMMA if self.gamma is None else self.gamma
        self.relax_after = GROUNDED_RELAX_AFTER if self.relax_after is None else self.relax_after

    @property
    def system_names(self) -> list[str]:
        return [s.strip() for s in self.systems.split(",") if s.strip()]


def held_out_prompts(tokenizer, config: EvalConfig) -> list[dict]:
    """``document_prompts`` of the held-out documents, after the first ``config.skip_prompts`` long enough."""
    from dynvocab.data.corpora import corpus_split

    return document_prompts(tokenizer, corpus_split(config.data)[1], config)


def document_prompts(tokenizer, documents: list[dict], config: EvalConfig) -> list[dict]:
    """``held_out_prompts`` cut from ``documents``, ``{"id", "document", "prompt", "reference"}``: the first
    ``config.prefix_tokens`` tokens of each one long enough are its prompt, the next ``config.continuation_tokens``
    its reference. With ``config.windows_per_document`` = k, window j of a document (its tokens from
    j * (prefix + reference) on, id ``"<document>#<j + 1>"``) is a prompt too while the document holds it whole, for
    j < k; every document's opening comes first, then every second window, and so on."""
    width = config.prefix_tokens + config.continuation_tokens
    chosen, skip = [], config.skip_prompts
    for document in documents:
        ids = tokenizer(document["text"], add_special_tokens=False).input_ids
        if len(ids) >= width:
            if skip:
                skip -= 1
                continue
            chosen.append((document["id"], ids))
        if len(chosen) == config.num_prompts:
            break
    if len(chosen) < config.num_prompts:
        logger.warning("only %d documents are long enough; evaluating those", len(chosen))
    prompts = []
    for window in range(config.windows_per_document):
        for document, ids in chosen:
            start = window * width
            if start + width <= len(ids):
                prompts.append({"id": document if window == 0 else f"{document}#{window + 1}", "document": document,
                                "prompt": tokenizer.decode(ids[start : start + config.prefix_tokens]),
                                "reference": tokenizer.decode(ids[start + config.prefix_tokens : start + width])})
    return prompts


def refuse_held_out(documents: list[dict], data: str, path: str) -> None:
    """Refuse an index that holds held-out documents of ``data``: retrieving a prompt's own document would let a
    system copy its reference, and the report would look better than it is."""
    from dynvocab.data.corpora import corpus_split

    held_out = {document["id"] for document in corpus_split(data)[1]}
    leaked = [document["id"] for document in documents if document.get("id") in held_out]
    if leaked:
        raise ValueError(
            f"the index {path} holds {len(leaked)} of the {len(held_out)} held-out {data} documents the evaluation "
            f"prompts with (e.g. {leaked[0]!r}): a system could retrieve the very text it must continue; build an index "
            f"without them with `dynvocab index --data {data} --output DIR` (the training part only) and pass --index DIR"
        )


class Generators:
    """Builds each system once (lazily) and generates continuations for a batch of prompts."""

    def __init__(self, config: EvalConfig) -> None:
        from dynvocab.loading import load_lm

        self.config = config
        mwt = Path(config.mwt_checkpoint or SHIPPED_MWT)
        if "mwt" in config.system_names and not mwt.exists():
            raise FileNotFoundError(
                f"no MWT baseline at {mwt}; train one with `dynvocab train-mwt --output-dir DIR` and pass "
                "--mwt-checkpoint DIR, or leave mwt out of --systems"
            )
        for spec in map(parse_system, config.system_names):
            if spec.base in TRAINED and not self.checkpoint(spec).is_dir():
                raise FileNotFoundError(
                    f"system {spec.name!r}: no phrase-encoder checkpoint at {self.checkpoint(spec)}; pass a folder "
                    "`dynvocab train` wrote (--checkpoint DIR, or :checkpoint=DIR for one system)"
                )
            if spec.get("lm", None) and not Path(spec.get("lm", None)).is_dir():
                raise FileNotFoundError(f"system {spec.name!r}: no LM at {spec.get('lm', None)}; pass a folder "
                                        "`dynvocab finetune-lm` (final/) or save_pretrained wrote")
        self.lm, self.tokenizer = load_lm(config.model)
        self._index = self._mwt = None
        self._trained, self._lms, self._untrained = {}, {}, {}

    def trained(self, spec: SystemSpec):
        """The dynamic model of the system's phrase-encoder checkpoint on its LM, loaded once per pair."""
        key = (str(self.checkpoint(spec)), spec.get("lm", None) or self.config.model)
        if key not in self._trained:
            from dynvocab.loading import load_dynamic_lm

            self._trained[key] = load_dynamic_lm(key[1], key[0])
        return self._trained[key]

    def lm_for(self, spec: SystemSpec):
        """The system's LM: ``:lm=DIR`` (loaded once per folder), else the protocol's."""
        path = spec.get("lm", None)
        if path is None:
            return self.lm
        if path not in self._lms:
            from dynvocab.loading import load_lm

            self._lms[path] = load_lm(path)[0]
        return self._lms[path]

    def checkpoint(self, spec: SystemSpec) -> Path:
        """The system's ``:checkpoint=``, else ``--checkpoint``, else the shipped encoder."""

        return Path(spec.get("checkpoint", None) or self.config.checkpoint or SHIPPED_ENCODER)

    def untrained(self, spec: SystemSpec):
        """The system's LM with an untrained phrase encoder (once per LM)."""
        key = spec.get("lm", None)
        if key not in self._untrained:
            from dynvocab import DynamicVocabLM

            self._untrained[key] = DynamicVocabLM.from_causal_lm(self.lm_for(spec), self.tokenizer).eval()
        return self._untrained[key]

    @property
    def mwt(self):
        if self._mwt is None:
            from dynvocab.loading import load_lm
            from dynvocab.multiword import MultiWordLM

            path = Path(self.config.mwt_checkpoint or SHIPPED_MWT)
            lm, _ = load_lm(self.config.model)  # its own copy: the baseline grows the embedding matrices
            self._mwt = MultiWordLM.from_pretrained(path, lm, self.tokenizer)
        return self._mwt

    @property
    def index(self):
        if self._index is None:
            from retrieval import DocumentIndex
            from retrieval.loading import demo_index, document_encoder

            path, name = self.config.index, self.config.encoder
            if path:
                self._index = DocumentIndex.load(path, encoder=document_encoder(name))
                refuse_held_out(self._index.documents, self.config.data, path)
            else:
                self._index = demo_index(Path(".cache/demo"), self.config.data, name)
        return self._index

    def settings(self) -> dict[str, dict]:
        """What each evaluated system is, for the report: checkpoints, budgets, its own settings and training."""
        c = self.config
        budget = {"max_chars": "the reference's", "max_new_tokens": 2 * c.continuation_tokens}
        retrieval = {"index": c.index or f"{c.data} training part", "top_k_docs": c.top_k_docs}
        mwt = Path(c.mwt_checkpoint or SHIPPED_MWT)
        every = {
            "bare": {"model": c.model, **budget},
            "bare-rag": {"model": c.model, **budget, **retrieval},
            "bare-rag-lookup": {"model": c.model, **budget, **retrieval, "batch_size": 1},
            "dynamic-untrained": {"phrase_encoder": "untrained (the LM's first layer)", **retrieval, **budget},
            "dynamic-no-phrases": {**budget},
            "grounded-suffix": {"model": c.model, "phrase_encoder": None, **retrieval, **budget},
            "mwt": {"checkpoint": _shown(mwt), **budget, **_multiword_summary(mwt)},
        }
        chosen = {}
        for name in c.system_names:
            spec = parse_system(name)
            if spec.base in TRAINED:
                checkpoint = self.checkpoint(spec)
                train = checkpoint / "train_config.json"
                found = retrieval if spec.base in ("dynamic", "grounded") else {}
                every[spec.base] = {"checkpoint": _shown(checkpoint), **found, **budget,
                                    "training": _training_summary(json.loads(train.read_text())) if train.exists() else None}
            settings = every[spec.base] | {"what": BASES[spec.base]}
            if spec.get("lm", None):
                settings["model"] = spec.get("lm", None)
            if spec.base.startswith("dynamic"):
                settings |= self._pipeline_config(spec).__dict__ | {"readback": spec.get("readback", c.readback),
                                                                    "encode_dtype": spec.get("encode", c.encode_dtype)}
            elif spec.base in GROUNDED:
                settings |= self._grounded_config(spec).__dict__
            else:
                settings |= self.sampling(spec)
            if spec.base.startswith("bare-rag"):
                settings |= {"documents_in_context": spec.get("docs", c.rag_documents), "document_tokens": c.rag_document_tokens}
            if spec.base == "bare-rag-lookup":
                settings["prompt_lookup_num_tokens"] = spec.get("lookup", c.lookup_tokens)
            chosen[name] = settings
        return chosen

    def sampling(self, spec: SystemSpec | None = None) -> dict:
        """``generate`` arguments of the configured decoding (pure nucleus: no top-k), with the system's safeguards."""
        from retrieval.config import PipelineConfig

        c, spec = self.config, spec or parse_system("bare")
        return PipelineConfig(
            grounded=False, do_sample=c.decoding == "nucleus", top_p=c.top_p, no_repeat_ngram_size=spec.get("no_repeat", c.no_repeat_ngram_size),
            repetition_penalty=spec.get("penalty", c.repetition_penalty), agreement_top_k=0, phrase_max_uses=0,
            first_token_mass=False, phrase_bias=0.0,  # no phrase guard: these systems have no phrases
        ).generation_kwargs()

    @torch.no_grad()
    def __call__(self, system: str, items: list[dict]) -> list[dict]:
        """One result per item: ``text``, ``steps``, ``phrase_steps``, ``phrases`` and per-stage ``latency``.

        Stage times of a batch are split evenly over its items. The sampling seed comes
        from the config, the system and the batch's first prompt.
        """
        torch.manual_seed(self.config.seed + zlib.crc32(f"{system}/{items[0]['id']}".encode()))
        spec = parse_system(system)
        if spec.base.startswith("bare"):
            return self._bare(spec, items)
        if spec.base == "mwt":
            return self._multiword(spec, items)
        if spec.base in GROUNDED:
            return self._grounded(spec, items)
        return self._dynamic(spec, items)

    def _bare(self, spec: SystemSpec, items: list[dict]) -> list[dict]:
        """The LM alone, or with the top documents in its context (``bare-rag``), under the reference's character budget."""
        from dynvocab.decoding.generation import generate_continuations
        from dynvocab.tokens.padding import pad_id
        from retrieval.reading import in_context_ids

        timer = StageTimer()
        prompts = [item["prompt"] for item in items]
        found = [[] for _ in items]
        lm = self.lm_for(spec)
        kwargs = {"max_new_tokens": 2 * self.config.continuation_tokens, "decode": self.tokenizer.decode, **self.sampling(spec)}
        if spec.base.startswith("bare-rag"):
            with timer.stage("retrieve"):
                found = self.index.search_documents(prompts, k=spec.get("docs", self.config.rag_documents))
        guard = kwargs.pop("no_repeat_ngram_size", 0) if spec.base.startswith("bare-rag") else 0

        def guarded() -> dict:
            """``kwargs`` with a fresh n-gram guard over what one ``generate`` call writes: the continuation, never
            the documents it reads (a guard keeps the width of the first call it sees)."""
            return kwargs | ({"logits_processor": LogitsProcessorList(
                [PhraseNoRepeatNGram(guard, lm.config.vocab_size, [], "new")])} if guard else {})

        budgets = [len(item["reference"]) for item in items]
        with timer.stage("decode"):
            encoded = [in_context_ids(self.tokenizer, documents, self.config.rag_document_tokens)
                       + self.tokenizer(prompt, add_special_tokens=not documents)["input_ids"]
                       for documents, prompt in zip(found, prompts)]
            if spec.base == "bare-rag-lookup":  # transformers' prompt lookup decodes one prompt at a time
                kwargs["prompt_lookup_num_tokens"] = spec.get("lookup", self.config.lookup_tokens)
                new = [generate_continuations(lm, [ids], pad_id(self.tokenizer), max_chars=[budget], **guarded())[0]
                       for ids, budget in zip(encoded, budgets)]
            else:
                new = generate_continuations(lm, encoded, pad_id(self.tokenizer), max_chars=budgets, **guarded())
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in new]
        latency = {stage: seconds / len(items) for stage, seconds in timer.totals().items()}
        latency = dict.fromkeys(STAGES, 0.0) | latency
        return [{"text": text, "steps": len(ids), "phrase_steps": 0, "phrases": 0, "latency": latency,
                 **self._cited(ids, documents)} for text, ids, documents in zip(texts, new, found)]

    def _cited(self, ids: list[int], documents: list[dict]) -> dict:
        """What a continuation (LM token ids) cites from the documents in its context (none: {})."""
        from dynvocab.decoding.citations import cite

        if not documents:
            return {}
        special = set(self.tokenizer.all_special_ids)
        tokens = [t for t in ids if t not in special]
        citations = cite(tokens, [d["text"] for d in documents], self.tokenizer, self.config.cite_tokens)
        return self._citation_record(citations, documents, self.tokenizer.decode(tokens), kept_spans=[])

    def _citation_record(self, citations: list, documents: list[dict], text: str, kept_spans: list[int]) -> dict:
        """A continuation's copied tokens (``kept_spans``: the tokens each step kept beyond the LM's own), the steps
        that copied, its tokens, and its citations: their count, the share of its characters they cover, and whether
        each stands verbatim at its offset in its document."""
        from dynvocab.decoding.citations import cited_share

        return {"copied_tokens": sum(kept_spans), "copy_steps": len(kept_spans),
                "tokens": len(self.tokenizer(text, add_special_tokens=False).input_ids),
                "citations": len(citations), "cited_share": cited_share(citations, text),
                "cited_verbatim": all(documents[c.document]["text"][c.document_start :].startswith(c.text)
                                      for c in citations)}

    def _multiword(self, spec: SystemSpec, items: list[dict]) -> list[dict]:
        """The MWT baseline under the reference's character budget."""
        from dynvocab.decoding.generation import generate_continuations
        from dynvocab.tokens.padding import pad_id

        start, vocab = time.perf_counter(), self.mwt.vocab
        prompts = [vocab.encode(item["prompt"], add_special_tokens=True) for item in items]
        new = generate_continuations(
            self.mwt.lm, prompts, pad_id(self.tokenizer), max_new_tokens=2 * self.config.continuation_tokens,
            decode=vocab.decode, max_chars=[len(item["reference"]) for item in items], **self.sampling(spec),
        )
        latency = dict.fromkeys(STAGES, 0.0) | {"decode": (time.perf_counter() - start) / len(items)}
        return [{"text": vocab.decode(ids, skip_special_tokens=True), "steps": len(ids),
                 "phrase_steps": sum(i >= vocab.vocab_size for i in ids), "phrases": len(vocab), "latency": latency}
                for ids in new]

    def _shared_settings(self, spec: SystemSpec) -> dict:
        """The pipeline settings of every phrase system: documents, phrases, decoding and its safeguards."""
        c = self.config
        return dict(
            top_k=c.top_k_docs, max_phrases=spec.max_phrases or c.max_phrases, max_new_tokens=2 * c.continuation_tokens,
            do_sample=c.decoding == "nucleus", top_p=c.top_p, edges=spec.get("edges", c.edges),
            ranking=spec.get("ranking", c.ranking), no_repeat_ngram_size=spec.get("no_repeat", c.no_repeat_ngram_size),
            repetition_penalty=spec.get("penalty", c.repetition_penalty), agreement_top_k=spec.get("agree", c.agreement_top_k),
            phrase_max_uses=spec.get("uses", c.phrase_max_uses), phrase_bias=float(spec.get("bias", c.phrase_bias)),
        )  # the PipelineConfig's generation_kwargs() are what sampling() gives the other systems

    def _pipeline_config(self, spec: SystemSpec):
        from retrieval.config import PipelineConfig

        c = self.config
        settings = self._shared_settings(spec)
        if spec.base == "dynamic-no-phrases":
            settings["max_phrases"] = 0
        return PipelineConfig(
            grounded=False, **settings, context_tokens=spec.get("context", c.context_tokens),
            state_threshold=spec.get("state", None), verify_top_k=spec.get("verify", c.verify_top_k),
            draft_tokens=spec.get("draft", c.draft_tokens), draft_step_cost=spec.get("draft_cost", None),
            first_token_mass=bool(spec.get("mass", c.first_token_mass)),
        )

    def _grounded_config(self, spec: SystemSpec):
        from retrieval.config import PipelineConfig

        c = self.config
        settings = self._shared_settings(spec)
        if spec.base == "grounded-suffix":
            settings["max_phrases"] = 0
        return PipelineConfig(
            grounded=True, **settings, first_token_mass=False, gamma=spec.get("gamma", c.gamma),
            relax_after=spec.get("relax", c.relax_after), read_documents=spec.get("docs", c.rag_documents),
            read_tokens=c.rag_document_tokens, draft_tokens=spec.get("draft", None), cite_tokens=c.cite_tokens,
            document_kv=spec.get("kv", None), fill_tokens=spec.get("fill", None),
        )

    def _grounded(self, spec: SystemSpec, items: list[dict]) -> list[dict]:
        """Grounded decoding through the pipeline, one prompt at a time; cited and copied shares from its result."""
        from retrieval.pipeline import PhrasePipeline

        model = self.trained(spec) if spec.base == "grounded" else self.untrained(spec)
        model.set_phrases([])
        model.dynvocab_config.readback = spec.get("readback", self.config.readback)
        pipeline = PhrasePipeline(model, self.index, self._grounded_config(spec))
        results = pipeline.batch([item["prompt"] for item in items], max_chars=[len(item["reference"]) for item in items])
        return [{"text": r.text, "steps": r.steps, "phrase_steps": r.phrase_steps, "phrases": r.num_phrases,
                 "latency": r.latency, **self._citation_record(r.citations, r.documents, r.text, r.kept_spans)}
                for r in results]

    def _dynamic(self, spec: SystemSpec, items: list[dict]) -> list[dict]:
        from retrieval.pipeline import PhrasePipeline

        model = self.untrained(spec) if spec.base == "dynamic-untrained" else self.trained(spec)
        model.set_phrases([])  # every request encodes its phrases from scratch: no cache from earlier prompts
        model.dynvocab_config.readback = spec.get("readback", self.config.readback)
        model.dynvocab_config.encode_dtype = spec.get("encode", self.config.encode_dtype)
        results = PhrasePipeline(model, self.index, self._pipeline_config(spec)).batch(
            [item["prompt"] for item in items], max_chars=[len(item["reference"]) for item in items]
        )
        return [{"text": r.text, "steps": r.steps, "phrase_steps": r.phrase_steps, "phrases": r.num_phrases,
                 "latency": r.latency} for r in results]


def _shown(path: Path) -> str:
    """``path`` relative to the working directory where it lies below it, as a command line would name it."""
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _training_summary(train_config: dict) -> dict:
    keys = ("mode", "max_steps", "batch_size", "max_length", "learning_rate", "phrases", "negatives")
    return {k: train_config[k] for k in keys if k in train_config}


def _multiword_summary(directory: Path) -> dict:
    from dynvocab.multiword import CONFIG_NAME

    if not (directory / CONFIG_NAME).exists():
        return {}
    saved = json.loads((directory / CONFIG_NAME).read_text())
    training = saved.get("train_config", {})
    return {"ngrams": len(saved["ngrams"]), "trains": "the n-gram embedding rows (LM frozen)",
            "training": _training_summary(training) | {k: training[k] for k in ("min_count", "max_ngram_tokens") if k in training},
            "final_loss": (saved.get("train_log") or [{}])[-1].get("loss")}


def _batches(todo: list[tuple[str, dict]], batch_size: int) -> list[tuple[str, list[dict]]]:
    """``(system, prompts)`` batches: system by system for the quality pass; one prompt at a time and every system
    in turn on it for the latency pass (``batch_size`` 1), so a machine that speeds up or slows down during the
    run shifts every system's timings alike instead of the ones that happened to run then."""
    if batch_size == 1:
        first_seen: dict[str, int] = {}
        for _, prompt in todo:
            first_seen.setdefault(prompt["id"], len(first_seen))
        return [(s, [p]) for s, p in sorted(todo, key=lambda pair: first_seen[pair[1]["id"]])]  # stable: systems in order
    batches = []
    for system in dict.fromkeys(s for s, _ in todo):
        items = [item for s, item in todo if s == system]
        batches += [(system, items[start : start + batch_size]) for start in range(0, len(items), batch_size)]
    return batches


def _generate_into(path: Path, todo: list[tuple[str, dict]], generators: Generators, batch_size: int, desc: str) -> list[dict]:
    """Generate ``todo`` (system, prompt) pairs in ``_batches``, appending each batch's records to ``path``."""
    if not todo:
        return []
    records = []
    with open(path, "a", encoding="utf-8") as f, tqdm(total=len(todo), desc=desc) as bar:
        for system, batch in _batches(todo, batch_size):
            finished = [
                {"system": system, "id": item["id"], "document": item["document"],
                 "prompt": item["prompt"], "reference": item["reference"], "batch_size": len(batch), **result}
                for item, result in zip(batch, generators(system, batch))
            ]
            f.write("".join(json.dumps(record) + "\n" for record in finished))  # one write: a kill loses whole batches
            f.flush()
            records.extend(finished)
            bar.update(len(batch))
    return records


def read_records(path: Path) -> list[dict]:
    """The records of a JSONL file; a last line cut short by a killed run is dropped from the file."""
    if not path.exists():
        return []
    return [record for _, record in iter_jsonl(path, "fix or delete the file to regenerate", drop_cut_last_line=True)]


def _resume(path: Path, systems: list[str], prompts: list[dict]) -> tuple[list[dict], list[tuple[str, dict]]]:
    """Records already in ``path`` (for these systems and prompts) and the pairs still to generate."""
    wanted = {p["id"]: p for p in prompts}
    done = [r for r in read_records(path) if r["id"] in wanted and r["system"] in systems]
    for record in done:
        if (record["prompt"], record["reference"]) != (wanted[record["id"]]["prompt"], wanted[record["id"]]["reference"]):
            raise ValueError(f"{path} holds generations for other prompts (another tokenizer or prefix length); "
                             "use another --output-dir or delete the file")
    seen = {(r["system"], r["id"]) for r in done}
    todo = [(s, p) for s in systems for p in prompts if (s, p["id"]) not in seen]
    if seen:
        logger.info("%s: %d generations done, %d to go", path.name, len(seen), len(todo))
    return done, todo


#: settings that change what is generated: a run resumes only under the same ones
GENERATION_SETTINGS = ("data", "model", "checkpoint", "mwt_checkpoint", "index", "encoder", "prefix_tokens",
                       "continuation_tokens", "decoding", "top_p", "top_k_docs", "max_phrases", "seed", "batch_size",
                       "readback", "encode_dtype", "edges", "ranking", "phrase_bias", "agreement_top_k", "phrase_max_uses",
                       "verify_top_k", "draft_tokens", "first_token_mass", "context_tokens", "skip_prompts",
                       "no_repeat_ngram_size", "repetition_penalty", "rag_documents", "rag_document_tokens", "lookup_tokens",
                       "gamma", "relax_after", "cite_tokens")

#: how runs that predate a setting generated: the encoder ran in float32, and phrases took mass from any token
SETTINGS_BEFORE_THEY_EXISTED = {"encode_dtype": "float32", "first_token_mass": False, "context_tokens": 0, "skip_prompts": 0,
                              "draft_tokens": 0, "gamma": 1.0, "relax_after": 0, "cite_tokens": 4}


def check_resumable(config: EvalConfig) -> None:
    """Refuse to add to ``output_dir`` generations made under other generation settings; then record these."""
    path = Path(config.output_dir) / "eval_config.json"
    if path.exists():
        before = json.loads(path.read_text())
        # a setting missing from the saved config is one the run predates: its generations were made as it says
        # in SETTINGS_BEFORE_THEY_EXISTED, or else without it
        before = {k: before.get(k, SETTINGS_BEFORE_THEY_EXISTED.get(k, "(none)")) for k in GENERATION_SETTINGS}
        changed = [k for k in GENERATION_SETTINGS if before[k] != getattr(config, k)]
        if changed:
            raise ValueError(
                f"{config.output_dir} holds generations made with other settings ({', '.join(f'{k}={before[k]!r}' for k in changed)}); "
                "use another --output-dir, or pass the same settings to resume"
            )
    save_config(config)


def generate_all(config: EvalConfig) -> tuple[list[dict], list[dict], Generators]:
    """The quality pass over every prompt and the latency pass, each resuming from its JSONL file."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_resumable(config)
    generators = Generators(config)
    if config.index:
        generators.index  # a given index is loaded and checked before any generation: held-out documents are refused
    prompts = held_out_prompts(generators.tokenizer, config)
    passes = {"generations": (prompts, config.batch_size), "latency": (prompts[: config.latency_prompts], 1)}
    finished = {}
    for name, (subset, batch_size) in passes.items():
        done, todo = _resume(out / f"{name}.jsonl", config.system_names, subset)
        if name == "latency" and todo:  # warm-up, excluded from the timings: first calls build caches and kernels
            for system in dict.fromkeys(s for s, _ in todo):
                generators(system, [todo[0][1]])
            freeze_loaded_objects()  # every system is loaded: no full collection over them inside a timed prompt
        finished[name] = done + _generate_into(out / f"{name}.jsonl", todo, generators, batch_size, name)
    return finished["generations"], finished["latency"], generators


def save_config(config: EvalConfig) -> None:
    (Path(config.output_dir) / "eval_config.json").write_text(json.dumps(asdict(config), indent=2) + "\n")
