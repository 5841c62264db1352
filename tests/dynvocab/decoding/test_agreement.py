"""How phrase scores meet the LM's: agreement with its top-k tokens, its first-token mass, a decoding-time bias."""

import pytest
import torch

from dynvocab.decoding.agreement import FirstTokenMass, PhraseAgreement, PhraseBias
from tests.helpers import PhrasesAlwaysWin

V = 10
PHRASES = [(3, 4), (5, 6, 7), (3, 9)]


def test_phrases_whose_first_token_is_outside_the_lm_top_k_are_dropped():
    scores = torch.tensor([[0.0, 0, 0, 5, 4, 1, 0, 0, 0, 0, 2.0, 3.0, 1.0]])  # tokens 3 then 4 are the LM's best
    top1 = PhraseAgreement(1, V, PHRASES)(torch.zeros(1, 2, dtype=torch.long), scores.clone())
    assert top1[0, V:].tolist() == [2.0, float("-inf"), 1.0]
    assert torch.equal(top1[0, :V], scores[0, :V])
    top3 = PhraseAgreement(3, V, PHRASES)(torch.zeros(1, 2, dtype=torch.long), scores.clone())
    assert top3[0, V:].tolist() == [2.0, 3.0, 1.0]


def test_rows_are_judged_separately():
    scores = torch.zeros(2, V + 3)
    scores[0, 3], scores[1, 5] = 1.0, 1.0
    out = PhraseAgreement(1, V, PHRASES)(torch.zeros(2, 1, dtype=torch.long), scores)
    assert torch.isinf(out[0, V + 1]) and not torch.isinf(out[0, V])
    assert torch.isinf(out[1, V]) and not torch.isinf(out[1, V + 1])


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_top_k_is_refused(bad):
    with pytest.raises(ValueError, match="phrase_agreement_top_k must be a positive int"):
        PhraseAgreement(bad, V, PHRASES)


def test_generate_takes_the_agreement_setting(llama, tokenizer):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" of the United States"])

    model.scorer = PhrasesAlwaysWin()
    ids = tokenizer("Hello", return_tensors="pt").input_ids
    greedy = llama.generate(ids, max_new_tokens=3, do_sample=False)[0, 1:].tolist()
    agreed = model.generate(ids, max_new_tokens=3, do_sample=False, phrase_agreement_top_k=1)[0, 1:].tolist()
    first = tokenizer(" of", add_special_tokens=False).input_ids[0]
    assert agreed == greedy if greedy[0] != first else agreed[0] == model.vocab_size


def _group_probability(out: torch.Tensor, token: int) -> float:
    members = [token] + [V + i for i, ids in enumerate(PHRASES) if ids[0] == token]
    return float(out[0, members].exp().sum())


def test_first_token_mass_keeps_the_lm_next_token_distribution():
    scores = torch.tensor([[0.0, 1, 0, 2, 0.5, -1, 0, 3, 0, 0, 4.0, 0.5, 6.0]])  # phrases on tokens 3, 5, 3
    out = FirstTokenMass(V, PHRASES)(torch.zeros(1, 2, dtype=torch.long), scores.clone())
    lm = scores[0, :V].softmax(-1)
    for token in range(V):
        assert _group_probability(out, token) == pytest.approx(float(lm[token]), rel=1e-5)
    assert float(out[0].exp().sum()) == pytest.approx(1.0, rel=1e-5)
    # within a group the joint scores decide: phrase 2 over phrase 0 over token 3, by the same margins
    assert float(out[0, V + 2] - out[0, V]) == pytest.approx(2.0, rel=1e-5)
    assert float(out[0, V] - out[0, 3]) == pytest.approx(2.0, rel=1e-5)
    # a token that no phrase starts with keeps its LM log-probability
    assert float(out[0, 7]) == pytest.approx(float(lm[7].log()), rel=1e-5)


def test_first_token_mass_leaves_masked_phrases_and_banned_tokens_at_zero():
    scores = torch.tensor([[0.0, 1, 0, float("-inf"), 0.5, -1, 0, 3, 0, 0, 4.0, float("-inf"), 6.0]])
    out = FirstTokenMass(V, PHRASES)(torch.zeros(1, 2, dtype=torch.long), scores)
    assert torch.isinf(out[0, V + 1]) and out[0, V + 1] < 0  # masked by a guard before it: stays out
    assert torch.isinf(out[0, [3, V, V + 2]]).all()  # token 3 banned: the phrases that start with it go too
    assert float(out[0, 5]) == pytest.approx(float(scores[0, :V].softmax(-1)[5].log()), rel=1e-5)
    assert not torch.isnan(out).any()


def test_generate_takes_the_first_token_mass_setting(llama, tokenizer):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" of the United States"])
    model.scorer = PhrasesAlwaysWin()
    ids = tokenizer("Hello", return_tensors="pt").input_ids
    first = tokenizer(" of", add_special_tokens=False).input_ids[0]
    greedy = llama.generate(ids, max_new_tokens=1, do_sample=False)[0, -1].item()
    out = model.generate(ids, max_new_tokens=1, do_sample=False, phrase_first_token_mass=True)[0, -1].item()
    # the phrase always outscores " of", so it wins exactly where the LM's own greedy token is " of"
    assert out == (model.vocab_size if greedy == first else greedy)


def test_phrase_bias_shifts_phrases_only_and_keeps_masked_ones_out():
    scores = torch.tensor([[0.0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1.0, float("-inf"), -2.0]])
    out = PhraseBias(-1.5, V)(torch.zeros(1, 2, dtype=torch.long), scores.clone())
    assert torch.equal(out[0, :V], scores[0, :V])
    assert out[0, V:].tolist() == [-0.5, float("-inf"), -3.5]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", True])
def test_a_bias_that_is_not_a_finite_number_is_refused(bad):
    with pytest.raises(ValueError, match="phrase_bias must be a finite number"):
        PhraseBias(bad, V)


def test_generate_phrase_bias_decodes_as_the_configured_calibration_bias(llama, tokenizer):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" of the United States", " the history of", " New York City"])
    ids = tokenizer("Hello", return_tensors="pt").input_ids
    plain = model.generate(ids, max_new_tokens=4, do_sample=False)[0].tolist()
    biased = model.generate(ids, max_new_tokens=4, do_sample=False, phrase_bias=60.0)[0].tolist()
    assert max(biased) >= model.vocab_size and biased != plain  # a bias this large makes phrases win
    model.dynvocab_config.phrase_score_bias = 60.0
    assert model.generate(ids, max_new_tokens=4, do_sample=False)[0].tolist() == biased
