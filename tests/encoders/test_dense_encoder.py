from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from encoders import DenseEncoder, DenseEncoderConfig, pool

TEXTS = [
    "the cat sat on the mat",
    "dogs",
    "the eiffel tower is in paris",
    "money in the bank",
    "a dog and a cat run in the city of paris on the river",
]


def test_mean_pool_matches_hand_computation():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0]])
    expected = torch.stack([
        (hidden[0, 0] + hidden[0, 1] + hidden[0, 2]) / 3,
        (hidden[1, 1] + hidden[1, 2]) / 2,
    ])
    torch.testing.assert_close(pool(hidden, mask, "mean"), expected)


def test_cls_pool_takes_first_unmasked_token_even_with_left_padding():
    hidden = torch.randn(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 1, 1]])
    torch.testing.assert_close(pool(hidden, mask, "cls"), torch.stack([hidden[0, 0], hidden[1, 2]]))


def test_pool_rejects_unknown_mode():
    with pytest.raises(ValueError, match="pooling='max'"):
        pool(torch.zeros(1, 2, 3), torch.ones(1, 2), "max")


def _by_hand(model, tokenizer, text: str) -> np.ndarray:
    """Mean of the token states of ``text`` alone (no padding), L2-normalised."""
    batch = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state[0]
    vector = hidden.mean(dim=0)
    return (vector / vector.norm()).numpy()


def test_encode_matches_hand_computation_in_input_order(tiny_bert, tiny_tokenizer):
    encoder = DenseEncoder(tiny_bert, tiny_tokenizer)
    vectors = encoder.encode(TEXTS, batch_size=2)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 16)
    expected = np.stack([_by_hand(tiny_bert, tiny_tokenizer, text) for text in TEXTS])
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_encode_is_independent_of_batch_size(tiny_bert, tiny_tokenizer):
    encoder = DenseEncoder(tiny_bert, tiny_tokenizer)
    np.testing.assert_allclose(encoder.encode(TEXTS, batch_size=1), encoder.encode(TEXTS, batch_size=32), atol=1e-5)


def test_cls_without_normalisation(tiny_bert, tiny_tokenizer):
    encoder = DenseEncoder(tiny_bert, tiny_tokenizer, pooling="cls", normalize=False)
    batch = tiny_tokenizer([TEXTS[0]], return_tensors="pt")
    with torch.no_grad():
        expected = tiny_bert(**batch).last_hidden_state[0, 0].numpy()
    np.testing.assert_allclose(encoder.encode([TEXTS[0]])[0], expected, atol=1e-5)


def test_truncation_to_max_length(tiny_bert, tiny_tokenizer):
    long_text = " ".join(["cat"] * 100)
    encoder = DenseEncoder(tiny_bert, tiny_tokenizer, max_length=8)
    short = DenseEncoder(tiny_bert, tiny_tokenizer, max_length=8).encode([" ".join(["cat"] * 6)])
    np.testing.assert_allclose(encoder.encode([long_text]), short, atol=1e-5)  # [CLS] + 6 cats + [SEP] = 8


def test_properties_and_edge_cases(tiny_bert, tiny_tokenizer):
    encoder = DenseEncoder(tiny_bert, tiny_tokenizer)
    assert encoder.dim == 16
    assert encoder.name == "BertModel"  # a model built from a config has no name_or_path
    assert encoder.config == DenseEncoderConfig(name="BertModel")
    assert encoder.encode([]).shape == (0, 16)
    assert encoder.encode("the cat").shape == (1, 16)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        encoder.encode(["the cat", 3])
    with pytest.raises(ValueError, match="batch_size=0"):
        encoder.encode(["the cat"], batch_size=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"pooling": "max"}, "pooling='max'"), ({"max_length": 0}, "max_length=0")],
)
def test_bad_settings_raise(tiny_bert, tiny_tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        DenseEncoder(tiny_bert, tiny_tokenizer, **kwargs)


def test_model_type_is_checked():
    with pytest.raises(TypeError, match="model_name_or_path"):
        DenseEncoder(42)


def test_progress_bar_follows_logging_level(tiny_bert, tiny_tokenizer, capsys):
    encoder = DenseEncoder(tiny_bert, tiny_tokenizer)
    encoder.encode(TEXTS)
    assert "encode" not in capsys.readouterr().err
    logger = logging.getLogger("encoders.dense")
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        encoder.encode(TEXTS)
    finally:
        logger.setLevel(old)
    assert "encode" in capsys.readouterr().err
    encoder.encode(TEXTS, show_progress_bar=True)
    assert "encode" in capsys.readouterr().err


def test_loads_from_a_saved_folder(tmp_path, tiny_bert, tiny_tokenizer):
    tiny_bert.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    encoder = DenseEncoder(str(tmp_path))
    assert encoder.name == str(tmp_path)
    np.testing.assert_allclose(encoder.encode(TEXTS), DenseEncoder(tiny_bert, tiny_tokenizer).encode(TEXTS), atol=1e-5)


@pytest.mark.slow
def test_real_minilm_ranks_paraphrases_first():
    minilm = pytest.importorskip("dynvocab.data.assets").minilm_dir()
    encoder = DenseEncoder(str(minilm))
    vectors = encoder.encode(["A man is eating food.", "A man is eating a meal.", "The stock market fell today."])
    assert vectors.shape == (3, 384)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3


def test_bfloat16_autocast_stays_close_to_fp32(tiny_bert, tiny_tokenizer):
    exact = DenseEncoder(tiny_bert, tiny_tokenizer).encode(TEXTS)
    fast = DenseEncoder(tiny_bert, tiny_tokenizer, amp_dtype=torch.bfloat16)
    assert fast.config.amp_dtype == "bfloat16"
    vectors = fast.encode(TEXTS)
    assert vectors.dtype == np.float32
    assert np.min(np.sum(exact * vectors, axis=1)) > 0.99
    with pytest.raises(ValueError, match="amp_dtype='int8'"):
        DenseEncoder(tiny_bert, tiny_tokenizer, amp_dtype="int8")
