"""The docid trie as CSR arrays and the trie-constrained beam search of a non-autoregressive retriever.

A docid is a sequence of vocabulary ids closed by ``end_id``. A non-autoregressive model
scores every position at once: ``log p_t(v)`` for positions ``t = 0 .. s-1``. The beam search
walks the trie one position per step, extends each beam by its node's continuations
scored ``log p_t(token)``, and keeps the ``beam_size`` best per query; a beam that took
``end_id`` is finished and keeps its score. The search is batched tensor code (every query and
beam of a step in one gather, one sort); ``beam_search_reference`` runs the same search as a
per-query Python loop and gives identical results (it is the test oracle and the speed baseline).

Scores come sparse, as the shortlist head gives them: each query's sorted candidate ids
``(B, C)`` and their scores ``(B, s, C)``; an id off a query's shortlist scores ``-inf``.
For scores over every id (full softmax) pass ``ids=None`` and ``(B, s, V)`` scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["BeamResult", "DocidTrie", "aggregate_documents", "beam_search", "beam_search_reference"]


class DocidTrie:
    """Nodes ``0 .. n-1`` (0 is the root); node ``u``'s edges are ``offsets[u] .. offsets[u+1]`` of
    ``tokens`` (their labels, sorted) and ``children``; ``leaf_docid[u]`` is the docid a leaf closes (-1 elsewhere).
    ``root_child[t]`` is the root's child along token ``t`` (-1: none; its last entry stands for every larger id)."""

    def __init__(self, offsets: torch.Tensor, tokens: torch.Tensor, children: torch.Tensor, leaf_docid: torch.Tensor,
                 end_id: int, max_length: int) -> None:
        self.offsets, self.tokens, self.children, self.leaf_docid = offsets, tokens, children, leaf_docid
        self.end_id, self.max_length = end_id, max_length
        root = slice(int(offsets[0]), int(offsets[1]))
        self.root_child = torch.full((int(tokens.max()) + 2,), -1, dtype=torch.long, device=tokens.device)
        self.root_child[tokens[root]] = children[root]  # every query starts here: one gather, not a search

    @classmethod
    def build(cls, docids: Sequence[Sequence[int]], end_id: int) -> "DocidTrie":
        """A trie over ``docids`` (each a sequence of ids without ``end_id``); equal docids share a leaf, the first one's."""
        if not isinstance(end_id, int) or end_id < 0:
            raise ValueError(f"end_id={end_id!r} must be a non-negative vocabulary id; pass the id that closes a docid")
        edges: list[dict[int, int]] = [{}]
        leaf_docid = [-1]
        max_length = 0
        for number, docid in enumerate(docids):
            sequence = list(docid)
            if not sequence or end_id in sequence or min(sequence) < 0:
                raise ValueError(f"docid {number} = {sequence} must be a non-empty list of ids >= 0 without end_id "
                                 f"{end_id}; fix the docid encoding")
            node = 0
            for token in [*sequence, end_id]:
                child = edges[node].get(token)
                if child is None:
                    child = edges[node][token] = len(edges)
                    edges.append({})
                    leaf_docid.append(number if token == end_id else -1)
                node = child
            max_length = max(max_length, len(sequence) + 1)
        if len(edges) == 1:
            raise ValueError("docids is empty; pass at least one docid")
        degree = torch.tensor([len(e) for e in edges], dtype=torch.long)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)])
        pairs = [sorted(e.items()) for e in edges]
        tokens = torch.tensor([t for p in pairs for t, _ in p], dtype=torch.long)
        children = torch.tensor([c for p in pairs for _, c in p], dtype=torch.long)
        return cls(offsets, tokens, children, torch.tensor(leaf_docid, dtype=torch.long), end_id, max_length)

    @property
    def num_nodes(self) -> int:
        return self.offsets.numel() - 1

    def to(self, device: str | torch.device) -> "DocidTrie":
        moved = [t.to(device) for t in (self.offsets, self.tokens, self.children, self.leaf_docid)]
        return DocidTrie(*moved, self.end_id, self.max_length)


@dataclass(frozen=True)
class BeamResult:
    """Finished docids per query, best first: ``docids`` ``(B, W)`` (-1: none) and their ``scores`` ``(B, W)``."""

    docids: torch.Tensor
    scores: torch.Tensor


@torch.no_grad()
def beam_search(trie: DocidTrie, ids: torch.Tensor | None, scores: torch.Tensor, beam_size: int = 10) -> BeamResult:
    """Trie-constrained beam search for ``B`` queries at once: sorted candidate ``ids`` ``(B, C)`` (None: every id),
    position scores ``(B, s, C)`` -> the ``beam_size`` best finished docids per query.

    The first step meets the root, whose edges are every docid's first token: one gather in ``root_child`` takes each
    query's shortlist ids to root children (not ``B x`` the root's degree), and a per-row ``topk`` threshold keeps the
    best. Later steps lay every live beam's continuations out flat, a finished beam passing as itself, and rank each
    query's with two stable sorts. Ties break by beam, then edge order, as the reference breaks them.
    """
    _check_inputs(ids, scores, beam_size)
    batch, positions, _ = scores.shape
    device = scores.device
    if positions == 0:
        empty = torch.full((batch, beam_size), -1, dtype=torch.long, device=device)
        return _finished(trie, empty, torch.full(empty.shape, float("-inf"), dtype=scores.dtype, device=device),
                         torch.zeros_like(empty, dtype=torch.bool))
    ids = None if ids is None else ids.contiguous()  # searchsorted copies a strided input on every call
    scores = scores.contiguous()  # read through flat indices below, never copied per step
    degrees = trie.offsets[1:] - trie.offsets[:-1]
    if ids is None:
        root = slice(int(trie.offsets[0]), int(trie.offsets[1]))
        step_scores, step_nodes = scores[:, 0, trie.tokens[root]], trie.children[root].expand(batch, -1)
    else:
        step_nodes = trie.root_child[ids.clamp(max=trie.root_child.numel() - 1)]
        step_scores = scores[:, 0].masked_fill(step_nodes < 0, float("-inf"))
    query, column, rank = _best_per_row(step_scores, beam_size)
    nodes, totals = _placed(query, rank, step_nodes[query, column], step_scores[query, column], batch, beam_size)
    finished = (nodes >= 0) & (trie.leaf_docid[nodes.clamp(min=0)] >= 0)
    width = scores.shape[2]
    stride = None if ids is None else int(ids.max()) + 1
    keys = None if ids is None else (ids + torch.arange(batch, device=device)[:, None] * stride).flatten()
    for step in range(1, min(positions, trie.max_length)):
        if bool(finished[nodes >= 0].all()):
            break
        live = (nodes >= 0) & ~finished
        at = nodes.clamp(min=0)
        degree = torch.where(live, degrees[at], finished.long()).flatten()
        beam = torch.repeat_interleave(torch.arange(batch * beam_size, device=device), degree)  # (E,) beam of each candidate
        within = torch.arange(beam.numel(), device=device) - (torch.cumsum(degree, 0) - degree)[beam]
        stays = finished.flatten()[beam]  # a finished beam competes as it is
        edge = torch.where(stays, 0, trie.offsets[at.flatten()[beam]] + within)
        candidate_query = beam // beam_size
        token = trie.tokens[edge]
        if ids is None:
            gained = scores[candidate_query, step, token]
        else:
            wanted = candidate_query * stride + token
            where = torch.searchsorted(keys, wanted).clamp(max=keys.numel() - 1)  # = query * width + column
            flat = where + candidate_query * ((positions - 1) * width) + step * width  # into scores (B, s, C)
            gained = scores.view(-1)[flat].masked_fill(keys[where] != wanted, float("-inf"))
        candidate_total = totals.flatten()[beam] + torch.where(stays, 0, gained)
        candidate_node = torch.where(stays, nodes.flatten()[beam], trie.children[edge])
        # candidates lie in (query, beam, edge) order: two stable sorts rank each query's, ties as the reference
        order = torch.argsort(candidate_total, descending=True, stable=True)
        order = order[torch.argsort(candidate_query[order], stable=True)]
        query = candidate_query[order]
        rank = torch.arange(order.numel(), device=device) - torch.searchsorted(query, torch.arange(batch, device=device))[query]
        keep = (rank < beam_size) & torch.isfinite(candidate_total[order])
        chosen = order[keep]
        nodes, totals = _placed(query[keep], rank[keep], candidate_node[chosen], candidate_total[chosen], batch, beam_size)
        finished = (nodes >= 0) & (trie.leaf_docid[nodes.clamp(min=0)] >= 0)
    return _finished(trie, nodes, totals, finished)


def _best_per_row(values: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``count`` largest finite entries of each row of ``(B, n)`` ``values``, ties to the lower column ->
    their rows, columns and ranks (0 = best). A ``topk`` threshold passes few entries, so the stable sorts stay small."""
    if values.shape[1] == 0:
        nothing = torch.empty(0, dtype=torch.long, device=values.device)
        return nothing, nothing, nothing
    kth = values.topk(min(count, values.shape[1]), dim=1).values[:, -1:]
    row, column = ((values >= kth) & torch.isfinite(values)).nonzero(as_tuple=True)  # row-major: columns ascend
    order = torch.argsort(values[row, column], descending=True, stable=True)
    order = order[torch.argsort(row[order], stable=True)]
    row, column = row[order], column[order]
    first = torch.searchsorted(row, torch.arange(values.shape[0], device=values.device))
    rank = torch.arange(row.numel(), device=values.device) - first[row]
    chosen = rank < count
    return row[chosen], column[chosen], rank[chosen]


def _placed(query: torch.Tensor, rank: torch.Tensor, node: torch.Tensor, total: torch.Tensor, batch: int, beam_size: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Beams ``(B, W)``: ``node`` and ``total`` written at ``(query, rank)``; -1 and ``-inf`` elsewhere."""
    nodes = torch.full((batch, beam_size), -1, dtype=torch.long, device=node.device)
    totals = torch.full((batch, beam_size), float("-inf"), dtype=total.dtype, device=total.device)
    nodes[query, rank], totals[query, rank] = node, total
    return nodes, totals


def _finished(trie: DocidTrie, nodes: torch.Tensor, totals: torch.Tensor, finished: torch.Tensor) -> BeamResult:
    totals = totals.masked_fill(~finished, float("-inf"))
    order = totals.sort(dim=-1, descending=True, stable=True).indices
    totals, nodes, finished = totals.gather(1, order), nodes.gather(1, order), finished.gather(1, order)
    docids = torch.where(finished, trie.leaf_docid[nodes.clamp(min=0)], -1)
    return BeamResult(docids, totals)


def beam_search_reference(trie: DocidTrie, ids: torch.Tensor | None, scores: torch.Tensor, beam_size: int = 10
                          ) -> BeamResult:
    """The same search, one query and one beam at a time in Python (float32 sums as the batched one makes)."""
    _check_inputs(ids, scores, beam_size)
    offsets, tokens, children, leaves = (t.cpu().tolist() for t in (trie.offsets, trie.tokens, trie.children, trie.leaf_docid))
    all_scores = scores.cpu().numpy()
    dtype = all_scores.dtype.type
    docids = np.full((scores.shape[0], beam_size), -1, dtype=np.int64)
    best = np.full((scores.shape[0], beam_size), -np.inf, dtype=all_scores.dtype)
    for query in range(scores.shape[0]):
        row = range(scores.shape[2]) if ids is None else ids[query].tolist()
        lookup = {int(i): position for position, i in enumerate(row)}
        beams = [(dtype(0), 0, False)]  # (score, node, finished)
        for step in range(min(scores.shape[1], trie.max_length)):
            if all(done for _, _, done in beams):
                break
            pool = []
            for rank, (total, node, done) in enumerate(beams):
                if done:
                    pool.append((total, rank, -1, node))
                    continue
                for edge in range(offsets[node], offsets[node + 1]):
                    position = lookup.get(tokens[edge])
                    if position is not None:
                        pool.append((dtype(total + all_scores[query, step, position]), rank, edge - offsets[node], children[edge]))
            pool = [c for c in pool if np.isfinite(c[0])]
            pool.sort(key=lambda c: (-c[0], c[1], c[2]))
            beams = [(total, node, leaves[node] >= 0) for total, _, _, node in pool[:beam_size]]
        done = sorted(((total, rank, node) for rank, (total, node, fin) in enumerate(beams) if fin), key=lambda c: (-c[0], c[1]))
        for column, (total, _, node) in enumerate(done):
            docids[query, column], best[query, column] = leaves[node], total
    return BeamResult(torch.from_numpy(docids), torch.from_numpy(best))


def aggregate_documents(result: BeamResult, document_of_docid: torch.Tensor, how: str = "max", k: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank documents from docid beams: ``document_of_docid`` ``(num_docids,)``; a document's score is the
    ``max`` of its docids' scores or the log of their summed probabilities (``"sum"``). -> ``(B, k)`` documents
    (-1: none) and scores."""
    if how not in ("max", "sum"):
        raise ValueError(f"how={how!r}; choose 'max' or 'sum'")
    valid = result.docids >= 0
    documents = torch.where(valid, document_of_docid[result.docids.clamp(min=0)], -1)
    k = k or documents.shape[1]
    same = (documents[:, :, None] == documents[:, None, :]) & valid[:, :, None] & valid[:, None, :]  # (B, W, W)
    if how == "max":
        merged = result.scores[:, None, :].expand_as(same).masked_fill(~same, float("-inf")).amax(-1)
    else:
        merged = torch.logsumexp(result.scores[:, None, :].expand_as(same).masked_fill(~same, float("-inf")), -1)
    first = ~torch.tril(same, diagonal=-1).any(-1)  # each document once, at its best beam
    merged = merged.masked_fill(~(valid & first), float("-inf"))
    order = merged.sort(dim=-1, descending=True, stable=True).indices[:, :k]
    scores = merged.gather(1, order)
    return torch.where(torch.isfinite(scores), documents.gather(1, order), -1), scores


def _check_inputs(ids: torch.Tensor | None, scores: torch.Tensor, beam_size: int) -> None:
    if not isinstance(scores, torch.Tensor) or not (ids is None or isinstance(ids, torch.Tensor)):
        raise TypeError("ids and scores must be torch tensors: (B, C) sorted candidate ids (or None) and (B, s, C) scores")
    if scores.dim() != 3 or (ids is not None and (ids.dim() != 2 or tuple(ids.shape) != (scores.shape[0], scores.shape[2]))):
        shape = None if ids is None else tuple(ids.shape)
        raise ValueError(f"ids {shape} and scores {tuple(scores.shape)} must be (B, C) and (B, s, C)")
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size={beam_size!r} must be an integer >= 1; pass e.g. beam_size=10")
