"""The metrics on the real offline models (SmolLM2-135M, all-MiniLM-L6-v2); skipped when the assets are not fetched."""

import numpy as np
import pytest

from evals import causal_lm_features, minilm_features, perplexity

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is Paris, a city known for the Eiffel Tower.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "Photosynthesis converts light energy into chemical energy in plants.",
]


@pytest.fixture(scope="module")
def smollm2():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dynvocab.data import assets

    try:
        folder = assets.smollm2_dir()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), AutoTokenizer.from_pretrained(folder)


def test_smollm2_perplexity_is_padding_invariant_and_sensible(smollm2):
    model, tokenizer = smollm2
    left = perplexity(model, tokenizer, TEXTS, padding_side="left")
    right = perplexity(model, tokenizer, TEXTS, padding_side="right")
    assert left.perplexity == pytest.approx(right.perplexity, rel=1e-4)
    assert 1.0 < left.perplexity < 1000.0
    prefix = ["The capital of France is"]
    assert perplexity(model, tokenizer, [" Paris."], prefixes=prefix).perplexity < perplexity(
        model, tokenizer, [" Banana."], prefixes=prefix
    ).perplexity


def test_smollm2_features_are_padding_invariant(smollm2):
    model, tokenizer = smollm2
    left = causal_lm_features(TEXTS, model, tokenizer, padding_side="left", max_tokens=64)
    right = causal_lm_features(TEXTS, model, tokenizer, padding_side="right", max_tokens=64)
    assert left.values.shape == (3, model.config.hidden_size)
    np.testing.assert_allclose(left.values, right.values, atol=1e-3, rtol=1e-3)


def test_minilm_features():
    try:
        features = minilm_features(TEXTS + ["Paris is the capital of France."])
    except FileNotFoundError as err:
        pytest.skip(str(err))
    values = features.values / np.linalg.norm(features.values, axis=1, keepdims=True)
    assert values.shape == (4, 384)
    # the paraphrase is closer to the Paris sentence than to the others
    sims = values[:3] @ values[3]
    assert sims.argmax() == 0
