"""One shortlist head for huge output vocabularies (phrase tables of 1e5-1e7, NAR retrieval vocabularies).

Data: ``m`` cluster vectors ``c_1..c_m`` and, for each, a subset of vocabulary ids. For a
query vector ``x0`` the ``k`` clusters of largest ``x0 · c_j`` are probed, the union of their
subsets (per query, never per batch) is the candidate set, and only candidates get exact
scores; everything else is ``-inf``. Two ways to fit the same structure:

* ``ShortlistHead.from_vectors``, training-free: faiss k-means over the output vectors
  themselves; a cluster's subset is its members plus the ``r`` vectors of largest inner
  product with its centroid. With ``groups`` (a key per vector, e.g. a phrase's first token)
  k-means runs inside each group, so no cluster mixes groups. ``add`` and ``keep`` follow a
  table that changes at run time without a new k-means.
* ``ShortlistHead.learned``, PIXAR's second stage: each training query is hard-assigned to
  its cluster of largest ``x0 · c_j``, whose softmax over the vocabulary (``c_j · w_v``) is
  trained by cross-entropy against the query's target ids; a subset is its cluster's top-``r``.

Everything is batched tensor code (no loop over queries) and runs on the device of its buffers.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import faiss
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from tqdm.auto import tqdm

from ..config import JsonConfig
from ..io.tensor_files import read_tensor_folder, write_tensor_folder

__all__ = ["ShortlistConfig", "ShortlistHead", "chunked_logsumexp"]

logger = logging.getLogger(__name__)

FORMAT = "dynvocab.ShortlistHead"
WEIGHTS = "shortlist.safetensors"
#: new vectors compared with every centroid at once in ``add`` (bounds the (chunk, m) distances)
ADD_CHUNK = 4096
#: float16's largest value: queries are clamped to it before probing the float16 centroids
HALF_MAX = torch.finfo(torch.float16).max
#: ShortlistConfig.routing's choices
ROUTINGS = ("auto", "int8", "float16")
#: the threshold of a cluster no added vector joins unless it is the nearest (finite, so the head can be saved)
NEVER_JOINED = torch.finfo(torch.float32).max


@dataclass
class ShortlistConfig(JsonConfig):
    """Sizes of the shortlist: ``m`` clusters, subsets of ``r`` ids, ``k`` clusters probed per query."""

    num_clusters: int = field(default=0, metadata={"help": "Clusters m of a fit without groups; 0 picks 4 * sqrt(|V|)."})
    cluster_size: int = field(default=64, metadata={"help": "A fit with groups: k-means splits a group of n vectors into "
                                                            "max(1, n // cluster_size) clusters."})
    subset_size: int = field(default=256, metadata={"help": "r: ids of largest c_j . e added to each cluster's subset "
                                                           "besides its members (0: members only)."})
    probe: int = field(default=8, metadata={"help": "k: clusters probed per query; the candidates are their subsets' union."})
    routing: str = field(default="auto", metadata={
        "help": "How a query is compared with every centroid: 'int8' (centroids quantized per row, torch's dynamic "
                "int8 matmul; CPU only), 'float16', or 'auto' (int8 where it runs, else float16)."})
    exact_below: int = field(default=16384, metadata={"help": "ShortlistScorer scores tables smaller than this exactly."})
    kmeans_iterations: int = field(default=10, metadata={"help": "faiss k-means iterations of the training-free fit."})
    max_points_per_centroid: int = field(default=64, metadata={"help": "k-means trains on at most this many vectors per cluster."})
    seed: int = field(default=0, metadata={"help": "Seed of k-means and of the learned fit's batches."})

    config_name: ClassVar[str] = "shortlist_config.json"

    def __post_init__(self) -> None:
        for name in ("cluster_size", "probe", "kmeans_iterations", "max_points_per_centroid"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ShortlistConfig.{name}={value!r} must be an integer >= 1; pass e.g. {name}=8")
        if self.routing not in ROUTINGS:
            raise ValueError(f"ShortlistConfig.routing={self.routing!r}; choose one of {ROUTINGS}")
        for name in ("num_clusters", "subset_size", "exact_below"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ShortlistConfig.{name}={value!r} must be an integer >= 0 (see its help for what 0 means)")

    def clusters_for(self, vocab_size: int) -> int:
        """The number of clusters to fit for a vocabulary of ``vocab_size`` (never more than the vocabulary)."""
        wanted = self.num_clusters or max(1, round(4 * math.sqrt(vocab_size)))
        return min(wanted, vocab_size)


def chunked_logsumexp(queries: torch.Tensor, weight: torch.Tensor, chunk: int = 65536) -> torch.Tensor:
    """``log Σ_v exp(q · w_v)`` for ``(N, d)`` queries over ``(V, d)`` rows -> ``(N,)`` float32.

    Never holds more than ``N x chunk`` scores; under autograd each chunk is recomputed in
    the backward pass (activation checkpointing), so a vocabulary of millions fits.
    """
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1; pass e.g. chunk=65536")
    grad = torch.is_grad_enabled() and (queries.requires_grad or weight.requires_grad)
    parts = []
    for start in range(0, weight.shape[0], chunk):
        rows = weight[start : start + chunk]
        parts.append(checkpoint(_logsumexp, queries, rows, use_reentrant=False) if grad else _logsumexp(queries, rows))
    return torch.logsumexp(torch.stack(parts, dim=-1), dim=-1)


def _logsumexp(queries: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp((queries.to(rows.dtype) @ rows.T).float(), dim=-1)


class ShortlistHead(nn.Module):
    """Cluster vectors ``(m, d)`` and padded int32 subsets ``(m, S)`` of vocabulary ids (``vocab_size`` pads);
    ``cluster_groups`` ``(m,)`` is each cluster's group when the fit had groups (else empty)."""

    def __init__(self, centroids: torch.Tensor, subsets: torch.Tensor, thresholds: torch.Tensor,
                 vocab_size: int, config: ShortlistConfig, cluster_groups: torch.Tensor | None = None) -> None:
        super().__init__()
        if centroids.dim() != 2 or subsets.dim() != 2 or centroids.shape[0] != subsets.shape[0]:
            raise ValueError(
                f"centroids {tuple(centroids.shape)} and subsets {tuple(subsets.shape)} must be (m, d) and (m, S) "
                "with the same m; build a head with ShortlistHead.from_vectors or ShortlistHead.learned"
            )
        cluster_groups = torch.empty(0, dtype=torch.long) if cluster_groups is None else cluster_groups
        if cluster_groups.numel() not in (0, centroids.shape[0]):
            raise ValueError(f"cluster_groups has {cluster_groups.numel()} entries for {centroids.shape[0]} clusters; "
                             "give one group per cluster, or none")
        self.register_buffer("centroids", centroids.float().contiguous())
        self.register_buffer("subsets", subsets.int().contiguous())  # int32: half the bytes of a million-id table
        self.register_buffer("thresholds", thresholds.float().contiguous())
        self.register_buffer("cluster_groups", cluster_groups.long().contiguous())
        self._router: tuple[tuple, object] | None = None  # (centroids' device, storage, rows, version; the probe's copy)
        self._runs_of: torch.Tensor | None = None  # the subsets that _runs was made from
        #: ids on every query's shortlist (a docid's end id, which no cluster may hold)
        self.register_buffer("always", torch.empty(0, dtype=torch.long), persistent=False)
        self.vocab_size = int(vocab_size)
        self.config = config

    @property
    def num_clusters(self) -> int:
        return self.centroids.shape[0]

    def route(self, queries: torch.Tensor) -> torch.Tensor:
        """``(N, d)`` queries -> ``(N, m)`` their inner products with every centroid, as the probe compares them.

        A query reads all ``m`` centroids each step, so their bytes set the time: on 2 CPU threads 28k centroids
        of d = 576 take 1.2 ms in float16, 2.8 in bfloat16 and 6.8 in float32; quantized to int8
        (``torch.ops.quantized.linear_dynamic``, which quantizes the query too) 0.6 ms of a decoding step against
        float16's 1.4 (``results/shortlist/int8/``). The int8 or float16 copy is
        made on first use and again when the centroids change.
        """
        key = (self.centroids.device, self.centroids.data_ptr(), self.centroids.shape[0], self.centroids._version)
        if self._router is None or self._router[0] != key:
            self._router = key, _router(self.centroids, self.config.routing)
        router = self._router[1]
        if isinstance(router, torch.Tensor):
            return F.linear(queries.clamp(-HALF_MAX, HALF_MAX).to(router.dtype), router)
        # The op quantizes its whole input with one range, so a query's probes would depend on the batch beside it.
        # Each query is scaled into [-1, 1] (its ranking of the centroids does not change) and given two columns
        # holding -1 and 1, which meet zero weights: every row, alone or in any batch, is quantized over [-1, 1].
        size = queries.float().abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)
        ends = torch.tensor([[-1.0, 1.0]], device=queries.device).expand(len(queries), 2)
        rows = torch.cat([queries / size, ends], dim=1)
        return torch.ops.quantized.linear_dynamic(rows, router, _reduce_range()) * size

    def __getstate__(self) -> dict:
        """Pickling and ``deepcopy`` leave out the probe's copy of the centroids (remade on first use)."""
        return {**super().__getstate__(), "_router": None}

    @property
    def grouped(self) -> bool:
        """Whether clusters were fitted inside groups (then ``add`` needs the new vectors' groups)."""
        return self.cluster_groups.numel() > 0

    # ------------------------------------------------------------------ fitting
    @classmethod
    def from_vectors(cls, vectors: torch.Tensor, config: ShortlistConfig | None = None,
                     groups: torch.Tensor | None = None) -> "ShortlistHead":
        """Training-free fit on ``(V, d)`` output vectors: k-means clusters, subsets = members + top-``r``.

        ``groups`` ``(V,)`` integer keys: k-means runs inside each group (``config.cluster_size``
        vectors per cluster), so a query probes groups as well as directions. ``ShortlistScorer``
        groups phrases by first token: a hidden state's best phrases mostly start with its best
        tokens, which clusters of the whole table do not see.
        """
        config = config or ShortlistConfig()
        _check_matrix("vectors", vectors)
        data = _numpy(vectors)
        if groups is not None:
            keys = _checked_groups(groups, data.shape[0]).numpy()
            centroids, members, cluster_groups = _kmeans_within_groups(data, keys, config)
            head = cls._with_top(centroids, data, members, torch.arange(data.shape[0]), config, cluster_groups)
            return head.to(vectors.device)
        m = config.clusters_for(data.shape[0])
        kmeans = faiss.Kmeans(data.shape[1], m, niter=config.kmeans_iterations, seed=config.seed,
                              max_points_per_centroid=config.max_points_per_centroid, spherical=False)
        kmeans.train(data)
        centroids = torch.from_numpy(kmeans.centroids.copy())
        members = torch.from_numpy(kmeans.index.search(data, 1)[1][:, 0].astype(np.int64))
        head = cls._with_top(centroids, data, members, torch.arange(data.shape[0]), config)
        return head.to(vectors.device)

    @classmethod
    def learned(cls, queries: torch.Tensor, targets: torch.Tensor, vocab_vectors: torch.Tensor,
                config: ShortlistConfig | None = None, steps: int = 200, learning_rate: float = 1e-2,
                batch_size: int = 256, chunk: int = 65536) -> "ShortlistHead":
        """PIXAR's second stage on ``(N, d)`` queries, ``(N, L)`` target ids (``-1`` pads) and ``(V, d)`` output vectors.

        Centroids start from k-means of the queries; each step hard-assigns a batch of queries
        to their nearest centroid and lowers the cross-entropy of that centroid's softmax over
        the vocabulary against the queries' targets. Subsets are each cluster's top-``r`` ids.
        """
        config = config or ShortlistConfig()
        if config.subset_size < 1:
            raise ValueError("a learned head's subsets are each cluster's top-r ids; set subset_size >= 1")
        _check_matrix("queries", queries)
        _check_matrix("vocab_vectors", vocab_vectors, queries.shape[1])
        if targets.dim() != 2 or targets.shape[0] != queries.shape[0] or targets.dtype != torch.long:
            raise ValueError(f"targets {tuple(targets.shape)} {targets.dtype} must be a (N, L) long tensor with one row "
                             f"per query ({queries.shape[0]}); pad short rows with -1")
        if int(targets.max()) >= vocab_vectors.shape[0] or not bool((targets >= 0).any(dim=1).all()):
            raise ValueError(f"targets must be ids below {vocab_vectors.shape[0]} with at least one per row (-1 pads); "
                             "drop queries without targets")
        m = min(config.clusters_for(vocab_vectors.shape[0]), queries.shape[0])
        kmeans = faiss.Kmeans(queries.shape[1], m, niter=config.kmeans_iterations, seed=config.seed,
                              max_points_per_centroid=config.max_points_per_centroid)
        kmeans.train(_numpy(queries))
        centroids = nn.Parameter(torch.from_numpy(kmeans.centroids.copy()).to(vocab_vectors.device))
        optimizer = torch.optim.Adam([centroids], lr=learning_rate)
        generator = torch.Generator().manual_seed(config.seed)
        weight = vocab_vectors.detach()
        for _ in tqdm(range(steps), desc="shortlist clusters", disable=steps < 50):
            rows = torch.randint(queries.shape[0], (min(batch_size, queries.shape[0]),), generator=generator)
            x, wanted = queries[rows].to(weight.device).float(), targets[rows].to(weight.device)
            with torch.no_grad():
                nearest = (x @ centroids.T).argmax(dim=-1)
            chosen = centroids[nearest]
            valid = wanted >= 0
            target_scores = (chosen[:, None, :].to(weight.dtype) * weight[wanted.clamp(min=0)]).sum(-1).float()
            loss = ((chunked_logsumexp(chosen, weight, chunk)[:, None] - target_scores) * valid).sum() / valid.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        final = centroids.detach().cpu()
        return cls._with_top(final, _numpy(vocab_vectors), None, None, config).to(vocab_vectors.device)

    @classmethod
    def _with_top(cls, centroids: torch.Tensor, data: np.ndarray, member_clusters: torch.Tensor | None,
                  member_ids: torch.Tensor | None, config: ShortlistConfig,
                  cluster_groups: torch.Tensor | None = None) -> "ShortlistHead":
        """Subsets = (members, if given) + each centroid's ``r`` ids of largest inner product."""
        r = min(config.subset_size, data.shape[0])
        m = centroids.shape[0]
        thresholds = torch.full((m,), NEVER_JOINED)  # with r = 0 no added vector joins another cluster
        groups, items = torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
        if r:
            index = faiss.IndexFlatIP(data.shape[1])
            index.add(data)
            scores, top = index.search(np.ascontiguousarray(centroids.numpy(), dtype=np.float32), r)
            groups = torch.arange(m).repeat_interleave(r)
            items = torch.from_numpy(top.astype(np.int64)).flatten()
            thresholds = torch.from_numpy(scores[:, -1].copy())
        if member_clusters is not None:
            groups, items = torch.cat([groups, member_clusters]), torch.cat([items, member_ids])
        subsets = _grouped(groups, items, m, data.shape[0])
        return cls(centroids, subsets, thresholds, data.shape[0], config, cluster_groups)

    # ------------------------------------------------------------------ a table that changes
    @torch.no_grad()
    def add(self, vectors: torch.Tensor, groups: torch.Tensor | None = None) -> None:
        """Give ids ``vocab_size ..`` to ``(n, d)`` new vectors: each joins its nearest cluster (L2, as k-means
        assigns; of its own group when the head has groups, ``(n,)`` keys, where a group the head has not
        seen becomes a new cluster) and every subset whose r-th best inner product it beats. No k-means is run."""
        _check_matrix("vectors", vectors, self.centroids.shape[1])
        if self.grouped != (groups is not None):
            raise ValueError("this head was fitted with groups: pass add(vectors, groups=...)" if self.grouped else
                             "this head was fitted without groups: call add(vectors) without groups")
        new = vectors.to(self.centroids.device).float()
        ids = torch.arange(self.vocab_size, self.vocab_size + new.shape[0], device=new.device)
        keys = None
        if groups is not None:
            keys = _checked_groups(groups, new.shape[0]).to(new.device)
            self._add_clusters_for(new, keys)
        clusters, items = [], []
        for start in range(0, len(new), ADD_CHUNK):
            rows = slice(start, start + ADD_CHUNK)
            cluster, extra = self._joined(new[rows], None if keys is None else keys[rows])
            clusters += [cluster, extra[1]]
            items += [ids[rows], ids[rows][extra[0]]]
        self._regroup(torch.cat(clusters), torch.cat(items), self.vocab_size + new.shape[0])

    def _joined(self, vectors: torch.Tensor, keys: torch.Tensor | None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """For ``(n, d)`` new vectors: the L2-nearest cluster of each ``(n,)`` (among its group's, with ``keys``),
        and the (vector, cluster) pairs whose inner product beats the cluster's r-th best."""
        products = vectors @ self.centroids.T  # (n, m)
        distances = (self.centroids**2).sum(-1) - 2 * products  # L2 distances up to |x|^2
        if keys is not None:
            distances = distances.masked_fill(keys[:, None] != self.cluster_groups, float("inf"))
        return distances.argmin(dim=-1), (products > self.thresholds).nonzero(as_tuple=True)

    def _add_clusters_for(self, vectors: torch.Tensor, keys: torch.Tensor) -> None:
        """A new cluster (the mean of its vectors) for every group in ``keys`` that has none yet."""
        unseen = ~torch.isin(keys, self.cluster_groups)
        if not bool(unseen.any()):
            return
        fresh, slot = torch.unique(keys[unseen], return_inverse=True)
        centroids = torch.zeros(len(fresh), vectors.shape[1], device=vectors.device).index_add_(0, slot, vectors[unseen])
        centroids /= torch.bincount(slot, minlength=len(fresh))[:, None]
        self.centroids = torch.cat([self.centroids, centroids])
        self.cluster_groups = torch.cat([self.cluster_groups, fresh])
        self.thresholds = torch.cat([self.thresholds, self.thresholds.new_full((len(fresh),), NEVER_JOINED)])
        self.subsets = torch.cat([self.subsets, self.subsets.new_full((len(fresh), self.subsets.shape[1]), self.vocab_size)])

    @torch.no_grad()
    def keep(self, indices: torch.Tensor | list[int]) -> None:
        """Keep only the ids ``indices`` (in this order: id ``indices[i]`` becomes ``i``), as ``PhraseTable.keep`` does."""
        index = torch.as_tensor(indices, dtype=torch.long, device=self.subsets.device)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.vocab_size):
            raise ValueError(f"indices must lie in [0, {self.vocab_size}); got {int(index.min())}..{int(index.max())}")
        remap = torch.full((self.vocab_size + 1,), index.numel(), dtype=torch.long, device=index.device)
        remap[index] = torch.arange(index.numel(), device=index.device)
        self.always = remap[self.always][remap[self.always] < index.numel()]
        self._regroup(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), index.numel(), remap)

    def _regroup(self, groups: torch.Tensor, items: torch.Tensor, vocab_size: int, remap: torch.Tensor | None = None) -> None:
        old = self.subsets if remap is None else remap[self.subsets]
        old_sentinel = self.vocab_size if remap is None else vocab_size
        present = old < old_sentinel
        rows = torch.arange(self.num_clusters, device=old.device)[:, None].expand_as(old)[present]
        all_groups = torch.cat([rows, groups.to(old.device)])
        all_items = torch.cat([old[present], items.to(old.device)])
        self.subsets = _grouped(all_groups, all_items, self.num_clusters, vocab_size).int()
        self.vocab_size = vocab_size

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def candidates(self, queries: torch.Tensor) -> torch.Tensor:
        """``(N, d)`` queries -> ``(N, C)`` ids: the union of the ``k`` nearest clusters' subsets, per query,
        sorted, each id once; ``vocab_size`` pads the rows to the widest union."""
        probe = min(self.config.probe, self.num_clusters)
        nearest = self.route(queries).topk(probe, dim=-1).indices  # (N, k)
        if self._disjoint():
            return self._gathered(nearest)
        ids = self.subsets[nearest].flatten(1)  # (N, k * S), mostly padding: subsets are padded to the widest
        ids = torch.cat([ids, self.always.to(ids.device).expand(ids.shape[0], -1)], dim=1).sort(dim=-1).values
        repeated = torch.zeros_like(ids, dtype=torch.bool)
        repeated[:, 1:] = ids[:, 1:] == ids[:, :-1]
        ids = ids.masked_fill(repeated, self.vocab_size).sort(dim=-1).values
        width = max(int((ids < self.vocab_size).sum(dim=-1).max()), 1) if ids.numel() else 1
        return ids[:, :width].long()

    def _gathered(self, nearest: torch.Tensor) -> torch.Tensor:
        """``(N, k)`` probed clusters -> ``(N, W)`` their members, each row's ids sorted and ``vocab_size`` after them,
        ``W`` the most any row has. The members are read from one flat array, cluster after cluster, so a step never
        touches the padding of the ``(m, S)`` table (at 1e5 phrases 23k padded slots for 4k ids). On the CPU this runs
        in numpy, whose calls cost microseconds where the dozen small torch ops it replaces cost tens each when the
        caches are cold (``results/shortlist/sparse/``); the ids are sorted, so their vectors are read in order."""
        members, starts, counts = self._runs()
        if nearest.device.type != "cpu":
            return _gathered_runs_torch(members, starts, counts, nearest, self.vocab_size)
        found = _gathered_runs(members.numpy(), starts.numpy(), counts.numpy(), nearest.numpy(), self.vocab_size)
        return torch.from_numpy(found)

    def _runs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(members, starts, counts)``: every cluster's ids end to end, and where each cluster's run starts and how
        long it is; made again whenever ``subsets`` is replaced (``add``, ``keep``, a move to another device)."""
        if self._runs_of is not self.subsets:
            real = self.subsets < self.vocab_size
            counts = real.sum(dim=1)
            self._runs_cache = (self.subsets[real].long(), torch.cumsum(counts, 0) - counts, counts)
            self._runs_of = self.subsets
        return self._runs_cache

    def _disjoint(self) -> bool:
        """Whether no id can sit in two subsets (members only, no ``always`` ids): the union needs no de-duplication."""
        return self.config.subset_size == 0 and not self.always.numel() and bool((self.thresholds == NEVER_JOINED).all())

    def score(self, queries: torch.Tensor, vectors: torch.Tensor, hidden: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact scores of each query's candidates: ``(N, d)`` queries (``x0``), ``(V, d)`` vectors and
        ``(N, T, d)`` position states (default: the queries) -> ids ``(N, C)`` and scores ``(N, T, C)``
        (``-inf`` at padding), in the states' dtype."""
        if vectors.shape[0] != self.vocab_size:
            raise ValueError(f"the head indexes {self.vocab_size} vectors but got {vectors.shape[0]}; refit it or "
                             "keep it in step with add/keep")
        ids = self.candidates(queries)
        states = queries[:, None, :] if hidden is None else hidden
        rows = vectors.index_select(0, ids.clamp(max=self.vocab_size - 1).flatten()).view(*ids.shape, -1)  # (N, C, d)
        scores = torch.bmm(states.to(rows.dtype), rows.transpose(1, 2)).to(states.dtype)
        return ids, scores.masked_fill((ids == self.vocab_size)[:, None, :], float("-inf"))

    def dense_scores(self, queries: torch.Tensor, vectors: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """``score`` written into a ``(N, T, V)`` tensor that is ``-inf`` off the shortlist."""
        ids, scores = self.score(queries, vectors, hidden)
        return scattered(ids[:, None, :].expand_as(scores), scores, self.vocab_size)

    # ------------------------------------------------------------------ saving
    def save(self, directory: str | Path) -> Path:
        """Write the head (safetensors, hashed) and its config into ``directory``, atomically."""
        tensors = {"centroids": self.centroids, "subsets": self.subsets, "thresholds": self.thresholds,
                   "cluster_groups": self.cluster_groups}
        metadata = {"vocab_size": self.vocab_size, "config": self.config.to_dict()}
        return write_tensor_folder(directory, FORMAT, {WEIGHTS: tensors}, metadata)

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> "ShortlistHead":
        """A head written by ``save``; hashes and shapes are checked."""
        manifest, files = read_tensor_folder(directory, FORMAT)
        tensors = files[WEIGHTS]
        head = cls(tensors["centroids"], tensors["subsets"], tensors["thresholds"], manifest["vocab_size"],
                   ShortlistConfig.from_dict(manifest["config"]), tensors.get("cluster_groups"))
        if int(head.subsets.max()) > head.vocab_size or int(head.subsets.min()) < 0:
            raise ValueError(f"{directory}: subsets hold ids outside [0, {head.vocab_size}]; save the head again")
        return head.to(device)


def scattered(ids: torch.Tensor, scores: torch.Tensor, size: int) -> torch.Tensor:
    """Candidates' ``scores`` at their ``ids`` (the same shape; ``size`` pads) in a ``(..., size)`` tensor that is
    ``-inf`` elsewhere."""
    return scores.new_full((*scores.shape[:-1], size + 1), float("-inf")).scatter_(-1, ids, scores)[..., :size]


def int8_routing_available() -> bool:
    """Whether this torch runs dynamic int8 matmuls on the CPU (x86 builds with FBGEMM or oneDNN, Arm with QNNPACK);
    torch marks its quantized tensors deprecated, so ``auto`` probes in float16 wherever they are gone."""
    ops = torch.ops.quantized
    return (torch.backends.quantized.engine != "none" and hasattr(torch, "quantize_per_channel")
            and hasattr(ops, "linear_prepack") and hasattr(ops, "linear_dynamic"))


def _reduce_range() -> bool:
    """Whether queries are quantized to 7 bits: FBGEMM on a CPU without VNNI (AVX2) sums pairs of 8-bit products
    into saturating 16-bit lanes, which clips a query near its range's ends (inner products off by a quarter of
    their largest); 7 bits cannot overflow, as torch's own dynamic ``Linear`` does on x86."""
    return torch.backends.quantized.engine in ("x86", "fbgemm")


def _router(centroids: torch.Tensor, routing: str):
    """How ``ShortlistHead.route`` compares queries with the ``(m, d)`` centroids: int8 weights packed for
    ``torch.ops.quantized.linear_dynamic`` (one scale per centroid), or the centroids in float16."""
    int8 = routing == "int8" or (routing == "auto" and centroids.device.type == "cpu" and int8_routing_available())
    if not int8:
        return centroids.half()
    if centroids.device.type != "cpu":
        raise ValueError("ShortlistConfig.routing='int8' runs on the CPU only; use routing='auto' or 'float16' on "
                         f"{centroids.device.type}")
    weight = torch.cat([centroids.float(), centroids.new_zeros(len(centroids), 2, dtype=torch.float32)], dim=1)
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny).double()
    with warnings.catch_warnings():  # torch marks its quantized tensors deprecated in favour of torchao; the ops stay
        warnings.simplefilter("ignore")
        zero_points = torch.zeros_like(scales, dtype=torch.long)
        quantized = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(quantized, None)


def _grouped(groups: torch.Tensor, items: torch.Tensor, num_groups: int, sentinel: int) -> torch.Tensor:
    """Distinct ``(group, item)`` pairs as a ``(num_groups, S)`` table of sorted items padded with ``sentinel``."""
    key = torch.unique(groups * (sentinel + 1) + items)
    group, item = key // (sentinel + 1), key % (sentinel + 1)
    counts = torch.bincount(group, minlength=num_groups)
    starts = torch.cumsum(counts, 0) - counts
    table = torch.full((num_groups, max(int(counts.max()) if counts.numel() else 0, 1)), sentinel,
                       dtype=torch.long, device=items.device)
    table[group, torch.arange(key.numel(), device=key.device) - starts[group]] = item
    return table


def _gathered_runs(members: np.ndarray, starts: np.ndarray, counts: np.ndarray, nearest: np.ndarray,
                   sentinel: int) -> np.ndarray:
    """``ShortlistHead._gathered`` in numpy: the runs ``members[starts[c] : starts[c] + counts[c]]`` of each row's
    ``(N, k)`` clusters ``c``, end to end and sorted, ``sentinel`` padding the rows to the longest."""
    lengths = counts[nearest]  # (N, k)
    flat = lengths.ravel()
    ends = np.cumsum(flat)
    total = int(ends[-1]) if len(ends) else 0
    ids = members[np.repeat(starts[nearest].ravel() - (ends - flat), flat) + np.arange(total)]
    totals = lengths.sum(axis=1)
    if len(totals) == 1:
        return np.sort(ids)[None] if total else np.full((1, 1), sentinel, dtype=np.int64)
    out = np.full((len(totals), max(int(totals.max()), 1)), sentinel, dtype=np.int64)
    rows = np.repeat(np.arange(len(totals)), totals)
    out[rows, np.arange(total) - np.repeat(np.cumsum(totals) - totals, totals)] = ids
    return np.sort(out, axis=1)  # the sentinel, the largest id, stays after each row's ids


def _gathered_runs_torch(members: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, nearest: torch.Tensor,
                         sentinel: int) -> torch.Tensor:
    """``_gathered_runs`` in torch, for heads on a GPU (no copy to the host, no synchronisation but the width's)."""
    lengths = counts[nearest].flatten()  # (N * k,)
    ends = torch.cumsum(lengths, 0)
    total = int(ends[-1])
    arange = torch.arange(total, device=nearest.device)
    ids = members[torch.repeat_interleave(starts[nearest].flatten() - (ends - lengths), lengths, output_size=total)
                  + arange]
    totals = lengths.view(nearest.shape).sum(dim=1)  # (N,)
    rows = torch.repeat_interleave(torch.arange(len(totals), device=nearest.device), totals, output_size=total)
    cols = arange - torch.repeat_interleave(torch.cumsum(totals, 0) - totals, totals, output_size=total)
    out = ids.new_full((len(totals), max(int(totals.max()), 1)), sentinel)
    out[rows, cols] = ids
    return out.sort(dim=-1).values


def _kmeans_within_groups(data: np.ndarray, keys: np.ndarray, config: ShortlistConfig
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """k-means inside each group of ``(V, d)`` vectors with ``(V,)`` keys -> centroids ``(m, d)`` (the means of
    their members), each vector's cluster ``(V,)`` and each cluster's group ``(m,)``; no cluster is empty."""
    order = np.argsort(keys, kind="stable")
    group_keys, starts, counts = np.unique(keys[order], return_index=True, return_counts=True)
    per_group = np.maximum(1, counts // config.cluster_size)
    labels = np.repeat(np.cumsum(per_group) - per_group, counts)  # first cluster of each vector's group
    split = np.flatnonzero(per_group > 1)
    for g in tqdm(split, desc="shortlist clusters", unit="group", disable=len(split) < 500):
        rows = order[starts[g] : starts[g] + counts[g]]
        kmeans = faiss.Kmeans(data.shape[1], int(per_group[g]), niter=config.kmeans_iterations, seed=config.seed,
                              max_points_per_centroid=config.max_points_per_centroid, min_points_per_centroid=1)
        kmeans.train(data[rows])
        labels[starts[g] : starts[g] + counts[g]] += kmeans.index.search(data[rows], 1)[1][:, 0]
    members = np.empty_like(labels)
    members[order] = labels
    used, members = np.unique(members, return_inverse=True)  # k-means may leave a cluster empty: drop it
    member_clusters = torch.from_numpy(members.astype(np.int64))
    sizes = torch.bincount(member_clusters, minlength=len(used))
    centroids = torch.zeros(len(used), data.shape[1]).index_add_(0, member_clusters, torch.from_numpy(data))
    cluster_groups = torch.from_numpy(np.repeat(group_keys, per_group)[used].astype(np.int64))
    return centroids / sizes[:, None], member_clusters, cluster_groups


def _checked_groups(groups: torch.Tensor, count: int) -> torch.Tensor:
    """``groups`` as a ``(count,)`` long tensor of keys >= 0, or a ``ValueError`` that says what to pass."""
    groups = torch.as_tensor(groups)
    if groups.shape != (count,) or groups.is_floating_point() or groups.dtype == torch.bool:
        raise ValueError(f"groups must be {count} integer keys, one per vector (e.g. each phrase's first token id); "
                         f"got {groups.dtype} of shape {tuple(groups.shape)}")
    if count and int(groups.min()) < 0:
        raise ValueError(f"groups must be keys >= 0; got {int(groups.min())}")
    return groups.long()


def _check_matrix(name: str, value: torch.Tensor, dim: int | None = None) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (n, d), got {type(value).__name__}")
    if value.dim() != 2 or value.shape[0] == 0 or (dim is not None and value.shape[1] != dim):
        want = f"(n, {dim})" if dim is not None else "(n, d) with n >= 1"
        raise ValueError(f"{name} has shape {tuple(value.shape)}; it must be {want}")
    if not value.is_floating_point():
        raise TypeError(f"{name} has dtype {value.dtype}; pass floating-point vectors")


def _numpy(vectors: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(vectors.detach().float().cpu().numpy(), dtype=np.float32)
