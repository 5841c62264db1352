"""Verified decoding: phrases are kept only as far as the LM agrees with their tokens."""

import pytest
import torch
from transformers import LogitsProcessorList

from dynvocab import DynamicVocabLM
from dynvocab.decoding.agreement import PhraseAgreement
from dynvocab.decoding.verification import _count_agreeing, _processed_rows, generate_verified
from tests.helpers import PhrasesAlwaysWin


def _spell(model, ids):
    table = model.phrase_table
    return [t for i in ids for t in (table.token_ids[i - model.vocab_size] if i >= model.vocab_size else (i,))]


@pytest.fixture
def model(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.scorer = PhrasesAlwaysWin()
    return model


def test_accepting_only_the_greedy_token_writes_the_bare_lm_greedy_text(model, llama, tokenizer):
    prompt = tokenizer("The city of", return_tensors="pt").input_ids
    bare = llama.generate(prompt, max_new_tokens=24, do_sample=False)[0, prompt.shape[1] :].tolist()
    # first (so it wins the tie): a phrase that starts as the LM would and then leaves it, so it is cut;
    # then phrases cut from the bare LM's own continuation
    phrases = [tokenizer.decode(bare[:1]) + " zebra crossing"] + [tokenizer.decode(bare[i : i + 3]) for i in range(0, 18, 3)]
    model.set_phrases(phrases, mid_sentence_forms=False)
    agreement = LogitsProcessorList([PhraseAgreement(1, model.vocab_size, model.phrase_table.token_ids)])
    out = generate_verified(model, prompt, 12, accept_top_k=1, logits_processor=agreement)
    new = out.sequences[0, prompt.shape[1] :].tolist()
    spelled = _spell(model, new)
    assert spelled == bare[: len(spelled)]  # the cut phrase's rejected tokens left the cache
    assert out.cut >= 1 and out.steps <= 12 and len(spelled) > out.steps  # phrases were kept: fewer steps than tokens
    assert any(i >= model.vocab_size for i in new)


def test_sampled_verified_decoding_is_seeded_and_its_narrowest_nucleus_is_greedy(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()  # its own phrase scores: no ties to break
    prompt = tokenizer("The city of", return_tensors="pt").input_ids
    model.set_phrases([" the river", " of the old town"], mid_sentence_forms=False)

    def sampled(seed: int, top_p: float = 0.9) -> list[int]:
        torch.manual_seed(seed)
        return generate_verified(model, prompt, 10, do_sample=True, top_p=top_p).sequences[0].tolist()

    assert sampled(0) == sampled(0) and len({tuple(sampled(seed)) for seed in range(4)}) > 1
    greedy = generate_verified(model, prompt, 10).sequences[0].tolist()
    assert sampled(1, top_p=1e-9) == sampled(2, top_p=1e-9) == greedy


def test_a_kept_prefix_is_emitted_as_a_phrase_of_the_row_or_as_tokens(model):
    from dynvocab.decoding.verification import _as_ids

    model.set_phrases([" zebra crossing at the old bridge", " zebra crossing"], mid_sentence_forms=False)
    table, vocab = model.phrase_table, model.vocab_size
    long, short = table.token_ids
    assert _as_ids(list(long), vocab, table, vocab, None) == [vocab]
    assert _as_ids(list(short), None, table, vocab, None) == [vocab + 1]
    assert _as_ids(list(short), None, table, vocab, torch.tensor([[True, False]])) == list(short)
    beyond = long[: len(short) + 1]  # a prefix that is no phrase
    assert _as_ids(list(beyond), None, table, vocab, None) == list(beyond)


def test_accepted_prefix_rule():
    logits = torch.full((4, 10), -1.0)
    logits[0, 5], logits[1, 6], logits[2, 1] = 3.0, 3.0, 3.0  # after t0 the LM wants 5, after t1 wants 6, after t2 wants 1

    def kept(tokens):
        rows = _processed_rows(logits, tokens, LogitsProcessorList(), torch.tensor([[0]]))
        return 1 + _count_agreeing(rows, tokens, lambda row, token: token == int(row.argmax()))

    assert kept([9, 5, 6, 7]) == 3
    assert kept([9, 4, 6, 7]) == 1
    assert kept([9, 5, 6, 1]) == 4


def test_bad_arguments_are_refused(model, tokenizer):
    ids = tokenizer(["a", "b"], return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="decodes one prompt"):
        generate_verified(model, ids, 2)
    with pytest.raises(ValueError, match="accept_top_k must be a positive int"):
        generate_verified(model, ids[:1], 2, accept_top_k=0)
