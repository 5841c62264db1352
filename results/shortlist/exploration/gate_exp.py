"""Clusters inside first-token groups (k-means, ~SUB phrases per cluster), probed by inner product, optionally
behind a first-token gate (the LM's top-K tokens): argmax agreement, recall@10 and candidates on the benchmark's
1,451 held-out positions.

    python results/shortlist/exploration/gate_exp.py SIZE SUB PROBES [--gate]
    e.g. python results/shortlist/exploration/gate_exp.py 1000000 64 64,96,128,192
"""
import sys, time, json, torch, numpy as np, faiss
from safetensors.torch import load_file
from dynvocab.assets import wikipedia_leads
from dynvocab.corpora import corpus_split
from dynvocab.loading import SHIPPED_ENCODER, load_dynamic_lm
from retrieval import extract_phrases
torch.set_num_threads(2)
SIZE = int(sys.argv[1]); SUB = int(sys.argv[2]); PROBES = [int(n) for n in sys.argv[3].split(',')]
model = load_dynamic_lm("smollm2", SHIPPED_ENCODER)
tok = model.tokenizer
pool = extract_phrases(wikipedia_leads(), tok, max_phrases=1_000_000)[:SIZE]
vectors = load_file(".cache/shortlist/vectors-1e6.safetensors")["output"][:SIZE]
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
members_of = lambda j: corder[cstarts[j]:cstarts[j] + ccounts[j]]
cs = Htest @ C.T  # (N, clusters)
res = {}
for K in ((4, 8, 16, 32) if '--gate' in sys.argv else ()):
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
json.dump(res, open(f"results/shortlist/exploration/gate_{SIZE}_{SUB}.json", "w"), indent=1)
print("cluster sizes: max", int(ccounts.max()), "quantiles", [int(ccounts.float().quantile(q)) for q in (0.5, 0.9, 0.99, 0.999)], "padded MB (int32)", len(C) * int(ccounts.max()) * 4 / 1e6, flush=True)
