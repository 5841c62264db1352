"""The one config of a dynamic-vocabulary model, saved as ``dynvocab_config.json``, and how every config is saved."""

from __future__ import annotations

import dataclasses
import json
import logging
import operator
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["CONFIG_NAME", "DynamicVocabConfig", "ENCODE_DTYPES", "READBACKS", "as_int", "JsonConfig", "check_encode_dtype", "check_field_types"]

logger = logging.getLogger(__name__)

CONFIG_NAME = "dynvocab_config.json"
#: how an emitted phrase is read back: as its LM tokens, or as the phrase encoder's input vector
READBACKS = ("tokens", "vector")
#: compute dtypes of the phrase encoder at inference ("auto": bfloat16 where the device computes it natively)
ENCODE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_encode_dtype(name: str) -> None:
    """Refuse an ``encode_dtype`` that is not one of ``ENCODE_DTYPES``, naming the choices."""
    if name not in ENCODE_DTYPES:
        raise ValueError(f"encode_dtype={name!r}; choose one of {', '.join(ENCODE_DTYPES)}")


class JsonConfig:
    """What every ``@dataclass`` config of the library shares: a dict, one JSON file named ``config_name``, typed fields.

    Keys saved by a newer version that this one does not know are warned about and dropped.
    A subclass calls :func:`check_field_types` first in its ``__post_init__``.
    """

    config_name: ClassVar[str] = "config.json"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            logger.warning("ignoring unknown %s keys %s (saved by a newer dynvocab?)", cls.__name__, unknown)
        return cls(**{k: v for k, v in values.items() if k in known})

    def save(self, directory: str | Path) -> None:
        """Write ``config_name`` in ``directory`` through a temporary file: a crash never leaves half a config."""
        path = Path(directory) / self.config_name
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        os.replace(partial, path)

    @classmethod
    def load(cls, directory: str | Path):
        """The config saved in ``directory``; a file that is not a JSON object of typed fields raises ``ValueError`` naming it."""
        path = Path(directory) / cls.config_name
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: is {directory} a directory written by {cls.__name__}.save?")
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path} is not valid JSON ({error}); restore it or save the config again") from error
        if not isinstance(values, dict):
            raise ValueError(f"{path} holds a {type(values).__name__}, not a JSON object of settings; save the config again")
        try:
            return cls.from_dict(values)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{path}: {error}") from error


@dataclass
class DynamicVocabConfig(JsonConfig):
    """Settings of the phrase encoder and phrase table.

    The ``base_*`` fields are filled from the wrapped LM and checked when a saved
    model is loaded onto another base model.
    """

    encoder_layers: int = field(default=1, metadata={"help": "Decoder layers of the LM copied into the phrase encoder."})
    encoder_model: str | PreTrainedModel | None = field(
        default=None, metadata={"help": "Build the encoder from this causal LM (same tokenizer) instead of the wrapped one."}
    )
    head_hidden_size: int | None = field(
        default=None, metadata={"help": "Hidden width of the encoder's output MLP; None means the LM's hidden size."}
    )
    max_phrase_tokens: int = field(default=8, metadata={"help": "Longest phrase, in LM tokens (the paper uses 8)."})
    phrase_dtype: str = field(
        default="float32",
        metadata={"help": "Storage and scoring dtype of phrase output vectors; 'bfloat16' halves memory and time for huge tables."},
    )
    readback: str = field(
        default="tokens",
        metadata={"help": "How generate() reads an emitted phrase back: 'tokens' (its LM tokens in one cached "
                          "forward call, one decoding step) or 'vector' (the phrase encoder's input vector, the paper's)."},
    )
    trained_readback: str | None = field(
        default=None, metadata={"help": "The read-back the phrase encoder was trained for (set by dynvocab train; "
                                        "None: unknown). Decoding with the other one warns."}
    )
    phrase_score_scale: float = field(
        default=1.0, metadata={"help": "Calibration: phrase logits are scale * (h . e_out) + bias, next to the LM's own."}
    )
    phrase_score_bias: float = field(
        default=0.0, metadata={"help": "Calibration bias added to every phrase logit (negative: phrases win less often)."}
    )
    encode_batch_size: int = field(default=256, metadata={"help": "Phrases encoded per forward pass when caching vectors."})
    phrase_cache_mb: int = field(
        default=256, metadata={"help": "MiB of phrase output vectors kept across phrase sets (least recently used dropped "
                                       "first), so a phrase encoded for one request is not encoded again; 0: off."}
    )
    encode_dtype: str = field(
        default="auto",
        metadata={"help": "Compute dtype (autocast) of the phrase encoder at inference: 'float32', 'bfloat16', "
                          "'float16', or 'auto' (bfloat16 where the device computes it natively, else float32). "
                          "Training always runs the encoder in its own dtype."},
    )
    base_model_type: str | None = field(default=None, metadata={"help": "model_type of the wrapped LM."})
    base_hidden_size: int | None = field(default=None, metadata={"help": "Hidden size of the wrapped LM."})
    base_vocab_size: int | None = field(default=None, metadata={"help": "Vocabulary size V of the wrapped LM."})
    tokenizer_fingerprint: str | None = field(default=None, metadata={"help": "Hash of the tokenizer's vocabulary."})

    config_name: ClassVar[str] = CONFIG_NAME

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.encoder_layers < 1:
            raise ValueError(f"encoder_layers must be >= 1, got {self.encoder_layers}")
        if not 2 <= self.max_phrase_tokens <= 64:
            raise ValueError(
                f"max_phrase_tokens must be between 2 and 64, got {self.max_phrase_tokens}: "
                "a phrase has at least two tokens (a single token is already in the vocabulary)"
            )
        if self.head_hidden_size is not None and self.head_hidden_size < 1:
            raise ValueError(f"head_hidden_size must be positive or None, got {self.head_hidden_size}")
        if self.phrase_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"phrase_dtype must be 'float32', 'bfloat16' or 'float16', got {self.phrase_dtype!r}")
        if self.readback not in READBACKS:
            raise ValueError(f"readback must be 'tokens' or 'vector', got {self.readback!r}")
        if self.trained_readback not in (None, *READBACKS):
            raise ValueError(f"trained_readback must be 'tokens', 'vector' or None, got {self.trained_readback!r}")
        if not self.phrase_score_scale > 0:
            raise ValueError(f"phrase_score_scale must be > 0, got {self.phrase_score_scale}")
        check_encode_dtype(self.encode_dtype)
        if self.encode_batch_size < 1:
            raise ValueError(f"encode_batch_size must be >= 1, got {self.encode_batch_size}")
        if self.phrase_cache_mb < 0:
            raise ValueError(f"phrase_cache_mb must be >= 0 (0 turns the cache off), got {self.phrase_cache_mb}")

    def readback_mismatch(self) -> str | None:
        """A warning when the model decodes with another read-back than its encoder was trained for, else None."""
        if self.trained_readback is None or self.trained_readback == self.readback:
            return None
        return (f"this phrase encoder was trained for readback={self.trained_readback!r} but decodes with "
                f"readback={self.readback!r}: its phrase scores were fitted to other states, so phrases fit worse; set "
                f"model.dynvocab_config.readback = {self.trained_readback!r}, or train with --readback {self.readback}")


def check_field_types(config) -> None:
    """Raise ``TypeError`` naming a dataclass field whose value is not of its annotated type (int, float, str, bool, or None)."""
    for spec in dataclasses.fields(config):
        value, allowed = getattr(config, spec.name), _annotated_types(_declared_annotation(type(config), spec))
        if allowed is None:
            continue
        if value is None:
            ok = type(None) in allowed
        elif isinstance(value, bool):
            ok = bool in allowed
        else:
            ok = isinstance(value, tuple(t for t in allowed if t not in (type(None), bool)))
        if not ok:
            names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise TypeError(
                f"{type(config).__name__}.{spec.name} must be {names}, got {type(value).__name__} {value!r}; "
                f"pass e.g. {spec.name}={spec.default!r}"
            )


def as_int(value, name: str, minimum: int | None = None) -> int:
    """``value`` as a Python int: ints and NumPy or torch integer scalars pass; a bool, float, string or a value
    below ``minimum`` raises naming ``name``, the value and the rule."""
    rule = "an int" if minimum is None else "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be {rule}, not a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}={value!r} must be {rule}, got {type(value).__name__}; pass e.g. {name}=int(value)") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name}={number} must be {rule}")
    return number


def check_at_least(config, minimum: int, names: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the first of ``names`` whose value in ``config`` is below ``minimum`` (or NaN)."""
    for name in names:
        value = getattr(config, name)
        if not value >= minimum:
            default = getattr(type(config), name, None)
            hint = f"; pass e.g. {name}={default!r}" if default is not None and default >= minimum else ""
            raise ValueError(f"{type(config).__name__}.{name}={value!r} must be >= {minimum}{hint}")


def _declared_annotation(cls: type, spec: dataclasses.Field):
    """The annotation as written in the class body: ``HfArgumentParser`` rewrites ``spec.type`` in place (a
    resolved class, ``int | None`` cut to ``int``) when the CLI builds its parser, the class's own record stays."""
    for klass in cls.__mro__:
        declared = vars(klass).get("__annotations__", {})
        if spec.name in declared:
            return declared[spec.name]
    return spec.type


_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "None": type(None)}


def _annotated_types(annotation) -> tuple[type, ...] | None:
    """``"int | None"`` -> ``(int, NoneType)``; a float field takes ints too; None for annotations it does not check."""
    names = [part.strip() for part in str(annotation).split("|")]
    if not all(name in _TYPES for name in names):
        return None
    types = tuple(_TYPES[name] for name in names)
    return types + (int,) if float in types else types
