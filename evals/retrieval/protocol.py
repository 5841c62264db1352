"""``dynvocab eval-retrieval``. By default the full-corpus evaluation (:mod:`.full_protocol`): every offline lead
indexed, BM25, MiniLM as shipped and the trained encoders given, with paired intervals against MiniLM.

``--quick true`` runs the older, smaller protocol below: BM25, MiniLM as shipped, MiniLM fine-tuned and DupMAE
(pre-trained on the target corpus, then fine-tuned) in each representation, on test queries no training pair saw,
over an index of only ``documents`` documents, where every system is near the ceiling.
Query sets: the FanOutQA dev sub-questions whose evidence page is a lead (Wikipedia only), and one
held-out sentence of each of ``heldout_queries`` held-out documents (cut out of the indexed text).
The index holds the evidence pages, those held-out documents and training documents up to
``documents``. Fine-tuning runs once per seed for each fine-tuned system, with the same budget.
Every run lands in ``work_dir`` and is reused, so a killed evaluation resumes.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import faiss
import numpy as np

from dynvocab.assets import resolve_model
from dynvocab.config import JsonConfig
from dynvocab.corpora import corpus_split, fanoutqa_subquestions
from dynvocab.precision import encode_autocast
from encoders import DenseEncoder
from encoders.hybrid import REPRESENTATIONS, HybridEncoder, HybridVectors
from retrieval.index.hybrid import HybridIndex
from retrieval.loading import document_encoder
from retrieval.training import EXPORT_DIR
from retrieval.training.finetuning import FinetuneConfig, finetune
from retrieval.training.pairs import held_out_queries
from retrieval.training.pretraining import PretrainConfig, pretrain

from .footprint import exact_agreement, index_benchmark, time_search
from .ranking import ranking_metrics
from .report import save_report, write_markdown

__all__ = ["RetrievalEvalConfig", "evaluate_retrieval", "query_sets"]

logger = logging.getLogger(__name__)


@dataclass
class RetrievalEvalConfig(JsonConfig):
    """Settings of ``dynvocab eval-retrieval``; the defaults fit 2 shared CPU cores in well under an hour."""

    quick: bool = field(default=False, metadata={"help": "the quick 800-document protocol (trains per seed) instead of the full corpus"})
    encoders: str = field(default="", metadata={"help": "full corpus: comma-separated trained encoder folders scored beside BM25 and MiniLM"})
    full_heldout_queries: int = field(default=2000, metadata={"help": "full corpus: held-out leads (no FanOutQA evidence) giving a query each"})
    bootstrap_seed: int = field(default=0, metadata={"help": "seed of the paired-bootstrap resampling"})
    corpus: str = field(default="wikipedia", metadata={"help": "'wikipedia' (FanOutQA + held-out) or 'licenses' (held-out only; quick)"})
    output_dir: str = field(default="", metadata={"help": "report.md and results.json go here; '': results/retrieval-full, quick: results/dupmae"})
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
        return self.output_dir or ("results/dupmae" if self.quick else "results/retrieval-full")

    @property
    def encoder_list(self) -> list[str]:
        return [path.strip() for path in self.encoders.split(",") if path.strip()]

    @property
    def seed_list(self) -> list[int]:
        try:
            return [int(s) for s in self.seeds.split(",") if s.strip()]
        except ValueError as error:
            raise ValueError(f"seeds={self.seeds!r} must be comma-separated ints, e.g. '0,1,2'") from error


def query_sets(config: RetrievalEvalConfig) -> tuple[list[dict], dict[str, list[dict]]]:
    """``(indexed documents, {set name: queries {"question", "title"}})``; ``title`` is the relevant document id."""
    train, held = corpus_split(config.corpus)
    rng = random.Random(0)
    chosen = rng.sample(held, min(config.heldout_queries, len(held)))
    queries, cut = held_out_queries(chosen)
    sets, documents = {"held-out sentences": queries}, {d["id"]: d for d in cut}
    if config.corpus == "wikipedia":
        fanout = fanoutqa_subquestions()
        sets["FanOutQA sub-questions"] = fanout
        by_id = {d["id"]: d for d in train + held}
        for question in fanout:
            documents.setdefault(question["title"], by_id[question["title"]])
    fill = [d for d in rng.sample(train, len(train)) if d["id"] not in documents]
    for document in fill[: max(0, config.documents - len(documents))]:
        documents[document["id"]] = document
    return list(documents.values()), sets


def _rankings(ids: np.ndarray, documents: list[dict]) -> list[list[str]]:
    return [[documents[i]["id"] for i in row if i >= 0] for row in ids]


def _score(ids: np.ndarray, documents: list[dict], queries: list[dict]) -> dict[str, float]:
    return ranking_metrics(_rankings(ids, documents), [q["title"] for q in queries], recall_ks=(5, 20, 100))


def _bm25(documents: list[dict], sets: dict[str, list[dict]]) -> dict:
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([d["text"] for d in documents], stopwords="en", show_progress=False), show_progress=False)
    out = {}
    for name, queries in sets.items():
        tokens = bm25s.tokenize([q["question"] for q in queries], stopwords="en", show_progress=False)
        ids, _ = retriever.retrieve(tokens, k=min(100, len(documents)), show_progress=False)
        out[name] = _score(ids, documents, queries)
    return out


def _dense(encoder: DenseEncoder, documents: list[dict], sets: dict[str, list[dict]]) -> dict:
    index = faiss.IndexFlatIP(encoder.dim)
    index.add(encoder.encode([d["text"] for d in documents], show_progress_bar=True))
    out = {}
    for name, queries in sets.items():
        ids = index.search(encoder.encode([q["question"] for q in queries], show_progress_bar=False), 100)[1]
        out[name] = _score(ids, documents, queries)
    out["index_bytes"] = index.ntotal * index.d * 4
    return out


def _dense_encoder(path: str, config: RetrievalEvalConfig) -> DenseEncoder:
    """Mean pooling, under bf16 autocast where the device computes it natively (``dynvocab.precision``), as the hybrid
    encoders are run here."""
    return document_encoder(path, max_length=config.max_length)


def _truncate(vectors: HybridVectors, representation: str) -> HybridVectors:
    """The ``representation`` view of ``both`` vectors: top-k ids come sorted by weight, so the first k are the top k."""
    use_dense, k = REPRESENTATIONS[representation]
    dense = vectors.dense if use_dense else vectors.dense[:, :0]
    return HybridVectors(dense, vectors.ids[:, :k], vectors.values[:, :k])


def _hybrid(encoder: HybridEncoder, documents: list[dict], sets: dict[str, list[dict]]) -> dict:
    """Every representation from one encoding (``both``: CLS plus the top 384 entries). Its metrics score every
    document exactly (the representation, not the index's pruning); the default index's MRR@10, top-10
    agreement with exact scoring and latency are recorded beside them."""
    with encode_autocast(encoder.device):
        docs = encoder.encode([d["text"] for d in documents], show_progress_bar=True)
        encoded = {name: encoder.encode([q["question"] for q in queries], show_progress_bar=False)
                   for name, queries in sets.items()}
    out = {}
    for representation in REPRESENTATIONS:
        index = HybridIndex.build(documents, vectors=_truncate(docs, representation), vocab_size=encoder.vocab_size)
        exact = index.exhaustive()
        row = {"index_bytes": index.nbytes()["total"]}
        for name, queries in sets.items():
            query = _truncate(encoded[name], representation)
            exact_ids = exact.search(query, 100)[1]
            row[name] = _score(exact_ids, documents, queries)
            row[f"{name} ms/query"] = time_search(index.search, query, k=10)
            if index.sparse is not None:
                row[f"{name} default index mrr@10"] = _score(index.search(query, 100)[1], documents, queries)["mrr@10"]
                row[f"{name} top-10 vs exhaustive"] = exact_agreement(index.search(query, 10)[1], exact_ids)
        out[representation] = row
    return out


def _pretrained(config: RetrievalEvalConfig) -> tuple[Path, dict]:
    """DupMAE pre-training on the corpus's training split (continued from MiniLM), reused when done."""
    folder = Path(config.work_dir) / f"dupmae-{config.corpus}"
    if not (folder / EXPORT_DIR).is_dir():
        settings = PretrainConfig(model="minilm", data=config.corpus, output_dir=str(folder), max_steps=config.pretrain_steps,
                                  batch_size=config.pretrain_batch_size, max_length=config.pretrain_max_length,
                                  learning_rate=1e-4, warmup_steps=max(1, config.pretrain_steps // 10),
                                  save_every=max(1, config.pretrain_steps // 2), log_every=5)
        resume = any(folder.glob("checkpoint-*/trainer_state.json"))
        pretrain(settings, resume=resume)
    log = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    seconds = log[-1]["seconds"]
    sequences = log[-1]["step"] * config.pretrain_batch_size
    return folder / EXPORT_DIR, {"steps": log[-1]["step"], "seconds": seconds, "sequences_per_s": sequences / seconds,
                                 "final_losses": {k: log[-1][k] for k in ("loss", "mlm", "decoder", "bow")},
                                 "first_losses": {k: log[0][k] for k in ("loss", "mlm", "decoder", "bow")}}


def _finetuned(config: RetrievalEvalConfig, name: str, model: str, encoder: str, seed: int) -> Path:
    folder = Path(config.work_dir) / f"{name}-{config.corpus}-seed{seed}"
    if not (folder / EXPORT_DIR).is_dir():
        settings = FinetuneConfig(model=model, encoder=encoder, data=config.corpus, output_dir=str(folder), seed=seed,
                                  max_steps=config.finetune_steps, batch_size=config.batch_size, max_length=config.max_length,
                                  learning_rate=3e-5, warmup_steps=max(1, config.finetune_steps // 10),
                                  save_every=config.finetune_steps, mining_documents=config.mining_documents,
                                  log_every=max(1, config.finetune_steps // 8), dense_pooling="cls", fusion_queries=0)
        finetune(settings, resume=any(folder.glob("checkpoint-*/trainer_state.json")))
    return folder / EXPORT_DIR


def evaluate_retrieval(config: RetrievalEvalConfig, command: str = "") -> Path:
    """Run the full-corpus evaluation, or with ``quick`` every quick system and seed; write ``results.json`` and
    ``report.md`` into the output folder; returns the report path."""
    if not config.quick:
        from .full_protocol import evaluate_full_corpus

        return evaluate_full_corpus(config, command)
    documents, sets = query_sets(config)
    logger.info("index of %d documents; query sets %s", len(documents), {k: len(v) for k, v in sets.items()})
    results: dict = {"BM25 (bm25s)": _bm25(documents, sets)}
    results["MiniLM as shipped"] = _dense(_dense_encoder(resolve_model("minilm"), config), documents, sets)
    pretrained, pretraining = _pretrained(config)
    for seed in config.seed_list:
        tuned = _finetuned(config, "minilm-ft", "minilm", "dense", seed)
        results[f"MiniLM fine-tuned, seed {seed}"] = _dense(_dense_encoder(str(tuned), config), documents, sets)
        tuned = _finetuned(config, "dupmae-ft", str(pretrained), "hybrid", seed)
        encoder = HybridEncoder.from_pretrained(str(tuned), representation="both", max_length=config.max_length)
        for representation, row in _hybrid(encoder, documents, sets).items():
            results[f"DupMAE+FT {representation}, seed {seed}"] = row
    record = {"command": command, "config": config.to_dict(), "documents": len(documents),
              "queries": {k: len(v) for k, v in sets.items()}, "pretraining": pretraining, "systems": results,
              "benchmark": index_benchmark(n=config.benchmark_documents)}
    return save_report(record, config.output_path, write_markdown)
