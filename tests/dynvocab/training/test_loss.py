import math

import pytest
import torch

from dynvocab import DynamicVocabLM
from dynvocab.training.batching import collate
from dynvocab.training.loss import LossWeights, aligned_kl, dynamic_vocab_loss, encode_phrase_set, weighted_total
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
    original = model.phrase_encoder.encode_all_prefixes
    model.phrase_encoder.encode_all_prefixes = lambda ids, mask: calls.append(ids.shape) or original(ids, mask)
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
