"""What the sparse half of a hybrid could add on the full corpus: MRR@10 per query set at every fusion weight.

A diagnostic, not a system: the weight is swept on the evaluation's own queries, so the best row is an upper bound on
what any held-out choice of it could reach. `finetune-encoder` chooses the weight on training pairs instead
(`retrieval/training/fusion.py`). Corpus vectors come from `dynvocab eval-retrieval`'s cache, so only the queries are
encoded:

    python experiments/retrieval-full/fusion_sweep.py runs/r34/hybrid-mean-seed0/final --output sweep.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig

from dynvocab.data.assets import resolve_model
from encoders.hybrid import HybridVectors
from evals.retrieval.config import RetrievalEvalConfig
from evals.retrieval.corpus import RANK_DEPTH, full_corpus, system_scores
from evals.retrieval.embedding_cache import cached_vectors, weights_fingerprint
from evals.retrieval.protocol import FULL_MAX_LENGTH, _retriever
from retrieval.training.fusion import FUSION_WEIGHTS, sparse_matrix


def unit_sparse(vectors: HybridVectors, weight: float, vocab_size: int) -> torch.Tensor:
    """``(n, V)`` sparse tensor of the unit-length sparse parts (the stored ones are scaled by ``sqrt(weight)``)."""
    unit = vectors.values / np.float32(math.sqrt(weight) if weight > 0 else 1.0)
    return sparse_matrix(HybridVectors(vectors.dense, vectors.ids, unit), vocab_size)


def sweep(path: str, documents: list[dict], sets: dict[str, list[dict]], cache: Path) -> dict:
    resolved = resolve_model(path)
    encode, _, identity, _, _ = _retriever(resolved, FULL_MAX_LENGTH)
    if identity["kind"] != "hybrid":
        raise ValueError(f"{path} is not a hybrid encoder folder; the sweep needs a sparse part")
    identity["weights"] = weights_fingerprint(resolved)
    saved = identity["config"]["sparse_weight"]
    if saved == 0:
        raise ValueError(f"{path} was saved with fusion weight 0, so its index holds no sparse part to sweep")
    docs, _ = cached_vectors(lambda items: encode(items, True), [d["text"] for d in documents], identity, cache)
    vocab = AutoConfig.from_pretrained(resolved).vocab_size
    doc_sparse = unit_sparse(docs, saved, vocab)
    table = {"saved weight": saved}
    for name, queries in sets.items():
        found = encode([q["question"] for q in queries])
        dense = found.dense @ docs.dense.T
        query_sparse = unit_sparse(found, saved, vocab)
        sparse = torch.sparse.mm(doc_sparse, query_sparse.to_dense().T).T.numpy()
        for weight in sorted({*FUSION_WEIGHTS, saved}):
            scores = dense + weight * sparse
            top = np.argsort(-scores, axis=1)[:, :RANK_DEPTH]
            mrr = float(np.mean(system_scores(top, documents, queries)["mrr@10"]))
            table.setdefault(name, {})[f"{weight:g}"] = mrr
        print(f"{path} {name}: " + ", ".join(f"w={w}: {m:.4f}" for w, m in table[name].items()))
    return table


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("encoders", nargs="+", help="hybrid encoder folders (finetune-encoder --encoder hybrid)")
    parser.add_argument("--work-dir", default=RetrievalEvalConfig.work_dir, help="eval-retrieval's cache folder")
    parser.add_argument("--output", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    documents, sets = full_corpus(RetrievalEvalConfig.full_heldout_queries)
    figures = {path: sweep(path, documents, sets, Path(args.work_dir) / "embeddings") for path in args.encoders}
    if args.output:
        args.output.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    return figures


if __name__ == "__main__":
    main()
