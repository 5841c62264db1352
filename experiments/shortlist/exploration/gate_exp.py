"""Clusters inside first-token groups (k-means, ~SUB phrases per cluster), probed by inner product, optionally
behind a first-token gate (the LM's top-K tokens): argmax agreement, recall@10 and candidates on the benchmark's
1,451 held-out positions (16 held-out leads, SmolLM2-135M, the shipped phrase encoder).

Writes `results/shortlist/exploration/gate_SIZE_SUB.json` and prints the cluster sizes; the reading of its output
is `results/shortlist/exploration/README.md`. Needs the phrase vectors written by
`python examples/benchmark_shortlist.py --vectors-cache ...` (default `.cache/shortlist/vectors-1e6.safetensors`).

    python experiments/shortlist/exploration/gate_exp.py SIZE SUB PROBES [--gate]
    e.g. python experiments/shortlist/exploration/gate_exp.py 1000000 64 64,96,128,192
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
from retrieval import extract_phrases

ROOT = Path(__file__).resolve().parents[3]
OUTPUT_DIR = ROOT / "results/shortlist/exploration"
VECTORS = ROOT / ".cache/shortlist/vectors-1e6.safetensors"


def run(SIZE: int, SUB: int, PROBES: list[int], gate_too: bool = False, vectors_path: Path = VECTORS,
        output_dir: Path = OUTPUT_DIR) -> dict:
    """Sub-clusters of ~SUB phrases in each first-token group of a SIZE-phrase pool, probed PROBES clusters deep."""
    model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
    tok = model.tokenizer
    pool = extract_phrases(wikipedia_leads(), tok, max_phrases=1_000_000)[:SIZE]
    vectors = load_file(str(vectors_path))["output"][:SIZE]
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

    Htest, Ltest = states([d["text"] for d in held[:16]])
    full_test = torch.cat([(Htest[i:i+128] @ vectors.float().T) for i in range(0, len(Htest), 128)])
    best = torch.cat([Ltest, full_test], -1).argmax(-1)
    top10 = full_test.topk(10, -1).indices

    def evaluate(cands):
        agree = rec = n = 0.0
        for i in range(len(Htest)):
            mask = torch.zeros(SIZE, dtype=torch.bool); mask[cands[i]] = True
            s = full_test[i].masked_fill(~mask, float("-inf"))
            agree += float(torch.cat([Ltest[i], s]).argmax() == best[i])
            rec += mask[top10[i]].float().mean().item(); n += mask.sum().item()
        N = len(Htest)
        return {"agree": round(agree / N, 4), "recall10": round(rec / N, 4), "cands": round(n / N)}

    # sub-clusters within first-token groups
    t0 = time.time()
    order = torch.argsort(first, stable=True)
    counts = torch.bincount(first, minlength=Ltest.shape[1]); starts = torch.cumsum(counts, 0) - counts
    cluster_of = torch.empty(SIZE, dtype=torch.long); cent, gate = [], []; offset = 0
    data = vectors.float().numpy()
    for t in torch.nonzero(counts).flatten().tolist():
        members = order[starts[t]:starts[t] + counts[t]]
        m = max(1, int(counts[t]) // SUB)
        if m == 1:
            c = data[members.numpy()].mean(0, keepdims=True); lab = np.zeros(len(members), dtype=np.int64)
        else:
            km = faiss.Kmeans(576, m, niter=8, seed=0, max_points_per_centroid=64); x = data[members.numpy()]
            km.train(x); c = km.centroids; lab = km.index.search(x, 1)[1][:, 0]
        cluster_of[members] = torch.from_numpy(lab.astype(np.int64)) + offset; offset += len(c)
        cent.append(torch.from_numpy(np.ascontiguousarray(c))); gate += [t] * len(c)
    C = torch.cat(cent); gate = torch.tensor(gate)
    print("subclusters", C.shape, "fit", time.time() - t0, flush=True)
    corder = torch.argsort(cluster_of, stable=True); ccounts = torch.bincount(cluster_of, minlength=len(C)); cstarts = torch.cumsum(ccounts, 0) - ccounts

    def members_of(j):
        return corder[cstarts[j]:cstarts[j] + ccounts[j]]

    cs = Htest @ C.T  # (N, clusters)
    res = {}
    for K in ((4, 8, 16, 32) if gate_too else ()):
        toks = Ltest.topk(K, -1).indices
        gated = (gate[None, :] == toks[:, :, None]).any(1)  # (N, clusters)
        for N in PROBES:
            sel = cs.masked_fill(~gated, float("-inf")).topk(N, -1)
            cands = [torch.cat([torch.empty(0, dtype=torch.long)] + [members_of(j) for j, v in zip(row.tolist(), vals.tolist()) if v > float("-inf")]) for row, vals in zip(sel.indices, sel.values)]
            key = f"gate{K}_sub{SUB}_top{N}"; res[key] = evaluate(cands); print(key, res[key], flush=True)
    for N in PROBES:
        sel = cs.topk(N, -1).indices
        cands = [torch.cat([members_of(j) for j in row.tolist()]) for row in sel]
        key = f"nogate_sub{SUB}_top{N}"; res[key] = evaluate(cands); print(key, res[key], flush=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / f"gate_{SIZE}_{SUB}.json", "w") as f:
        json.dump(res, f, indent=1)
    print("cluster sizes: max", int(ccounts.max()), "quantiles", [int(ccounts.float().quantile(q)) for q in (0.5, 0.9, 0.99, 0.999)], "padded MB (int32)", len(C) * int(ccounts.max()) * 4 / 1e6, flush=True)
    return res


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("size", type=int, metavar="SIZE", help="phrases in the pool (the first SIZE of the leads' n-grams)")
    parser.add_argument("sub", type=int, metavar="SUB", help="about this many phrases per cluster in each first-token group")
    parser.add_argument("probes", type=lambda s: [int(n) for n in s.split(",")], metavar="PROBES",
                        help="clusters probed, comma-separated, e.g. 64,96,128,192")
    parser.add_argument("--gate", action="store_true",
                        help="also the gated variants: only clusters of the LM's top-K first tokens, K in 4, 8, 16, 32")
    parser.add_argument("--vectors", type=Path, default=VECTORS, help="phrase vectors (safetensors, key 'output')")
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR, help="where gate_SIZE_SUB.json goes")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the recorded runs used 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    return run(args.size, args.sub, args.probes, args.gate, args.vectors, args.output_dir)


if __name__ == "__main__":
    main()
