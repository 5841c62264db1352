"""The settings of one retrieval-augmented generation request, and the defaults chosen for them by measurement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynvocab.config import check_at_least, check_field_types

#: what ``None`` means for the settings whose best value depends on the decoding, by measurement on 200
#: held-out Wikipedia leads (README, "Benchmarks"): greedy text keeps to phrases the LM ranks in its top 3;
#: sampled text keeps the LM's own next-token distribution and lets phrases carry on what it starts, with the
#: phrase bias chosen for the shipped encoder on development leads (results/wikipedia/nucleus-dev/; greedy's stays 0 for
#: the reason in results/wikipedia/greedy-bias2/).
#: grounded decoding's defaults, chosen on development prompts (docs/grounded.md): the relaxation, the verbatim run
#: of the text a document must hold before it applies, the draft length, and the corpus drafts' length
GROUNDED_GAMMA = 0.05
GROUNDED_RELAX_AFTER = 4
GROUNDED_DRAFT_TOKENS = 8
GROUNDED_FILL_TOKENS = 4
#: what a drafted forward call costs beyond a one-token call, in one-token calls, where drafts can change the text
#: (relaxed, top-k or sampled acceptance): fixed, so that the text does not depend on a timing; this is about what
#: dynvocab.decoding.verification.draft_step_cost measures on a 2-core CPU (0.09-0.33 in the reports' runs)
FIXED_DRAFT_STEP_COST = 0.3

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
    document_kv: int | None = field(
        default=None,
        metadata={"help": "Grounded decoding: the first n read documents come as keys and values read once (kept in "
                          "memory, or in a store beside the index: `dynvocab document-kv`) instead of the LM reading "
                          "them with every request (dynvocab.states.kv; rotary LMs). 1 is exact; with 2 or more a "
                          "later document did not attend to the ones before it. 0: off. None: 1 where the index (the "
                          "server: a served corpus's) keeps them beside it in float32 (the same text, without reading "
                          "the first document), else 0."},
    )
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
                          "(dynvocab.decoding.context_gate; 0: off)."},
    )
    state_threshold: float | None = field(
        default=None,
        metadata={"help": "A phrase may compete only where the cosine of the LM's state and its state just before the "
                          "phrase in a retrieved document reaches this (dynvocab.states.keys; one LM pass over the "
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
                          "in a retrieved document or earlier in the text (dynvocab.decoding.drafting; 0: off; None: 8 grounded, "
                          "0 otherwise)."},
    )
    fill_tokens: int | None = field(
        default=None,
        metadata={"help": "Grounded decoding: where neither the text nor the read documents have a draft, draft up to n "
                          "tokens that most often followed the text's last tokens across the index's documents "
                          "(dynvocab.decoding.drafting.CorpusDrafts, REST-style), kept only as far as the LM's own "
                          "greedy tokens agree and no document draft or relaxation is in force: the same text in fewer "
                          "LM calls (0: off; None: 4 grounded with drafts, else 0)."},
    )
    draft_step_cost: float | None = field(
        default=None,
        metadata={"help": "Drafting: what a forward call over a drafted step costs beyond a one-token call, in one-token "
                          "calls; a source drafts only while its drafts keep more tokens than that (0: always draft; "
                          "None: measured on this machine at the first request where drafts cannot change the text, "
                          "greedy with gamma=1 or verify_top_k=1, else 0.3 so that the text does not depend on a timing)."},
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
        if self.document_kv is not None and self.document_kv < 0:
            raise ValueError(f"document_kv={self.document_kv} must be >= 0, or None to read the first document from a "
                             "store beside the index where there is one")
        if self.draft_tokens is None:
            self.draft_tokens = GROUNDED_DRAFT_TOKENS if self.grounded else 0
        if self.fill_tokens is None:
            self.fill_tokens = GROUNDED_FILL_TOKENS if self.grounded and self.draft_tokens else 0
        if self.draft_step_cost is None and not self.drafts_keep_the_text:
            self.draft_step_cost = FIXED_DRAFT_STEP_COST
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma} must be in (0, 1] (1: the LM's own text given the documents)")
        if self.document_kv and not (self.grounded and self.document_kv <= self.read_documents):
            raise ValueError(f"document_kv={self.document_kv} reads stored keys and values of the first documents the "
                             f"LM reads, which only grounded decoding does: pass grounded=True and at most "
                             f"read_documents={self.read_documents}, or document_kv=0")
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
                  "draft_tokens", "fill_tokens")
        if min(getattr(self, name) or 0 for name in counts) < 0 or self.repetition_penalty <= 0:
            raise ValueError(", ".join(f"{name}={getattr(self, name)}" for name in counts)
                             + f" must be >= 0 and repetition_penalty={self.repetition_penalty} > 0")
        if self.draft_step_cost is not None and self.draft_step_cost < 0:
            raise ValueError(f"draft_step_cost={self.draft_step_cost} must be >= 0 (0: always draft), or None for "
                             "the default")
        if self.state_threshold is not None and not -1.0 <= self.state_threshold <= 1.0:
            raise ValueError(f"state_threshold={self.state_threshold} is a cosine: pass a value in [-1, 1] "
                             "(e.g. 0.97), or None for no state gate")
        if self.state_threshold is not None and self.realtime:
            raise ValueError("state_threshold gates a phrase set chosen up front; real-time mode adds phrases while it "
                             "decodes: pass one of them")
        if self.fill_tokens and not (self.grounded and self.draft_tokens):
            raise ValueError(f"fill_tokens={self.fill_tokens} fills the grounded steps that drafts leave empty: pass "
                             "grounded=True with draft_tokens >= 1, or fill_tokens=0")
        if self.draft_tokens and not (self.verify_top_k or self.grounded):
            raise ValueError(f"draft_tokens={self.draft_tokens} needs verified decoding: pass grounded=True (the "
                             "default), verify_top_k=1 (a draft is kept as far as the LM's own greedy text agrees) or "
                             "more, or draft_tokens=0")

    @property
    def drafts_keep_the_text(self) -> bool:
        """Whether drafts change only the number of LM calls, never the text: greedy decoding that keeps a drafted
        token only where it is the LM's best (gamma=1 grounded, verify_top_k=1 verified)."""
        return not self.do_sample and (self.gamma == 1.0 if self.grounded else self.verify_top_k == 1)

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
