import math

import pytest

from evals.retrieval.ranking import (
    hits_at_k,
    mrr_at_k,
    ndcg_at_k,
    paired_relative_interval,
    ranking_metrics,
    recall_at_k,
    reciprocal_ranks,
)

# two queries with hand-known answers: q1's relevant doc at rank 2, q2's relevant docs at ranks 1 and 4
RANKINGS = [["a", "b", "c"], ["x", "y", "z", "w"]]
RELEVANT = ["b", {"x", "w", "missing"}]


def test_mrr_is_the_mean_reciprocal_rank_of_the_first_hit():
    assert mrr_at_k(RANKINGS, RELEVANT, 10) == pytest.approx((1 / 2 + 1) / 2)
    assert mrr_at_k(RANKINGS, RELEVANT, 1) == pytest.approx((0 + 1) / 2)


def test_recall_counts_relevant_ids_found_within_k():
    assert recall_at_k(RANKINGS, RELEVANT, 2) == pytest.approx((1 + 1 / 3) / 2)
    assert recall_at_k(RANKINGS, RELEVANT, 4) == pytest.approx((1 + 2 / 3) / 2)


def test_hits_is_any_relevant_within_k():
    assert hits_at_k(RANKINGS, RELEVANT, 1) == pytest.approx(0.5)
    assert hits_at_k(RANKINGS, RELEVANT, 2) == pytest.approx(1.0)


def test_ndcg_against_a_hand_computation():
    first = (1 / math.log2(3)) / 1.0
    second = (1 + 1 / math.log2(5)) / (1 + 1 / math.log2(3) + 1 / math.log2(4))
    assert ndcg_at_k(RANKINGS, RELEVANT, 10) == pytest.approx((first + second) / 2)
    assert ndcg_at_k([["a"]], ["a"]) == pytest.approx(1.0)


def test_ranking_metrics_collects_the_report_row():
    row = ranking_metrics(RANKINGS, RELEVANT, recall_ks=(2,))
    assert set(row) == {"mrr@10", "ndcg@10", "recall@2"}


@pytest.mark.parametrize(
    ("rankings", "relevant", "k", "error", "fragment"),
    [
        (RANKINGS, RELEVANT, 0, ValueError, "positive int"),
        (RANKINGS, ["b"], 10, ValueError, "one of each per query"),
        ([], [], 10, ValueError, "at least one ranking"),
        ([["a"]], [set()], 10, ValueError, "no relevant id"),
        ("abc", ["a"], 10, TypeError, "not a string"),
    ],
)
def test_bad_inputs_are_named(rankings, relevant, k, error, fragment):
    with pytest.raises(error, match=fragment):
        mrr_at_k(rankings, relevant, k)


def test_reciprocal_ranks_are_per_query_and_average_to_the_mrr():
    assert reciprocal_ranks(RANKINGS, RELEVANT, 10) == pytest.approx([1 / 2, 1])
    assert sum(reciprocal_ranks(RANKINGS, RELEVANT, 1)) / 2 == pytest.approx(mrr_at_k(RANKINGS, RELEVANT, 1))


def test_the_paired_interval_holds_the_relative_change_and_is_zero_for_equal_systems():
    base = [1.0, 0.5, 0.0, 0.25] * 25
    assert paired_relative_interval(base, base) == (0.0, 0.0)
    low, high = paired_relative_interval(base, [v * 0.9 for v in base])
    assert low == pytest.approx(-0.1) and high == pytest.approx(-0.1)  # a uniform change has no spread
    noisy = [v if n % 2 else v * 0.5 for n, v in enumerate(base)]
    low, high = paired_relative_interval(base, noisy)
    assert low < sum(noisy) / sum(base) - 1 < high and high - low > 0.01
    with pytest.raises(ValueError, match="same queries"):
        paired_relative_interval(base, base[:-1])


def test_the_paired_difference_interval_is_exact_for_a_uniform_shift_and_holds_the_mean_difference():
    from evals.retrieval.ranking import paired_difference_interval

    base = [1.0, 0.5, 0.0, 0.25] * 25
    assert paired_difference_interval(base, base) == (0.0, 0.0)
    low, high = paired_difference_interval(base, [v + 0.1 for v in base])
    assert low == pytest.approx(0.1) and high == pytest.approx(0.1)  # every query moves alike: no spread
    noisy = [v + (0.2 if n % 2 else -0.1) for n, v in enumerate(base)]  # mean shift +0.05
    low, high = paired_difference_interval(base, noisy)
    # per-query differences +0.2 or -0.1, half each: a resampled mean is -0.1 + 0.3 p with p ~ Binomial(100, 1/2) / 100,
    # whose 2.5% and 97.5% points (p = 0.40, 0.60) give about [+0.02, +0.08]
    assert low == pytest.approx(0.02, abs=0.011) and high == pytest.approx(0.08, abs=0.011)
    with pytest.raises(ValueError, match="same queries"):
        paired_difference_interval(base, base[:-1])


def test_per_query_metrics_average_to_the_report_row():
    from evals.retrieval.ranking import per_query_metrics

    values = per_query_metrics(RANKINGS, RELEVANT, recall_ks=(1, 5), hits_ks=(3,))
    assert values["mrr@10"] == pytest.approx(reciprocal_ranks(RANKINGS, RELEVANT, 10))
    assert values["hits@3"] == [1.0, 1.0] and values["recall@1"] == [0.0, 1 / 3]  # q2: 1 of its 3 relevant ids at rank 1
    row = {**ranking_metrics(RANKINGS, RELEVANT, recall_ks=(1, 5)), "hits@3": hits_at_k(RANKINGS, RELEVANT, 3)}
    for name, per_query in values.items():
        assert sum(per_query) / len(per_query) == pytest.approx(row[name])
    with pytest.raises(ValueError, match="one of each per query"):
        per_query_metrics(RANKINGS, RELEVANT[:1])
