"""ROUGE against the author's continuation and paired bootstrap intervals."""

import pytest

from evals.closeness import paired_bootstrap, rouge_scores


def test_rouge_scores_each_text_against_its_reference():
    scores = rouge_scores(["the cat sat on the mat", "dogs run"], ["the cat lay on a mat", "dogs run"])
    assert scores["rouge1"][0] == pytest.approx(100 * 4 / 6) and scores["rouge2"][0] == pytest.approx(20.0)
    assert scores["rouge1"][1] == scores["rouge2"][1] == scores["rougeL"][1] == 100.0
    with pytest.raises(ValueError, match="one reference per text"):
        rouge_scores(["a"], [])


def test_paired_bootstrap_centres_on_the_mean_difference_and_narrows_with_agreement():
    same = paired_bootstrap([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0)
    shifted = paired_bootstrap([2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0])  # the same shift on every prompt
    assert shifted.mean == shifted.low == shifted.high == 1.0
    mixed = paired_bootstrap([3.0, 0.0, 2.0, 1.0, 4.0, 0.0], [0.0, 2.0, 1.0, 1.0, 0.0, 3.0])
    assert mixed.low < mixed.mean < mixed.high and mixed.low < 0 < mixed.high
    assert mixed.cell().startswith("+0.50 [")
    with pytest.raises(ValueError, match="equal, non-empty"):
        paired_bootstrap([1.0], [1.0, 2.0])


def test_prompts_of_one_document_are_resampled_together():
    per_document = [3.0, -1.0, 2.0, 0.0, 4.0, -2.0]
    twice = [d for d in per_document for _ in range(2)]  # two windows of each document, alike
    documents = [f"doc{i}" for i in range(6) for _ in range(2)]
    clustered = paired_bootstrap(twice, [0.0] * 12, groups=documents)
    assert clustered == paired_bootstrap(per_document, [0.0] * 6)  # a document is drawn with both its prompts
    independent = paired_bootstrap(twice, [0.0] * 12)  # as if the 12 prompts were unrelated: too narrow
    assert independent.mean == clustered.mean and independent.high - independent.low < clustered.high - clustered.low
    uneven = paired_bootstrap([1.0, 1.0, 1.0, 5.0], [0.0] * 4, groups=["a", "a", "a", "b"])
    assert uneven.mean == 2.0 and uneven.low == 1.0 and uneven.high == 5.0  # a's draws weigh its three prompts
    with pytest.raises(ValueError, match="one label per prompt"):
        paired_bootstrap([1.0, 2.0], [1.0, 2.0], groups=["a"])
