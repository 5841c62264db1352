import math

import pytest
import torch

from dynvocab import DynamicVocabLM
from dynvocab.training.collate import collate
from dynvocab.training.loss import (
    LossWeights,
    aligned_kl,
    dynamic_vocab_loss,
    encode_phrase_set,
    next_item_loss,
    term_counts,
    weighted_total,
)
from dynvocab.training.samples import MixedSample

V = 10


def test_collate_builds_aligned_views():
    samples = [MixedSample([1, 2, 3, 4, 5, 6], [(1, 3)]), MixedSample([7, 8, 9], [])]
    batch = collate(samples, negatives=[(2, 3, 4), (2, 3)], vocab_size=V)
    assert batch.phrases == [(2, 3), (2, 3, 4)]
    assert batch.mixed_ids[0].tolist() == [1, V + 0, 4, 5, 6]
    assert batch.sigma[0].tolist() == [0, 2, 3, 4, 5]
    assert batch.mixed_mask[1].tolist() == [1, 1, 1, 0, 0]
    assert batch.token_ids[1, :3].tolist() == [7, 8, 9]


def test_without_in_batch_a_row_sees_only_its_own_golds():
    samples = [MixedSample([1, 2, 3, 4], [(0, 2)]), MixedSample([5, 6, 7, 8], [(2, 4)])]
    batch = collate(samples, negatives=[(1, 2, 3)], vocab_size=V, in_batch=False)
    assert batch.phrase_mask.tolist() == [[True, False, True], [False, True, True]]


def test_kl_compares_a_phrase_with_its_last_token():
    samples = [MixedSample([1, 2, 3, 4], [(1, 3)])]
    batch = collate(samples, negatives=[], vocab_size=4)
    token_logits = torch.zeros(1, 4, 4)
    token_logits[0, 2] = torch.tensor([0.0, 0.0, 0.0, math.log(3.0)])  # after "1 2 3": p = (1/6, 1/6, 1/6, 1/2)
    mixed_logits = torch.zeros(1, 3, 5)  # V=4 tokens + 1 phrase; the phrase column must be ignored
    mixed_logits[0, :, 4] = 7.0
    kl = aligned_kl(mixed_logits, token_logits, batch, vocab_size=4)
    # positions 0 (token 1 -> sigma 0) and 1 (phrase -> sigma 2) count; position 2 is the last item
    p = torch.tensor([1 / 6, 1 / 6, 1 / 6, 1 / 2])
    expected = (p * (p / 0.25).log()).sum() / 2
    torch.testing.assert_close(kl, expected)


def test_phrase_set_encoding_uses_one_pass_per_prefix_group(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    phrases = [(5, 6, 7), (5, 6), (8, 9), (5, 6, 7, 8)]
    calls = []
    original = model.phrase_encoder.encode_prefixes
    model.phrase_encoder.encode_prefixes = lambda ids, mask, *at: calls.append(ids.shape) or original(ids, mask, *at)
    with torch.no_grad():
        vec_in, vec_out = encode_phrase_set(model, phrases)
        ref_in, ref_out = model.phrase_encoder.encode_ids(phrases)
    assert calls == [torch.Size([2, 4])]
    torch.testing.assert_close(vec_out, ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(vec_in, ref_in, rtol=1e-5, atol=1e-6)


def test_frozen_lm_gets_no_gradient_but_the_encoder_does(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer)
    model.lm.requires_grad_(False)
    batch = collate([MixedSample(list(range(100, 120)), [(3, 6), (12, 14)])], negatives=[(103, 104)], vocab_size=model.vocab_size)
    terms = dynamic_vocab_loss(model, batch, train_lm=False)
    terms["loss"].backward()
    assert all(p.grad is None for p in model.lm.parameters())
    assert model.phrase_encoder.head[0].weight.grad.abs().sum() > 0
    assert set(terms) == {"loss", "phrase", "token", "kl"}


@pytest.mark.parametrize("train_lm", [True, False])
def test_the_total_loss_weighs_each_term_and_drops_the_token_term_for_a_frozen_lm(train_lm):
    terms = {"phrase": torch.tensor(1.5), "token": torch.tensor(2.0), "kl": torch.tensor(0.25)}
    total = weighted_total(terms, LossWeights(phrase=2.0, token=3.0, kl=5.0), train_lm)
    expected = 2.0 * 1.5 + (3.0 * 2.0 if train_lm else 0.0) + 5.0 * 0.25
    assert float(total) == pytest.approx(expected)


def test_next_item_loss_scores_each_next_id_and_ignores_padding():
    ids = torch.tensor([[1, 2, 3], [3, 1, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    logits = torch.full((2, 3, 4), 5.0)  # the last position and padding: anything
    for row, position, target in [(0, 0, 2), (0, 1, 3), (1, 0, 1)]:  # each next id gets p = 3 / (3 + 1 + 1 + 1)
        logits[row, position] = 0.0
        logits[row, position, target] = math.log(3.0)
    logits[1, 1] = torch.tensor([-9.0, 9.0, 9.0, 9.0])  # predicts the padding id 0 badly: must not count
    assert float(next_item_loss(logits, ids, mask)) == pytest.approx(math.log(2.0))


def test_kl_skips_padding_and_the_last_item_of_each_row():
    samples = [MixedSample([1, 2, 3, 0], [(1, 3)]), MixedSample([1, 2], [])]  # mixed rows [1, P0, 0] and [1, 2, pad]
    batch = collate(samples, negatives=[], vocab_size=4)
    token_logits = torch.zeros(2, 4, 4)
    token_logits[0, 2] = torch.tensor([0.0, 0.0, 0.0, math.log(3.0)])  # after "1 2 3": p = (1/6, 1/6, 1/6, 1/2)
    token_logits[1, 1:] = torch.tensor([9.0, 0.0, 0.0, 0.0])  # after row 1's last token, and padding: no next item
    mixed_logits = torch.zeros(2, 3, 5)
    mixed_logits[1, 1:, :4] = torch.tensor([0.0, 0.0, 0.0, 9.0])
    kl = aligned_kl(mixed_logits, token_logits, batch, vocab_size=4)
    # three positions count: row 0 at 0 and 1 (the phrase, against p), row 1 at 0; all but one agree exactly
    p = torch.tensor([1 / 6, 1 / 6, 1 / 6, 1 / 2])
    torch.testing.assert_close(kl, (p * (p / 0.25).log()).sum() / 3)


def test_term_counts_are_the_positions_that_have_a_next_item():
    samples = [MixedSample([1, 2, 3, 4, 5, 6], [(1, 3)]), MixedSample([7, 8, 9], [])]
    counts = term_counts(collate(samples, negatives=[], vocab_size=V))
    # mixed rows have 5 and 3 items, token rows 6 and 3 tokens
    assert {name: int(count) for name, count in counts.items()} == {"phrase": 4 + 2, "token": 5 + 2, "kl": 4 + 2}


def _two_rows(model, in_batch=True):
    samples = [MixedSample(list(range(100, 110)), [(2, 4)]), MixedSample(list(range(200, 210)), [(5, 8)])]
    return collate(samples, negatives=[(103, 104, 105)], vocab_size=model.vocab_size, in_batch=in_batch)


def test_by_default_the_lm_trains_on_all_three_terms_and_a_frozen_one_keeps_no_graph(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer)
    terms = dynamic_vocab_loss(model, _two_rows(model))
    loss, phrase, token, kl = (float(terms[name].detach()) for name in ("loss", "phrase", "token", "kl"))
    assert loss == pytest.approx(phrase + token + kl)
    assert terms["token"].requires_grad
    frozen = dynamic_vocab_loss(model, _two_rows(model), train_lm=False)
    loss, phrase, kl = (float(frozen[name].detach()) for name in ("loss", "phrase", "kl"))
    assert loss == pytest.approx(phrase + kl)
    assert not frozen["token"].requires_grad  # the token view ran without autograd, though the LM's weights need grad


def test_without_in_batch_negatives_a_row_competes_only_with_its_own_phrases(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    with torch.no_grad():
        shared = dynamic_vocab_loss(model, _two_rows(model, in_batch=True))
        own = dynamic_vocab_loss(model, _two_rows(model, in_batch=False))
    # fewer phrases in each row's softmax: every gold id gets more probability, the token view is the same
    assert float(own["phrase"]) < float(shared["phrase"])
    assert float(own["token"]) == float(shared["token"])


def test_weighted_total_adds_the_terms_each_objective_has():
    terms = {name: torch.tensor(value) for name, value in (("phrase", 1.0), ("token", 2.0), ("kl", 3.0), ("distill", 4.0))}
    weights = LossWeights(phrase=1.0, token=1.0, kl=1.0, distill=0.5)
    assert float(weighted_total(terms, weights, train_lm=True)) == 1 + 2 + 3 + 2
    readback = {name: terms[name] for name in ("phrase", "token", "distill")}  # token read-back: no L_kl
    assert float(weighted_total(readback, weights, train_lm=False)) == 1 + 2
    assert float(weighted_total(readback, LossWeights(distill=0.0), train_lm=True)) == 1 + 2
