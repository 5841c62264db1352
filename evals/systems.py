"""Names of the systems the protocol compares, with per-system settings for ablations.

A system is written ``base[@N][:key=value]...``: ``dynamic@256:readback=vector`` is the
trained dynamic model with at most 256 phrases per prompt, reading phrases back by
their encoder vectors. A setting left out takes the protocol's default, so
``dynamic`` alone is the library's shipped configuration. ``:lm=DIR`` runs a system on
another LM with the same tokenizer, e.g. the adapter ``dynvocab finetune-lm`` wrote
(``bare:lm=runs/lm-licensedb/final``: the LM fine-tuned on the domain).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dynvocab.config import ENCODE_DTYPES

#: base systems and what each is
BASES = {
    "bare": "the LM alone, KV cache on",
    "bare-rag": "the LM with the top retrieved documents in its context (in-context retrieval augmentation)",
    "bare-rag-lookup": "bare-rag decoded with transformers' prompt-lookup decoding (lossless, batch 1)",
    "dynamic": "the trained phrase encoder, phrases from the top retrieved documents (the paper's mode)",
    "grounded": "grounded decoding: the LM reads the top documents and writes every token; the trained encoder's "
                "phrases and drafts from the documents propose, kept while the LM vouches for them (gamma)",
    "grounded-suffix": "grounded decoding with no phrase encoder: drafts from the documents and the text only",
    "dynamic-untrained": "the same with an untrained phrase encoder",
    "dynamic-no-phrases": "the dynamic-vocabulary model with an empty phrase set",
    "mwt": "an MWT-style static multi-word vocabulary (Gee et al., 2024)",
}

#: setting -> (type, allowed values or None, which bases take it)
_DYNAMIC = ("dynamic", "dynamic-untrained")
#: bases that decode grounded in documents the LM reads
GROUNDED = ("grounded", "grounded-suffix")
#: bases that put the top retrieved documents in the LM's context
READING = ("bare-rag", "bare-rag-lookup", *GROUNDED)
#: bases that run a trained checkpoint (a LoRA or fully fine-tuned one brings its own LM)
TRAINED = ("dynamic", "dynamic-no-phrases", "grounded")
_ALL = tuple(BASES)
#: bases whose LM ``:lm=DIR`` replaces (the MWT baseline brings its own)
_LM = tuple(base for base in BASES if base != "mwt")
OPTIONS = {
    "readback": (str, ("tokens", "vector"), _DYNAMIC),
    "encode": (str, ENCODE_DTYPES, _DYNAMIC),
    "edges": (str, ("content", "any"), _DYNAMIC),
    "ranking": (str, ("relevance", "frequency"), _DYNAMIC),
    "bias": (float, None, _DYNAMIC),
    "agree": (int, None, _DYNAMIC),
    "uses": (int, None, _DYNAMIC),
    "context": (int, None, _DYNAMIC),
    "state": (float, None, _DYNAMIC),
    "verify": (int, None, _DYNAMIC),
    "draft": (int, None, (*_DYNAMIC, *GROUNDED)),
    "gamma": (float, None, GROUNDED),
    "relax": (int, None, GROUNDED),
    "kv": (int, None, GROUNDED),
    "fill": (int, None, GROUNDED),
    "draft_cost": (float, None, _DYNAMIC),
    "mass": (int, (0, 1), _DYNAMIC),
    "checkpoint": (str, None, TRAINED),
    "lm": (str, None, _LM),
    "no_repeat": (int, None, _ALL),
    "penalty": (float, None, _ALL),
    "docs": (int, None, READING),
    "lookup": (int, None, ("bare-rag-lookup",)),
}


@dataclass(frozen=True)
class SystemSpec:
    """One parsed system name."""

    name: str
    base: str
    max_phrases: int | None = None
    options: dict = field(default_factory=dict)

    def get(self, key: str, default):
        return self.options.get(key, default)


def parse_system(name: str) -> SystemSpec:
    """``"dynamic@256:readback=vector"`` -> ``SystemSpec``; raises ``ValueError`` naming what is wrong."""
    head, *settings = name.strip().split(":")
    base, at, cap = head.partition("@")
    if base not in BASES:
        raise ValueError(f"system {name!r}: unknown base {base!r}; choose from {sorted(BASES)}")
    if at and not (cap.isdigit() and int(cap) > 0 and base in _DYNAMIC):
        raise ValueError(f"system {name!r}: '@N' caps the phrases of a dynamic system and N must be positive, e.g. dynamic@256")
    options = {}
    for setting in settings:
        key, eq, value = setting.partition("=")
        if not eq or key not in OPTIONS:
            raise ValueError(f"system {name!r}: setting {setting!r} is not key=value with a key from {sorted(OPTIONS)}")
        kind, allowed, bases = OPTIONS[key]
        if base not in bases:
            raise ValueError(f"system {name!r}: {key} applies to {', '.join(bases)} only")
        try:
            typed = kind(value)
        except ValueError:
            raise ValueError(f"system {name!r}: {key}={value!r} is not a {kind.__name__}") from None
        if allowed is not None and typed not in allowed:
            raise ValueError(f"system {name!r}: {key}={value!r}; choose from {list(allowed)}")
        options[key] = typed
    return SystemSpec(name.strip(), base, int(cap) if at else None, options)


#: the settings every system may carry without changing what it is compared as
SAFEGUARDS = ("no_repeat", "penalty")


def matched(system: str, base: str, systems: list[str], no_repeat: int = 0, penalty: float = 1.0,
            settings: frozenset[str] = frozenset()) -> str | None:
    """The system of ``base`` among ``systems`` decoded with ``system``'s safeguards and no setting but
    ``settings`` (``{"lm"}``: an LM of its own, e.g. the fine-tuned one), or None; it may be ``system`` itself.

    A system is judged against others with the same ``no_repeat_ngram_size`` and repetition penalty: a guard
    changes the text as much as phrases do. ``no_repeat``/``penalty`` are the protocol's defaults for systems that
    set neither.
    """
    def guards(name: str) -> tuple[int, float]:
        spec = parse_system(name)
        return spec.get("no_repeat", no_repeat), spec.get("penalty", penalty)

    wanted = guards(system)
    return next((name for name in systems if parse_system(name).base == base
                 and set(parse_system(name).options) - set(SAFEGUARDS) == set(settings) and guards(name) == wanted), None)


def matched_bare(system: str, systems: list[str], no_repeat: int = 0, penalty: float = 1.0) -> str | None:
    """The bare LM (not a fine-tuned one) among ``systems`` with ``system``'s safeguards (``matched``), or None
    for a bare LM itself."""
    found = matched(system, "bare", systems, no_repeat, penalty)
    return None if found == system else found
