"""Routing experiments for the shortlist head: which candidate sets find the exact top phrases of SmolLM2 hidden states.

First-token candidate sets (phrases starting with one of the LM's top-k tokens), k-means over the whole table
(the earlier default), and clusters of sampled hidden states (NTRAIN positions of indexed leads) whose subsets hold
their members' exact top-32 phrases. Scored on the 1,451 teacher-forced positions of 16 held-out leads: argmax
agreement with exact scoring, recall of the exact top-10 phrases and candidates per position.

Writes `results/shortlist/exploration/route_SIZE_NTRAIN.json` (not with --first-only, which only prints); the
reading of its output is `results/shortlist/exploration/README.md`. Needs the phrase vectors written by
`python examples/benchmark_shortlist.py --vectors-cache ...` (default `.cache/shortlist/vectors-1e6.safetensors`).

    python experiments/shortlist/exploration/route_exp.py SIZE NTRAIN [--first-only]
    e.g. python experiments/shortlist/exploration/route_exp.py 100000 20000
"""
import argparse
import json
import time
from pathlib import Path

import faiss
import numpy as np
import torch
from safetensors.torch import load_file

from dynvocab.data.assets import wikipedia_leads
from dynvocab.data.corpora import corpus_split
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
from dynvocab.scoring.shortlist_head import ShortlistConfig, ShortlistHead
from retrieval import extract_phrases

ROOT = Path(__file__).resolve().parents[3]
OUTPUT_DIR = ROOT / "results/shortlist/exploration"
VECTORS = ROOT / ".cache/shortlist/vectors-1e6.safetensors"


def run(SIZE: int, NTRAIN: int, first_only: bool = False, vectors_path: Path = VECTORS,
        output_dir: Path = OUTPUT_DIR) -> dict:
    """Every routing variant at a pool of SIZE phrases; the results by variant (also written as JSON unless first_only)."""
    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    tok = model.tokenizer
    pool = extract_phrases(wikipedia_leads(), tok, max_phrases=1_000_000)[:SIZE]
    vectors = load_file(str(vectors_path))["output"][:SIZE].float()
    first = torch.tensor([ids[0] for ids in tok([p.text for p in pool], add_special_tokens=False)["input_ids"]])
    train_docs, held = corpus_split("wikipedia")

    @torch.no_grad()
    def states(texts, max_tokens=128):
        H, L = [], []
        for t in texts:
            ids = tok(t, return_tensors="pt").input_ids[:, :max_tokens]
            out = model.lm(ids, output_hidden_states=True)
            H.append(out.hidden_states[-1][0]); L.append(out.logits[0])
        return torch.cat(H), torch.cat(L)

    t0 = time.time()
    Htest, Ltest = states([d["text"] for d in held[:16]])
    rng = np.random.default_rng(0)
    pick = rng.choice(len(train_docs), NTRAIN // 100, replace=False)
    Htrain, Ltrain = states([train_docs[i]["text"] for i in pick], 100)
    print("states", Htest.shape, Htrain.shape, time.time() - t0, flush=True)

    def topk_chunked(H, k, chunk=256):
        out = []
        for s in range(0, len(H), chunk):
            out.append((H[s:s+chunk] @ vectors.T).topk(k, dim=-1).indices)
        return torch.cat(out)

    t0 = time.time()
    full_test = Htest @ vectors.T
    best = torch.cat([Ltest, full_test], -1).argmax(-1)
    top10 = full_test.topk(10, -1).indices
    phrase_wins = (best >= Ltest.shape[1]).float().mean().item()
    print(f"test positions {len(Htest)}, exact argmax is a phrase on {phrase_wins:.3f}", flush=True)

    def evaluate(cands):  # cands: list of LongTensor per position, or bool mask (N,S)
        agree = rec = n = 0.0
        for i in range(len(Htest)):
            c = cands[i]
            mask = torch.zeros(SIZE, dtype=torch.bool); mask[c] = True
            s = full_test[i].masked_fill(~mask, float("-inf"))
            agree += float(torch.cat([Ltest[i], s]).argmax() == best[i])
            rec += mask[top10[i]].float().mean().item()
            n += mask.sum().item()
        N = len(Htest)
        return {"agree": round(agree / N, 4), "recall10": round(rec / N, 4), "cands": round(n / N)}

    results = {}
    # C: first-token groups
    order = torch.argsort(first, stable=True)
    counts = torch.bincount(first, minlength=Ltest.shape[1])
    starts = torch.cumsum(counts, 0) - counts
    for k in (1, 2, 4, 8, 16, 32, 64):
        toks = Ltest.topk(k, -1).indices
        cands = [torch.cat([order[starts[t]:starts[t] + counts[t]] for t in row.tolist()]) for row in toks]
        results[f"first_token_top{k}"] = evaluate(cands); print(f"first_token_top{k}", results[f"first_token_top{k}"], flush=True)
    print("largest first-token groups", counts.topk(5).values.tolist(), flush=True)
    # where does the exact top-1 phrase's first token rank among the LM's logits?
    rank = (Ltest > Ltest.gather(1, first[top10[:, 0]][:, None])).sum(-1)
    print("rank of top phrase's first token: quantiles", [int(rank.float().quantile(q)) for q in (0.5, 0.9, 0.95, 0.99)], flush=True)

    if first_only:
        return results
    # A: the shipped training-free fit
    t0 = time.time()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig())
    print("from_vectors fit", time.time() - t0, head.num_clusters, head.subsets.shape, flush=True)
    for k in (8, 32):
        head.config.probe = k
        ids = head.candidates(Htest)
        results[f"vectors_k{k}"] = evaluate([r[r < SIZE] for r in ids]); print(f"vectors_k{k}", results[f"vectors_k{k}"], flush=True)

    # B: clusters of the queries
    t0 = time.time()
    T = 32
    train_top = topk_chunked(Htrain, T)
    print("train exact top", time.time() - t0, flush=True)
    for m in (256, 1024):
        km = faiss.Kmeans(Htrain.shape[1], m, niter=20, seed=0, max_points_per_centroid=256)
        km.train(Htrain.numpy())
        C = torch.from_numpy(km.centroids.copy())
        assign = torch.from_numpy(km.index.search(Htrain.numpy(), 1)[1][:, 0].astype(np.int64))
        for r in (256, 1024):
            topc = (C @ vectors.T).topk(r, -1).indices
            subsets = [set(topc[j].tolist()) for j in range(m)]
            for q, j in enumerate(assign.tolist()):
                subsets[j].update(train_top[q].tolist())
            subsets = [torch.tensor(sorted(s)) for s in subsets]
            width = sum(len(s) for s in subsets) / m
            for route in ("l2", "ip"):
                if route == "l2":
                    score = Htest @ C.T - 0.5 * (C * C).sum(-1)
                else:
                    score = Htest @ C.T
                for k in (2, 4, 8):
                    near = score.topk(k, -1).indices
                    cands = [torch.unique(torch.cat([subsets[j] for j in row.tolist()])) for row in near]
                    key = f"queries_m{m}_r{r}_{route}_k{k}"
                    results[key] = evaluate(cands) | {"width": round(width)}
                    print(key, results[key], flush=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / f"route_{SIZE}_{NTRAIN}.json", "w") as f:
        json.dump(results, f, indent=1)
    return results


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("size", type=int, metavar="SIZE", help="phrases in the pool (the first SIZE of the leads' n-grams)")
    parser.add_argument("ntrain", type=int, metavar="NTRAIN",
                        help="sampled hidden states to cluster (about NTRAIN // 100 training leads, 100 tokens each)")
    parser.add_argument("--first-only", action="store_true",
                        help="only the first-token candidate sets; prints, writes no JSON")
    parser.add_argument("--vectors", type=Path, default=VECTORS, help="phrase vectors (safetensors, key 'output')")
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR, help="where route_SIZE_NTRAIN.json goes")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the recorded runs used 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return run(args.size, args.ntrain, args.first_only, args.vectors, args.output_dir)


if __name__ == "__main__":
    main()
