"""Every training setting in one dataclass, saved as ``train_config.json`` beside each checkpoint."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..config import READBACKS, JsonConfig, check_at_least, check_field_types
from .corpus import CorpusSettings, check_corpus_settings
from .loop import LoopSettings, check_loop_settings, loop_field
from .negatives import SOURCES

__all__ = ["MODES", "PHRASE_SOURCES", "READBACKS", "TrainConfig"]

logger = logging.getLogger(__name__)

PHRASE_SOURCES = ("n-words", "n-ids", "fmm")
MODES = ("full", "lora", "frozen")


@dataclass
class TrainConfig(LoopSettings, CorpusSettings, JsonConfig):
    """Settings of ``dynvocab train``; defaults follow the paper where it gives one (the loop's own: ``LoopSettings``)."""

    model: str = field(default="smollm2", metadata={"help": "Hub name or path of the causal LM; 'smollm2' is the offline asset."})
    output_dir: str = field(default="runs/dynvocab", metadata={"help": "Checkpoints and logs go here."})
    phrases: str = field(default="n-words", metadata={"help": f"Phrase source of the samples: one of {PHRASE_SOURCES}."})
    negatives: str = field(
        default="in-batch,pre-batch,prefix,self-retrieval", metadata={"help": f"Comma-separated negatives from {SOURCES}."}
    )
    mode: str = field(default="frozen", metadata={"help": f"What trains besides the phrase encoder: one of {MODES}."})
    readback: str = field(
        default="tokens",
        metadata={"help": "The read-back to train for: 'tokens' (generate()'s default: the next item is scored on the LM's "
                          "states over the plain text; with mode=frozen those come from a state cache) or 'vector' (the "
                          "paper's: an emitted phrase is fed back as its input vector)."},
    )
    state_cache: str | None = field(
        default=None, metadata={"help": "State cache of readback=tokens with mode=frozen, built there if absent "
                                        "(dynvocab cache-states); default: <output_dir>/state-cache."}
    )
    incomplete_cache: bool = field(
        default=False, metadata={"help": "Train on the finished shards of a state cache whose build has not ended (it "
                                         "may still run in another process); the log records how many chunks."}
    )
    spelling_negatives: bool = field(
        default=False, metadata={"help": "readback=tokens: count a phrase that spells the text right after a position as "
                                         "a negative there too (the paper's L_p does; token read-back would emit it as "
                                         "those very tokens, so by default it leaves that position's softmax)."}
    )
    eval_every: int = field(default=0, metadata={"help": "Steps between held-out validation figures in the log (0: none; "
                                                         "readback=tokens with mode=frozen)."})
    validation_chunks: int = field(default=256, metadata={"help": "Held-out chunks scored by eval_every (from every "
                                                                   "50th training text, which then never trains)."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (paper: 8)."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha (paper: 32)."})
    lora_dropout: float = field(default=0.1, metadata={"help": "LoRA dropout (paper: 0.1)."})
    encoder_layers: int = field(default=1, metadata={"help": "Decoder layers copied into the phrase encoder."})
    max_length: int = field(default=128, metadata={"help": "Tokens per training sequence."})
    batch_size: int = field(default=8, metadata={"help": "Sequences per step and process."})
    learning_rate: float = loop_field("learning_rate", 3e-4)
    lm_learning_rate: float | None = field(
        default=None, metadata={"help": "Peak learning rate of what trains in the LM (its LoRA adapter, or all of it with "
                                        "mode=full), which wants far less than a fresh encoder; default: learning_rate."}
    )
    weight_decay: float = loop_field("weight_decay", 0.0)
    phrase_weight: float = field(default=1.0, metadata={"help": "Weight of L_p."})
    token_weight: float = field(default=1.0, metadata={"help": "Weight of L_t."})
    kl_weight: float = field(default=1.0, metadata={"help": "Weight of L_kl (readback=vector; it is zero under tokens)."})
    distill_weight: float = field(
        default=0.0, metadata={"help": "readback=tokens: weight of the squared gap between a phrase's score and the LM's "
                                       "own log-probability of its tokens, wherever it spells the text."}
    )
    min_gap: int = field(default=5, metadata={"help": "Plain tokens at least between two phrases of a sample."})
    phrase_prob: float = field(default=0.5, metadata={"help": "Chance a free position starts a phrase."})
    num_prebatches: int = field(default=1, metadata={"help": "Previous batches whose golds are pre-batch negatives."})
    max_negatives: int = field(default=1024, metadata={"help": "Negatives kept per batch at most."})
    fmm_top_k: int = field(default=50000, metadata={"help": "Frequent n-grams mined for FMM samples."})
    support_texts: int = field(default=2000, metadata={"help": "Training texts used as the support corpus (FMM, corpus-retrieval)."})

    config_name: ClassVar[str] = "train_config.json"

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.phrases not in PHRASE_SOURCES:
            raise ValueError(f"phrases={self.phrases!r}; choose one of {PHRASE_SOURCES}")
        if self.readback not in READBACKS:
            raise ValueError(f"readback={self.readback!r}; choose one of {READBACKS}")
        if self.uses_state_cache and "generation" in self.negative_names:
            raise ValueError(
                "negatives include 'generation', which runs the LM at every step, while readback='tokens' with "
                "mode='frozen' trains from cached LM states without running it; drop 'generation' (self-retrieval and "
                "corpus-retrieval give continuations too), or pick readback='vector'"
            )
        if self.eval_every and not self.uses_state_cache:
            raise ValueError("eval_every scores held-out cached states, so it needs readback='tokens' with mode='frozen'; "
                             "set eval_every=0")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}; choose one of {MODES}")
        unknown = [n for n in self.negative_names if n not in SOURCES]
        if unknown:
            raise ValueError(f"negatives={self.negatives!r} has unknown names {unknown}; choose from {list(SOURCES)}")
        check_loop_settings(self)
        check_corpus_settings(self)
        check_at_least(self, 1, ("max_length", "batch_size", "encoder_layers", "validation_chunks"))
        check_at_least(self, 0, ("eval_every",))
        if self.lm_learning_rate is not None and self.mode == "frozen":
            raise ValueError("lm_learning_rate is set but mode='frozen' trains nothing in the LM; drop it or pick mode lora or full")
        for name in ("output_dir", "state_cache"):
            path = getattr(self, name)
            if path is not None and Path(path).exists() and not Path(path).is_dir():
                raise ValueError(f"{name}={path!r} is an existing file, not a folder; pass a folder path (a new one is "
                                 "created), or move the file away")

    @property
    def uses_state_cache(self) -> bool:
        """Frozen LM and token read-back: every state the loss needs is fixed, so it comes from the state cache."""
        return self.readback == "tokens" and self.mode == "frozen"

    @property
    def negative_names(self) -> list[str]:
        return [n.strip() for n in self.negatives.split(",") if n.strip()]
