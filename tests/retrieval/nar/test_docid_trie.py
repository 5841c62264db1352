"""Trie-constrained beam search against brute force over a small trie and against its per-query Python loop."""

import itertools

import pytest
import torch

from retrieval.nar.trie import BeamResult, DocidTrie, aggregate_documents, beam_search, beam_search_reference

END = 0
DOCIDS = [[1, 2], [1, 3], [1, 3, 4], [2], [2, 5, 6], [3, 1], [4, 4, 4], [5]]


def random_scores(batch: int, positions: int, vocab: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(batch, positions, vocab, generator=generator) * 2, dim=-1)


def brute_force(scores: torch.Tensor) -> list[list[tuple[float, int]]]:
    """Every docid's score sum_t log p_t(token_t) with the end id, best first, per query."""
    ranked = []
    for query in scores:
        totals = [(float(sum(query[t, tok] for t, tok in enumerate([*d, END]))), n) for n, d in enumerate(DOCIDS)]
        ranked.append(sorted(totals, key=lambda pair: -pair[0]))
    return ranked


def test_the_trie_holds_each_docid_once_with_sorted_edges():
    trie = DocidTrie.build(DOCIDS, END)
    assert trie.max_length == 4 and int((trie.leaf_docid >= 0).sum()) == len(DOCIDS)
    for node in range(trie.num_nodes):
        labels = trie.tokens[trie.offsets[node] : trie.offsets[node + 1]].tolist()
        assert labels == sorted(labels) and len(labels) == len(set(labels))


def test_a_wide_beam_finds_the_brute_force_ranking():
    trie = DocidTrie.build(DOCIDS, END)
    scores = random_scores(4, 5, 8)
    ids = torch.arange(8).expand(4, 8).contiguous()
    result = beam_search(trie, ids, scores, beam_size=len(DOCIDS) * 4)
    for row, expected in enumerate(brute_force(scores)):
        found = [(s, d) for s, d in zip(result.scores[row].tolist(), result.docids[row].tolist()) if d >= 0]
        assert [d for _, d in found] == [d for _, d in expected]
        assert all(abs(a - b) < 1e-5 for (a, _), (b, _) in zip(found, expected))


@pytest.mark.parametrize("beam_size", [1, 2, 3, 5])
def test_batched_search_equals_the_per_query_loop_on_sparse_shortlists(beam_size):
    trie = DocidTrie.build(DOCIDS, END)
    scores = random_scores(6, 5, 8, seed=beam_size)
    generator = torch.Generator().manual_seed(beam_size)
    keep = torch.rand(6, 8, generator=generator) < 0.7
    keep[:, END] = True
    ids = torch.where(keep, torch.arange(8), 8).sort(-1).values  # per-query shortlists, padded with 8
    sparse = torch.where((ids < 8)[:, None, :], scores.gather(2, ids.clamp(max=7)[:, None, :].expand(-1, 5, -1)), float("-inf"))
    fast = beam_search(trie, ids, sparse, beam_size)
    slow = beam_search_reference(trie, ids, sparse, beam_size)
    assert torch.equal(fast.docids, slow.docids) and torch.equal(fast.scores, slow.scores)


@pytest.mark.parametrize("sparse", [False, True])
def test_batched_search_equals_the_loop_on_a_wide_root_with_tied_scores(sparse):
    """Random docids over 40 ids (a root wider than the beam), scores rounded so that many tie."""
    generator = torch.Generator().manual_seed(7)
    docids = {tuple(torch.randint(1, 40, (int(n),), generator=generator).tolist())
              for n in torch.randint(1, 5, (120,), generator=generator)}
    trie = DocidTrie.build(sorted(docids), END)
    scores = torch.randint(-4, 1, (5, trie.max_length + 1, 40), generator=generator).float()
    ids = None
    if sparse:
        keep = torch.rand(5, 40, generator=generator) < 0.6
        keep[:, END] = True
        ids = torch.where(keep, torch.arange(40), 40).sort(-1).values
        scores = torch.where((ids < 40)[:, None, :], scores.gather(2, ids.clamp(max=39)[:, None, :].expand_as(scores)),
                             float("-inf"))
    for beam_size in (1, 4, 16):
        fast = beam_search(trie, ids, scores, beam_size)
        slow = beam_search_reference(trie, ids, scores, beam_size)
        assert torch.equal(fast.docids, slow.docids) and torch.equal(fast.scores, slow.scores)
        assert bool((fast.docids >= 0).any())


def test_a_query_s_results_do_not_depend_on_its_batch_mates():
    trie = DocidTrie.build(DOCIDS, END)
    scores = random_scores(3, 5, 8)
    ids = torch.arange(8).expand(3, 8).contiguous()
    together = beam_search(trie, ids, scores, 3)
    alone = beam_search(trie, ids[1:2], scores[1:2], 3)
    assert torch.equal(together.docids[1:2], alone.docids)


def test_documents_take_the_best_or_summed_score_of_their_docids():
    result = BeamResult(torch.tensor([[0, 2, 1, -1]]), torch.tensor([[-1.0, -2.0, -3.0, float("-inf")]]))
    document_of_docid = torch.tensor([7, 8, 7])  # docids 0 and 2 both name document 7
    documents, scores = aggregate_documents(result, document_of_docid, "max")
    assert documents.tolist() == [[7, 8, -1, -1]] and scores[0, :2].tolist() == [-1.0, -3.0]
    documents, scores = aggregate_documents(result, document_of_docid, "sum")
    assert documents[0, :2].tolist() == [7, 8]
    assert abs(float(scores[0, 0]) - float(torch.logsumexp(torch.tensor([-1.0, -2.0]), 0))) < 1e-6


def test_every_docid_is_reachable_and_ends_at_its_leaf():
    trie = DocidTrie.build(DOCIDS, END)
    for number, docid in enumerate(DOCIDS):
        node = 0
        for token in itertools.chain(docid, [END]):
            edges = range(int(trie.offsets[node]), int(trie.offsets[node + 1]))
            node = next(int(trie.children[e]) for e in edges if int(trie.tokens[e]) == token)
        assert int(trie.leaf_docid[node]) == number
