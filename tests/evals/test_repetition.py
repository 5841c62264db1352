import math

import pytest

from evals import diversity, ngram_counts, rep_n


def test_rep2_of_abab_by_hand():
    # bigrams: (a b) (b a) (a b) -> 2 unique of 3
    assert rep_n(["a b a b"], 2) == pytest.approx(100 / 3)
    assert rep_n(["a b a b"], 3) == 0.0  # (a b a) (b a b)
    assert rep_n(["a b a b"], 4) == 0.0


def test_diversity_is_product_of_rep_terms():
    result = diversity(["a b a b"])
    assert (result.rep2, result.rep3, result.rep4) == pytest.approx((100 / 3, 0.0, 0.0))
    assert result.diversity == pytest.approx(2 / 3)


def test_pooled_versus_per_text():
    texts = ["a b a b", "c c c c c"]  # (unique, total) bigrams: (2, 3) and (1, 4)
    assert rep_n(texts, 2) == pytest.approx(100 * (1 - 3 / 7))
    assert rep_n(texts, 2, average="per_text") == pytest.approx(100 * ((1 - 2 / 3) + (1 - 1 / 4)) / 2)


def test_unique_ngrams_are_counted_within_each_text():
    # the same bigram in two texts is unique in each, so nothing repeats
    assert rep_n(["x y", "x y"], 2) == 0.0


def test_token_lists_and_custom_tokenizer_match_whitespace_split():
    assert rep_n([[7, 8, 7, 8]], 2) == rep_n(["a b a b"], 2)
    assert rep_n(["abab"], 2, tokenizer=list) == rep_n(["a b a b"], 2)
    assert math.isnan(rep_n(["abab"], 2))  # one whitespace word: no bigram


def test_simctg_exact_drops_the_last_ngram():
    assert ngram_counts("a b a b".split(), 2) == (2, 3)
    assert ngram_counts("a b a b".split(), 2, simctg_exact=True) == (2, 2)
    assert rep_n(["a b a b"], 2, simctg_exact=True) == 0.0


def test_texts_shorter_than_n_are_skipped_and_all_short_is_nan():
    assert rep_n(["a b a b", "z"], 2) == pytest.approx(100 / 3)
    assert math.isnan(diversity(["a b"]).rep3)


def test_bad_inputs():
    with pytest.raises(TypeError, match="single str"):
        rep_n("a b a b", 2)
    with pytest.raises(ValueError, match="n must be"):
        rep_n(["a b"], 0)
    with pytest.raises(ValueError, match="average"):
        rep_n(["a b"], 2, average="macro")
