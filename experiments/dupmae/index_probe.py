"""Figures behind the hybrid index's design in `results/retrieval/dupmae/README.md`, each printed by this script.

1. Postings walked per query on the synthetic benchmark (10k documents, CLS:384/OT:260): every list of the
   query's ids (the old CSC index) against the pruned lists (each document's 32 heaviest entries, walked
   for the query's 16 heaviest ids).
2. FAISS's own flat inner-product search at 384 and 768 dimensions, alternated (best of 3, 5 rounds).
3. How flat the real sparse vectors are: the share of a document's squared weight held by its heaviest
   16/32/64/128 of 384 entries, for the seed-0 DupMAE+FT model of the report over its 800 documents
   (trained into `.cache/eval-retrieval-30` by the eval-retrieval command of `results/retrieval/dupmae/README.md`).

Its output is `results/retrieval/dupmae/index_probe.log`.

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=2 python experiments/dupmae/index_probe.py > results/retrieval/dupmae/index_probe.log
"""
import argparse
from pathlib import Path

import faiss
import numpy as np

from dynvocab.hardware.precision import encode_autocast
from encoders.hybrid import HybridEncoder
from evals.retrieval.config import RetrievalEvalConfig
from evals.retrieval.footprint import synthetic_vectors, time_search
from evals.retrieval.quick_protocol import query_sets
from retrieval.index.sparse import SparseIndex

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / ".cache/eval-retrieval-30/dupmae-ft-wikipedia-seed0/final"


def postings() -> None:
    docs, queries = synthetic_vectors(10_000, 0, 260, seed=0), synthetic_vectors(200, 0, 260, seed=1)
    full = np.bincount(docs.ids.ravel(), minlength=30522)
    pruned = SparseIndex(docs.ids, docs.values, 30522)
    lengths = np.diff(pruned.offsets)
    heaviest = np.argsort(-queries.values, axis=1)[:, :16]
    print(f"postings per query: every list {full[queries.ids].sum(1).mean():.0f}, "
          f"pruned {lengths[np.take_along_axis(queries.ids, heaviest, 1)].sum(1).mean():.0f}")


def flat_search() -> None:
    rng = np.random.default_rng(0)
    flat = {}
    for dim in (384, 768):
        index = faiss.IndexFlatIP(dim)
        index.add(rng.standard_normal((10_000, dim)).astype(np.float32))
        flat[dim] = (index, rng.standard_normal((200, dim)).astype(np.float32))
    times = {dim: [] for dim in flat}
    for _ in range(5):
        for dim, (index, q) in flat.items():
            times[dim].append(time_search(index.search, q))
    print("FAISS flat ms/query, median of 5:", {dim: round(float(np.median(t)), 3) for dim, t in times.items()})


def sparse_flatness(model: Path = MODEL) -> None:
    documents, _ = query_sets(RetrievalEvalConfig(documents=800, heldout_queries=150))
    encoder = HybridEncoder.from_pretrained(str(model), max_length=128)
    with encode_autocast(encoder.device):  # bf16 only where the CPU computes it natively
        values = encoder.encode([d["text"] for d in documents]).values
    mass = np.cumsum(np.sort(values, 1)[:, ::-1] ** 2, 1)
    print("squared weight in the heaviest 16/32/64/128 of 384 entries:",
          [round(float(mass[:, m - 1].mean()), 3) for m in (16, 32, 64, 128)])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=MODEL, help="the seed-0 DupMAE+FT model (HybridEncoder folder)")
    args = parser.parse_args(argv)
    postings()
    flat_search()
    sparse_flatness(args.model)


if __name__ == "__main__":
    main()
