import time, torch
import sys; torch.set_num_threads(int(sys.argv[1]))
from dynvocab.shortlist import ShortlistConfig, ShortlistHead
from dynvocab.scoring import DotProductScorer
g = torch.Generator().manual_seed(0)
P, d = 100000, 576
vec = torch.randn(P, d, generator=g).to(torch.bfloat16)
t = time.time(); head = ShortlistHead.from_vectors(vec.float(), ShortlistConfig(probe=8)); print("fit", time.time()-t, "S", head.subsets.shape)
h = torch.randn(1, 1, d)
exact = DotProductScorer()
for name, fn in (("exact", lambda: exact(h, vec)), ("shortlist", lambda: head.dense_scores(h[:, 0], vec)), ("candidates", lambda: head.candidates(h[:, 0]))):
    fn()
    t = time.perf_counter()
    for _ in range(30): fn()
    print(name, (time.perf_counter() - t) / 30 * 1e3, "ms")
q = h[:, 0]
ids = head.candidates(q)
def timeit(name, fn):
    fn(); t = time.perf_counter()
    for _ in range(30): fn()
    print(name, (time.perf_counter() - t) / 30 * 1e3, "ms")
timeit("gather", lambda: vec[ids.clamp(max=P - 1)])
rows = vec[ids.clamp(max=P - 1)]
timeit("bmm bf16", lambda: torch.bmm(q[:, None].to(rows.dtype), rows.transpose(1, 2)))
timeit("bmm fp32", lambda: torch.bmm(q[:, None], rows.float().transpose(1, 2)))
timeit("full fill+scatter", lambda: torch.full((1, 1, P + 1), float("-inf")).scatter_(-1, ids[:, None, :], torch.zeros(1, 1, ids.shape[1])))
timeit("topk clusters", lambda: (q.float() @ head.centroids.T).topk(8, dim=-1))
timeit("sort", lambda: head.subsets[(q.float() @ head.centroids.T).topk(8, dim=-1).indices].flatten(1).sort(dim=-1))
