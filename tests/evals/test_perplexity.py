import math

import pytest
import torch

from evals import pair_logprobs, perplexity, perplexity_from_logprobs, token_logprobs

TEXTS = ["the cat sat on a mat", "dog ran", "a big red dog and a small blue cat it was"]
PREFIXES = ["it was the", None, "the dog ran to"]


def _by_hand(model, tokenizer, texts, prefixes):
    """Sum of log p(token | everything before) over each text's tokens, one unpadded sequence at a time."""
    total, count, per_text = 0.0, 0, []
    for text, prefix in zip(texts, prefixes):
        context = tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else [tokenizer.bos_token_id]
        target = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([context + target])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
        scored = [logprobs[len(context) + i - 1, tok].item() for i, tok in enumerate(target)]
        per_text.append(scored)
        total += sum(scored)
        count += len(scored)
    return math.exp(-total / count), count, per_text


@pytest.mark.parametrize("prefixes", [None, PREFIXES])
@pytest.mark.parametrize("side", ["left", "right"])
def test_matches_hand_computation_with_left_and_right_padding(tiny_lm, word_tokenizer, prefixes, side):
    expected, count, _ = _by_hand(tiny_lm, word_tokenizer, TEXTS, prefixes or [None] * 3)
    result = perplexity(tiny_lm, word_tokenizer, TEXTS, prefixes=prefixes, batch_size=3, padding_side=side)
    assert result.num_tokens == count == sum(len(t.split()) for t in TEXTS)
    assert result.num_texts == 3
    assert result.perplexity == pytest.approx(expected, rel=1e-4)
    # the tiny model is far from uniform, so this is not a trivial match
    assert abs(math.log(expected) - math.log(len(word_tokenizer))) > 0.1


def test_left_and_right_padding_give_the_same_logprobs(tiny_lm, word_tokenizer):
    left = token_logprobs(tiny_lm, word_tokenizer, TEXTS, prefixes=PREFIXES, padding_side="left")
    right = token_logprobs(tiny_lm, word_tokenizer, TEXTS, prefixes=PREFIXES, padding_side="right")
    _, _, hand = _by_hand(tiny_lm, word_tokenizer, TEXTS, PREFIXES)
    for a, b, c in zip(left, right, hand):
        assert a.shape == (len(c),)
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.from_numpy(a), torch.tensor(c, dtype=torch.float64), atol=1e-5, rtol=0)


def test_batch_size_does_not_change_the_result(tiny_llama, word_tokenizer):
    one = perplexity(tiny_llama, word_tokenizer, TEXTS, batch_size=1)
    many = perplexity(tiny_llama, word_tokenizer, TEXTS, batch_size=3)
    assert one.perplexity == pytest.approx(many.perplexity, rel=1e-5)


def test_without_bos_the_first_token_is_context_only(tiny_llama, word_tokenizer):
    result = perplexity(tiny_llama, word_tokenizer, TEXTS, prepend_bos=False)
    assert result.num_tokens == sum(len(t.split()) - 1 for t in TEXTS)


def test_max_length_cuts_prefix_from_the_left(tiny_llama, word_tokenizer):
    full = token_logprobs(tiny_llama, word_tokenizer, ["on a mat"], prefixes=["sat"])
    cut = token_logprobs(tiny_llama, word_tokenizer, ["on a mat"], prefixes=["the cat sat"], max_length=4)
    assert cut[0].shape == (3,)
    torch.testing.assert_close(torch.from_numpy(cut[0]), torch.from_numpy(full[0]), atol=1e-5, rtol=0)


def test_aggregation_by_hand():
    result = perplexity_from_logprobs([[math.log(0.5), math.log(0.25)], [], [math.log(0.5)]])
    assert result.num_tokens == 3 and result.num_texts == 2
    assert result.total_nll == pytest.approx(4 * math.log(2))
    assert result.perplexity == pytest.approx(2 ** (4 / 3))
    assert result.mean_text_perplexity == pytest.approx((2**1.5 + 2) / 2)
    assert result.mean_tokens == pytest.approx(1.5)


def test_training_flag_is_restored(tiny_llama, word_tokenizer):
    tiny_llama.train()
    perplexity(tiny_llama, word_tokenizer, TEXTS[:1])
    assert tiny_llama.training


def test_bad_inputs(tiny_llama, word_tokenizer):
    with pytest.raises(ValueError, match="one prefix per text"):
        perplexity(tiny_llama, word_tokenizer, TEXTS, prefixes=["a"])
    with pytest.raises(TypeError, match="single str"):
        perplexity(tiny_llama, word_tokenizer, "the cat")
    with pytest.raises(ValueError, match="padding_side"):
        perplexity(tiny_llama, word_tokenizer, TEXTS, padding_side="middle")
    with pytest.raises(ValueError, match="no scored tokens"):
        perplexity(tiny_llama, word_tokenizer, [""])


def test_token_ids_score_as_their_strings_do(tiny_lm, word_tokenizer):
    ids = lambda text: word_tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    pairs = [(ids(prefix), ids(text)) for text, prefix in zip(TEXTS, PREFIXES) if prefix]
    by_ids = pair_logprobs(tiny_lm, word_tokenizer, pairs, batch_size=2, padding_side="left")
    _, _, hand = _by_hand(tiny_lm, word_tokenizer, [TEXTS[0], TEXTS[2]], [PREFIXES[0], PREFIXES[2]])
    for a, c in zip(by_ids, hand):
        torch.testing.assert_close(torch.from_numpy(a), torch.tensor(c, dtype=torch.float64), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        pair_logprobs(tiny_lm, word_tokenizer, pairs, batch_size=0)
