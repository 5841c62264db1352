"""Settings of ``dynvocab eval-retrieval``: the full-corpus run (the default) and the quick one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dynvocab.config import JsonConfig

__all__ = ["RetrievalEvalConfig"]


@dataclass
class RetrievalEvalConfig(JsonConfig):
    """Settings of ``dynvocab eval-retrieval``; the defaults fit 2 shared CPU cores in well under an hour."""

    quick: bool = field(default=False, metadata={"help": "the quick 800-document protocol (trains per seed) instead of the full corpus"})
    encoders: str = field(default="", metadata={"help": "full corpus: comma-separated trained encoder folders scored beside BM25 and MiniLM"})
    full_heldout_queries: int = field(default=2000, metadata={"help": "full corpus: held-out leads (no FanOutQA evidence) giving a query each"})
    bootstrap_seed: int = field(default=0, metadata={"help": "seed of the paired-bootstrap resampling"})
    corpus: str = field(default="wikipedia", metadata={"help": "'wikipedia' (FanOutQA + held-out) or 'licenses' (held-out only; quick)"})
    output_dir: str = field(default="", metadata={"help": "report.md and results.json go here; '': results/retrieval/full-corpus, quick: results/retrieval/dupmae"})
    work_dir: str = field(default=".cache/eval-retrieval", metadata={"help": "cached corpus vectors; quick: pre-trained and fine-tuned models (reused)"})
    seeds: str = field(default="0,1,2", metadata={"help": "comma-separated fine-tuning seeds"})
    documents: int = field(default=1000, metadata={"help": "documents in the index (evidence and held-out ones first)"})
    heldout_queries: int = field(default=200, metadata={"help": "held-out documents that give one query each"})
    pretrain_steps: int = field(default=60, metadata={"help": "DupMAE pre-training steps on the corpus's training split"})
    pretrain_batch_size: int = field(default=16, metadata={"help": "sequences per pre-training step"})
    pretrain_max_length: int = field(default=64, metadata={"help": "tokens per pre-training sequence"})
    finetune_steps: int = field(default=30, metadata={"help": "fine-tuning steps of every fine-tuned system"})
    batch_size: int = field(default=16, metadata={"help": "pairs per fine-tuning step"})
    max_length: int = field(default=128, metadata={"help": "tokens per document"})
    mining_documents: int = field(default=400, metadata={"help": "documents encoded for hard-negative mining"})
    benchmark_documents: int = field(default=10_000, metadata={"help": "documents of the synthetic latency benchmark"})

    config_name: ClassVar[str] = "eval_retrieval_config.json"

    def __post_init__(self) -> None:
        if self.corpus not in ("wikipedia", "licenses"):
            raise ValueError(f"corpus={self.corpus!r}; choose 'wikipedia' or 'licenses'")
        if not self.quick and self.corpus != "wikipedia":
            raise ValueError(f"corpus={self.corpus!r} has no full-corpus evaluation; pass --quick true or corpus='wikipedia'")
        for name in ("full_heldout_queries", "documents", "heldout_queries", "pretrain_steps", "finetune_steps", "batch_size", "max_length",
                     "mining_documents", "benchmark_documents", "pretrain_batch_size", "pretrain_max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if not self.seed_list:
            raise ValueError(f"seeds={self.seeds!r} names no seed; pass e.g. '0,1,2'")

    @property
    def output_path(self) -> str:
        return self.output_dir or ("results/retrieval/dupmae" if self.quick else "results/retrieval/full-corpus")

    @property
    def encoder_list(self) -> list[str]:
        return [path.strip() for path in self.encoders.split(",") if path.strip()]

    @property
    def seed_list(self) -> list[int]:
        try:
            return [int(s) for s in self.seeds.split(",") if s.strip()]
        except ValueError as error:
            raise ValueError(f"seeds={self.seeds!r} must be comma-separated ints, e.g. '0,1,2'") from error
