"""The shortlist head against exhaustive scoring on synthetic vectors with known answers."""

import copy

import pytest
import torch

from dynvocab.scoring.shortlist_head import (
    ShortlistConfig,
    ShortlistHead,
    _gathered_runs,
    _gathered_runs_torch,
    chunked_logsumexp,
    int8_routing_available,
)


def clustered(num_groups: int = 8, per_group: int = 30, dim: int = 16, seed: int = 0):
    """Vectors in well-separated groups: ``(num_groups * per_group, dim)`` and the group centres."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_groups, dim, generator=generator) * 4
    vectors = centres.repeat_interleave(per_group, 0) + 0.3 * torch.randn(num_groups * per_group, dim, generator=generator)
    return vectors, centres


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)  # random queries, the same every run


def brute_candidates(head: ShortlistHead, query: torch.Tensor) -> set[int]:
    """The union of the probed clusters' subsets, one query at a time (the reference; probes as the head does)."""
    nearest = head.route(query[None])[0].topk(min(head.config.probe, head.num_clusters)).indices.tolist()
    return {i for j in nearest for i in head.subsets[j].tolist() if i < head.vocab_size}


def test_probing_every_cluster_is_exact():
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=8, probe=8, subset_size=4))
    queries = torch.randn(5, 16)
    assert torch.allclose(head.dense_scores(queries, vectors)[:, 0], queries @ vectors.T, atol=1e-5)


def test_candidates_are_the_per_query_union_once_each():
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=12, probe=3, subset_size=10))
    queries = torch.randn(7, 16)
    ids = head.candidates(queries)
    for row, query in enumerate(queries):
        found = [i for i in ids[row].tolist() if i < head.vocab_size]
        assert len(found) == len(set(found))
        assert set(found) == brute_candidates(head, query)
        alone = head.candidates(query[None])[0]
        assert set(alone.tolist()) - {head.vocab_size} == set(found)  # a query's shortlist ignores its batch mates


def test_scores_are_exact_on_the_shortlist_and_minus_inf_off_it():
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=12, probe=2, subset_size=5))
    queries = torch.randn(4, 16)
    dense = head.dense_scores(queries, vectors)[:, 0]
    exact = queries @ vectors.T
    for row, query in enumerate(queries):
        on = torch.zeros(len(vectors), dtype=torch.bool)
        on[list(brute_candidates(head, query))] = True
        assert torch.allclose(dense[row][on], exact[row][on], atol=1e-5)
        assert torch.isinf(dense[row][~on]).all()


def test_position_states_are_scored_against_the_query_shortlist():
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=8, probe=2, subset_size=4))
    queries, states = torch.randn(3, 16), torch.randn(3, 5, 16)
    ids, scores = head.score(queries, vectors, states)
    real = ids < head.vocab_size
    expected = torch.einsum("ntd,ncd->ntc", states, vectors[ids.clamp(max=len(vectors) - 1)])
    assert torch.allclose(scores[real[:, None, :].expand_as(scores)], expected[real[:, None, :].expand_as(scores)], atol=1e-5)


def test_a_query_near_a_group_finds_its_exact_top_10():
    vectors, centres = clustered(num_groups=16, per_group=40)
    vectors = torch.nn.functional.normalize(vectors, dim=-1)  # unit norms: inner product ranks as distance does
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=16, probe=2, subset_size=40))
    queries = centres + 0.1 * torch.randn_like(centres)
    ids, scores = head.score(queries, vectors)
    top = ids.gather(1, scores[:, 0].topk(10).indices)
    exact = (queries @ vectors.T).topk(10).indices
    assert all(set(a.tolist()) == set(b.tolist()) for a, b in zip(top, exact))


def test_added_vectors_join_their_cluster_and_stay_exact_under_full_probing():
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors[:200], ShortlistConfig(num_clusters=6, probe=6, subset_size=5))
    head.add(vectors[200:])
    assert head.vocab_size == len(vectors)
    queries = torch.randn(4, 16)
    assert torch.allclose(head.dense_scores(queries, vectors)[:, 0], queries @ vectors.T, atol=1e-5)
    nearest = torch.cdist(vectors[200:], head.centroids).argmin(-1)
    for offset, cluster in enumerate(nearest.tolist()):
        assert 200 + offset in head.subsets[cluster].tolist()


def test_keep_renumbers_like_the_phrase_table():
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=10, probe=3, subset_size=6))
    queries = torch.randn(3, 16)
    before = head.candidates(queries)
    kept = list(range(0, len(vectors), 2))
    head.keep(kept)
    after = head.candidates(queries)
    new_of_old = {old: new for new, old in enumerate(kept)}
    for row in range(3):
        expected = {new_of_old[i] for i in before[row].tolist() if i in new_of_old}
        assert set(after[row].tolist()) - {head.vocab_size} == expected
    assert head.vocab_size == len(kept)


def test_learned_clusters_shortlist_each_query_targets():
    generator = torch.Generator().manual_seed(0)
    vocab = torch.randn(300, 64, generator=generator)
    group = torch.arange(240) % 6
    targets = torch.stack([torch.arange(4) * 50 + g for g in group.tolist()])  # group g wants ids g, 50+g, 100+g, 150+g
    queries = vocab[targets].sum(1) + 0.5 * torch.randn(240, 64, generator=generator)  # as a trained x0 points at them
    config = ShortlistConfig(num_clusters=6, probe=1, subset_size=8, seed=0)

    def found(steps: int) -> float:
        head = ShortlistHead.learned(queries, targets, vocab, config, steps=steps, learning_rate=0.1, batch_size=64)
        ids = head.candidates(queries)
        return sum(len(set(t.tolist()) & set(i.tolist())) for t, i in zip(targets, ids)) / targets.numel()

    untrained, trained = found(0), found(150)
    assert trained == 1.0 and untrained < 1.0  # k-means of the queries merges two groups; training covers both


def test_chunked_logsumexp_matches_the_full_one_with_gradients():
    queries = torch.randn(5, 8, requires_grad=True)
    weight = torch.randn(37, 8, requires_grad=True)
    full = torch.logsumexp(queries @ weight.T, -1)
    chunked = chunked_logsumexp(queries, weight, chunk=10)
    assert torch.allclose(full, chunked, atol=1e-5)
    grads = torch.autograd.grad(full.sum(), (queries, weight))
    chunked_grads = torch.autograd.grad(chunked_logsumexp(queries, weight, chunk=10).sum(), (queries, weight))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, chunked_grads))


def test_save_and_load_round_trip_and_a_corrupted_file_is_named(tmp_path):
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=5, probe=2, subset_size=3))
    head.save(tmp_path / "head")
    again = ShortlistHead.load(tmp_path / "head")
    for name in ("centroids", "subsets", "thresholds"):
        assert torch.equal(getattr(head, name), getattr(again, name))
    assert again.config == head.config and again.vocab_size == head.vocab_size
    weights = tmp_path / "head" / "shortlist.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ValueError, match="shortlist.safetensors is corrupted"):
        ShortlistHead.load(tmp_path / "head")


def test_always_ids_join_every_shortlist():
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=12, probe=1, subset_size=2))
    head.always = torch.tensor([5, 200])
    ids = head.candidates(torch.randn(6, 16))
    assert all({5, 200} <= set(row.tolist()) for row in ids)
    assert all(len(set(r.tolist()) - {head.vocab_size}) == int((r < head.vocab_size).sum()) for r in ids)


def test_a_grouped_fit_clusters_inside_each_group_and_holds_each_id_once():
    vectors, _ = clustered(num_groups=8, per_group=30)
    groups = torch.arange(len(vectors)) % 5  # keys that cut across the vector clusters
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(cluster_size=10, subset_size=0, probe=3), groups)
    assert head.grouped and head.num_clusters == 5 * (48 // 10)
    held = [i for row in head.subsets.tolist() for i in row if i < head.vocab_size]
    assert sorted(held) == list(range(len(vectors)))  # members only: every id in exactly one cluster
    for cluster, row in enumerate(head.subsets.tolist()):
        assert {int(groups[i]) for i in row if i < head.vocab_size} == {int(head.cluster_groups[cluster])}
        members = vectors[[i for i in row if i < head.vocab_size]]
        assert torch.allclose(head.centroids[cluster], members.mean(0), atol=1e-5)
    queries = torch.randn(6, 16)
    for row, query in zip(head.candidates(queries), queries):
        assert set(row.tolist()) - {head.vocab_size} == brute_candidates(head, query)


def test_grouped_add_joins_the_nearest_cluster_of_its_group_or_opens_one():
    vectors, _ = clustered(num_groups=8, per_group=30)
    groups = torch.arange(len(vectors)) % 4
    config = ShortlistConfig(cluster_size=8, subset_size=0, probe=1000)
    head = ShortlistHead.from_vectors(vectors[:200], config, groups[:200])
    new_groups = torch.cat([groups[200:230], torch.full((10,), 9)])  # group 9 is new
    before = head.num_clusters
    head.add(vectors[200:], new_groups)
    assert head.num_clusters == before + 1 and int(head.cluster_groups[-1]) == 9
    for offset, key in enumerate(new_groups.tolist()):
        cluster = next(c for c, row in enumerate(head.subsets.tolist()) if 200 + offset in row)
        assert int(head.cluster_groups[cluster]) == key
        own = (head.cluster_groups[:before] == key).nonzero().flatten()
        if key != 9:
            distances = torch.cdist(vectors[200 + offset][None], head.centroids[own])[0]
            assert cluster == int(own[distances.argmin()])
    queries = torch.randn(4, 16)
    assert torch.allclose(head.dense_scores(queries, vectors)[:, 0], queries @ vectors.T, atol=1e-5)
    with pytest.raises(ValueError, match="pass add\\(vectors, groups=...\\)"):
        head.add(vectors[:2])
    with pytest.raises(ValueError, match="groups must be 2 integer keys"):
        head.add(vectors[:2], torch.tensor([1.0, 2.0]))


def test_a_grouped_head_saves_and_loads_its_groups(tmp_path):
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(cluster_size=16, subset_size=0), torch.arange(len(vectors)) % 3)
    head.save(tmp_path / "head")
    again = ShortlistHead.load(tmp_path / "head")
    assert again.grouped and torch.equal(again.cluster_groups, head.cluster_groups)
    assert torch.equal(again.subsets, head.subsets)


def test_a_members_only_head_gathers_each_probe_sorted_and_padded_after_add_and_keep_too():
    """The grouped head's union comes from its members laid end to end (no padded table): rows sorted, each id once,
    the pad after them, the width the widest row's; rebuilt when add or keep replaces the subsets."""
    vectors, _ = clustered(num_groups=8, per_group=30)
    groups = torch.arange(len(vectors)) % 5
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(cluster_size=7, subset_size=0, probe=4), groups)
    assert head._disjoint()

    def check(queries: torch.Tensor) -> None:
        ids = head.candidates(queries)
        widths = [len(brute_candidates(head, q)) for q in queries]
        assert ids.shape == (len(queries), max(widths)) and len(set(widths)) > 1  # rows of different widths
        for row, query, width in zip(ids.tolist(), queries, widths):
            assert row[:width] == sorted(brute_candidates(head, query)) and set(row[width:]) <= {head.vocab_size}
            assert head.candidates(query[None]).tolist() == [row[:width]]  # a decoding step's one query: no pad

    check(torch.randn(6, 16))
    head.add(torch.randn(9, 16) * 4, torch.tensor([0, 1, 2, 3, 4, 5, 5, 0, 1]))  # group 5 opens a cluster
    check(torch.randn(6, 16))
    head.keep(list(range(0, head.vocab_size, 3)))
    check(torch.randn(6, 16))


CUDA_AT_HAND = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA_AT_HAND])])
def test_the_cpu_and_gpu_gathers_of_the_members_agree(device):
    """The numpy gather (CPU heads) and the torch one (heads on a GPU; here on ``device``'s tensors) give the same
    rows, an empty cluster among the probed ones included."""
    generator = torch.Generator().manual_seed(1)
    counts = torch.randint(0, 6, (12,), generator=generator)
    counts[3] = 0
    members = torch.randperm(int(counts.sum()), generator=generator)
    starts = torch.cumsum(counts, 0) - counts
    for nearest in (torch.tensor([[3, 0, 7]]), torch.randint(0, 12, (5, 4), generator=generator), torch.tensor([[3]])):
        numpy = _gathered_runs(members.numpy(), starts.numpy(), counts.numpy(), nearest.numpy(), 100)
        got = _gathered_runs_torch(*(t.to(device) for t in (members, starts, counts, nearest)), 100)
        assert got.device.type == device and got.cpu().tolist() == numpy.tolist()


@pytest.mark.skipif(not int8_routing_available(), reason="this torch has no quantized CPU engine")
def test_int8_routing_probes_each_query_alone_whatever_its_batch():
    """The int8 probe quantizes each query over the same range: a query's candidates do not depend on its batch."""
    vectors, _ = clustered(num_groups=16, per_group=20)
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=16, probe=3, subset_size=5, routing="int8"))
    queries = torch.randn(9, 16) * torch.logspace(-2, 2, 9)[:, None]  # sizes 1e-2 .. 1e2 side by side
    batched = head.candidates(queries)
    for row, query in enumerate(queries):
        alone = head.candidates(query[None])[0]
        assert batched[row][batched[row] < head.vocab_size].tolist() == alone[alone < head.vocab_size].tolist()
    assert not isinstance(head._router[1], torch.Tensor)  # the int8 path ran


@pytest.mark.skipif(not int8_routing_available(), reason="this torch has no quantized CPU engine")
def test_int8_routing_ranks_centroids_as_float_routing_does():
    generator = torch.Generator().manual_seed(3)
    centroids = torch.randn(2000, 64, generator=generator)
    queries = torch.randn(50, 64, generator=generator)
    heads = {routing: ShortlistHead(centroids, torch.zeros(2000, 1, dtype=torch.long), torch.zeros(2000), 1,
                                    ShortlistConfig(routing=routing)) for routing in ("auto", "float16")}
    heads["auto"].route(queries[:1])
    heads["float16"].route(queries[:1])
    assert not isinstance(heads["auto"]._router[1], torch.Tensor)  # int8, packed for torch's quantized engine
    assert isinstance(heads["float16"]._router[1], torch.Tensor)
    exact = (queries @ centroids.T).topk(32).indices
    for routing, head in heads.items():
        found = head.route(queries).topk(32).indices
        overlap = sum(len(set(a) & set(b)) for a, b in zip(exact.tolist(), found.tolist())) / exact.numel()
        assert overlap > (0.9 if routing == "auto" else 0.99)
    int8 = heads["auto"].route(queries)
    assert torch.allclose(int8, queries @ centroids.T, atol=0.05 * float((queries @ centroids.T).abs().max()))


def test_routing_copies_are_remade_when_centroids_change_and_left_out_of_copies():
    vectors, _ = clustered()
    config = ShortlistConfig(cluster_size=7, subset_size=0, probe=2)
    head = ShortlistHead.from_vectors(vectors, config, torch.arange(240) % 4)
    head.candidates(torch.randn(2, 16))
    before = head._router
    head.add(torch.randn(3, 16), torch.tensor([9, 9, 1]))  # group 9 opens a cluster: the centroids grow
    head.candidates(torch.randn(2, 16))
    assert head._router is not before and head._router[0][2] == head.num_clusters
    before = head._router
    head.centroids.mul_(2)  # written in place: the copy is made again
    head.candidates(torch.randn(2, 16))
    assert head._router is not before
    copied = copy.deepcopy(head)
    assert copied._router is None
    assert torch.equal(copied.candidates(torch.ones(1, 16)), head.candidates(torch.ones(1, 16)))


def test_an_unknown_routing_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'auto', 'int8', 'float16'"):
        ShortlistConfig(routing="int4")


def test_auto_routing_probes_in_float16_where_torch_has_no_int8_ops(monkeypatch):
    monkeypatch.delattr(torch, "quantize_per_channel")
    vectors, _ = clustered()
    head = ShortlistHead.from_vectors(vectors, ShortlistConfig(num_clusters=8, probe=2))
    head.candidates(torch.randn(2, 16))
    assert not int8_routing_available() and isinstance(head._router[1], torch.Tensor)
