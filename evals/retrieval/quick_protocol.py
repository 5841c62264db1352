"""``dynvocab eval-retrieval --quick true``: the older, smaller protocol (the default run is :mod:`.protocol`): BM25, MiniLM as shipped, MiniLM fine-tuned and DupMAE
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
from pathlib import Path

import faiss
import numpy as np

from dynvocab.data.assets import resolve_model
from dynvocab.data.corpora import corpus_split, fanoutqa_subquestions
from dynvocab.hardware.precision import encode_autocast
from encoders import DenseEncoder
from encoders.hybrid import REPRESENTATIONS, HybridEncoder, HybridVectors
from retrieval.index.hybrid import HybridIndex
from retrieval.loading import document_encoder
from retrieval.training import EXPORT_DIR
from retrieval.training.finetuning import FinetuneConfig, finetune
from retrieval.training.pairs import held_out_queries
from retrieval.training.pretraining import PretrainConfig, pretrain

from .config import RetrievalEvalConfig
from .footprint import exact_agreement, index_benchmark, time_search
from .quick_report import write_quick_markdown
from .ranking import ranking_metrics
from .report import save_report

__all__ = ["evaluate_quick", "query_sets"]

logger = logging.getLogger(__name__)


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
    """Mean pooling, under bf16 autocast where the device computes it natively (``dynvocab.hardware.precision``), as the hybrid
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


def evaluate_quick(config: RetrievalEvalConfig, command: str = "") -> Path:
    """Every quick system and seed; write ``results.json`` and ``report.md`` into the output folder; returns the
    report path."""
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
    return save_report(record, config.output_path, write_quick_markdown)
