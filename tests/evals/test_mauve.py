import math
import sys

import numpy as np
import pytest
import torch

from evals import Features, causal_lm_features, mauve_score, paired_mauve_gain, sentence_embedding_features

TEXTS = ["the cat sat on a mat", "dog ran", "a big red dog", "it was blue and small"]
FAST = {"seeds": (0, 1), "kmeans_num_redo": 1, "kmeans_max_iter": 100}


def _disjoint_mauve(c: float) -> float:
    """MAUVE of distributions with disjoint supports: the area under ((1-w)^c, w^c) = c * B(c, c + 1)."""
    return c * math.gamma(c) * math.gamma(c + 1) / math.gamma(2 * c + 1)


def _blobs(n: int, centers: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    picks = rng.integers(len(centers), size=n)
    return centers[picks] + 0.05 * rng.standard_normal((n, centers.shape[1]))


@pytest.fixture
def samples():
    rng = np.random.default_rng(0)
    centers = 3 * rng.standard_normal((5, 8))
    return _blobs(100, centers, rng), _blobs(100, centers, rng), _blobs(100, centers + 100, rng)


def test_same_distribution_is_near_one(samples):
    pytest.importorskip("mauve")
    p, q, _ = samples
    assert mauve_score(p, p, **FAST).mauve == pytest.approx(1.0)
    same = mauve_score(p, q, **FAST)
    assert same.mauve > 0.9
    assert same.mauve_std >= 0 and len(same.scores) == 2


@pytest.mark.parametrize("scaling_factor", [2.0, 5.0])
def test_disjoint_distributions_hit_the_analytic_floor(samples, scaling_factor):
    pytest.importorskip("mauve")
    p, _, far = samples
    result = mauve_score(p, far, scaling_factor=scaling_factor, **FAST)
    # 25 mixture weights and trapezoids overshoot the integral slightly
    assert result.mauve == pytest.approx(_disjoint_mauve(scaling_factor), abs=0.01)
    assert result.mauve < 0.2


def test_result_records_the_settings(samples):
    pytest.importorskip("mauve")
    p, q, _ = samples
    result = mauve_score(Features(p, "toy", 32), Features(q, "toy", 32), num_buckets=7, **FAST)
    assert (result.featurizer, result.max_tokens, result.num_buckets) == ("toy", 32, 7)
    assert (result.num_p, result.num_q, result.seeds, result.scaling_factor) == (100, 100, (0, 1), 2.0)
    assert mauve_score(p, q, **FAST).num_buckets == 10  # "auto": n / 10


def test_bad_inputs(samples):
    pytest.importorskip("mauve")
    p, q, _ = samples
    with pytest.raises(ValueError, match="different featurizers"):
        mauve_score(Features(p, "a", 32), Features(q, "b", 32))
    with pytest.raises(ValueError, match="dim"):
        mauve_score(p, q[:, :4])
    with pytest.raises(ValueError, match="seeds"):
        mauve_score(p, q, seeds=())


def test_paired_gain_tells_a_better_system_from_chance(samples):
    pytest.importorskip("mauve")
    reference, system, far = samples
    worse = system.copy()
    worse[:40] = far[:40]  # the baseline writes off-distribution text at 40 of 100 prompts
    better = paired_mauve_gain(reference, system, worse, permutations=30)
    assert better.gain > 10 and better.p_value == pytest.approx(1 / 31)  # no swap reaches the observed gain
    assert better.null_low < 0 < better.null_high < better.gain and better.permutations == 30
    assert paired_mauve_gain(reference, worse, system, permutations=30).p_value == 1.0  # one-sided: worse is no gain
    same = paired_mauve_gain(reference, system, system, permutations=5)
    assert (same.gain, same.p_value, same.null_low, same.null_high) == (0.0, 1.0, 0.0, 0.0)


def test_paired_gain_refuses_unpaired_rows(samples):
    reference, system, _ = samples
    with pytest.raises(ValueError, match="pair row by row"):
        paired_mauve_gain(reference, system, system[:50])
    with pytest.raises(ValueError, match="permutations=0"):
        paired_mauve_gain(reference, system, system, permutations=0)


def test_missing_mauve_names_the_extra(monkeypatch, samples):
    monkeypatch.setitem(sys.modules, "mauve", None)
    with pytest.raises(ImportError, match=r"dynvocab\[evals\]"):
        mauve_score(samples[0], samples[1])


@pytest.mark.parametrize("side", ["left", "right"])
def test_causal_lm_features_take_the_last_real_token(tiny_lm, word_tokenizer, side):
    features = causal_lm_features(TEXTS, tiny_lm, word_tokenizer, batch_size=4, padding_side=side)
    assert features.values.shape == (4, 16) and features.values.dtype == np.float32
    for row, text in enumerate(TEXTS):
        ids = torch.tensor([word_tokenizer(text)["input_ids"]])
        with torch.no_grad():
            expected = tiny_lm(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
        torch.testing.assert_close(torch.from_numpy(features.values[row]), expected, atol=1e-4, rtol=1e-4)


def test_causal_lm_features_truncate_to_max_tokens(tiny_llama, word_tokenizer):
    cut = causal_lm_features(["the cat sat on a mat"], tiny_llama, word_tokenizer, max_tokens=2)
    short = causal_lm_features(["the cat"], tiny_llama, word_tokenizer, max_tokens=2)
    np.testing.assert_allclose(cut.values, short.values, atol=1e-5)
    assert cut.max_tokens == 2
    with pytest.raises(ValueError, match="no tokens"):
        causal_lm_features(["the", ""], tiny_llama, word_tokenizer)


def test_sentence_embedding_features_mean_pool(word_tokenizer):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(word_tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=4, intermediate_size=32
    )
    encoder = BertModel(config).eval()
    features = sentence_embedding_features(TEXTS, encoder, word_tokenizer, batch_size=4)
    assert features.values.shape == (4, 16)
    for row, text in enumerate(TEXTS):
        ids = torch.tensor([word_tokenizer(text)["input_ids"]])
        with torch.no_grad():
            expected = encoder(input_ids=ids).last_hidden_state[0].mean(0)
        torch.testing.assert_close(torch.from_numpy(features.values[row]), expected, atol=1e-4, rtol=1e-4)
