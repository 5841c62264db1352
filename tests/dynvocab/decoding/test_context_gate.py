"""The left-context gate: a phrase competes only where the text ends as its source document does before it."""

import pytest
import torch

from dynvocab.decoding.context_gate import PhraseContextGate, context_size, left_contexts, phrase_starts, spelled_tail
from tests.helpers import PhrasesAlwaysWin

V = 10
PHRASES = [(3, 4), (5, 6, 7), (3, 9)]


def test_left_contexts_records_every_place_a_phrase_follows_n_tokens():
    documents = [[1, 2, 3, 4, 8], [2, 2, 3, 9, 1, 2, 5, 6, 7], [3, 4, 0]]
    contexts = left_contexts(documents, PHRASES, 2)
    assert contexts == {(1, 2): {(3, 4), (5, 6, 7)}, (2, 2): {(3, 9)}}  # (3, 4) at the start of doc 3: no context
    assert left_contexts(documents, PHRASES, 1) == {(2,): {(3, 4), (3, 9), (5, 6, 7)}}


def test_phrase_starts_finds_every_occurrence_with_its_document_and_position():
    documents = [[3, 4, 3, 9], [5, 6, 7, 5, 6], [1]]
    assert sorted(phrase_starts(documents, PHRASES + [(3, 4, 3)])) == [
        (0, 0, (3, 4)), (0, 0, (3, 4, 3)), (0, 2, (3, 9)), (1, 0, (5, 6, 7))]  # (5, 6) at the end is no phrase
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        list(phrase_starts(documents, [(3,)]))


def test_left_contexts_of_one_token():
    contexts = left_contexts([[1, 3, 4], [8, 3, 9], [1, 5, 6, 7]], PHRASES, 1)
    assert contexts == {(1,): {(3, 4), (5, 6, 7)}, (8,): {(3, 9)}}


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_a_context_of_no_tokens_is_refused(bad):
    with pytest.raises(ValueError, match="at least 1 token"):
        left_contexts([[1, 2]], PHRASES, bad)


def test_a_phrase_of_one_token_is_refused():
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        left_contexts([[1, 2, 3]], [(3,), (1, 2)], 1)


def test_context_size_needs_one_length_of_token_tuples():
    assert context_size({(1, 2): [(3, 4)], (5, 6): []}) == 2
    for bad in ({(1, 2): [], (3,): []}, {"ab": []}, {(): []}):
        with pytest.raises(ValueError, match="tuples of n token ids"):
            context_size(bad)


def test_the_tail_spells_emitted_phrases_as_their_tokens():
    assert spelled_tail([0, 1, V + 1], 2, V, PHRASES) == (6, 7)
    assert spelled_tail([0, 1, V + 1], 4, V, PHRASES) == (1, 5, 6, 7)
    assert spelled_tail([V + 0, 2], 2, V, PHRASES) == (4, 2)


def test_only_phrases_seen_after_the_text_tail_keep_their_scores():
    gate = PhraseContextGate([{(1, 2): torch.tensor([0, 2]), (6, 7): torch.tensor([1])}], V, PHRASES)
    scores = torch.arange(2 * (V + 3), dtype=torch.float).reshape(2, V + 3)
    out = gate(torch.tensor([[0, 1, 2], [0, 0, V + 1]]), scores.clone())
    assert torch.equal(out[:, :V], scores[:, :V])  # tokens untouched
    assert out[0, V:].tolist() == [scores[0, V].item(), float("-inf"), scores[0, V + 2].item()]
    assert out[1, V:].tolist() == [float("-inf"), scores[1, V + 1].item(), float("-inf")]  # tail (6, 7) via phrase 1


def test_each_prompt_has_its_own_contexts_and_its_beams_follow_it():
    gate = PhraseContextGate([{(1,): torch.tensor([0])}, {(1,): torch.tensor([1])}], V, PHRASES)
    out = gate(torch.ones(4, 2, dtype=torch.long), torch.zeros(4, V + 3))  # 2 prompts x 2 beams
    assert torch.isfinite(out[:, V:]).tolist() == [[True, False, False]] * 2 + [[False, True, False]] * 2
    with pytest.raises(ValueError, match="one mapping per prompt"):
        gate(torch.ones(3, 2, dtype=torch.long), torch.zeros(3, V + 3))


def test_prompts_may_gate_on_contexts_of_different_lengths_or_not_at_all():
    gate = PhraseContextGate([{(1, 2): torch.tensor([0])}, {(2,): torch.tensor([1])}, None, {}], V, PHRASES)
    out = gate(torch.tensor([[0, 1, 2]] * 4), torch.zeros(4, V + 3))
    assert torch.isfinite(out[:, V:]).tolist() == [[True, False, False], [False, True, False], [True] * 3, [False] * 3]


def test_generate_emits_a_phrase_only_after_its_context(llama, tokenizer):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" New York City"])
    model.scorer = PhrasesAlwaysWin()
    phrase = tuple(tokenizer(" New York City", add_special_tokens=False).input_ids)
    ids = tokenizer("I moved to", return_tensors="pt").input_ids
    tail = tuple(ids[0, -2:].tolist())
    elsewhere = model.generate(ids, max_new_tokens=1, do_sample=False, phrase_contexts={(1, 2): [phrase]})
    assert elsewhere[0, -1].item() < model.vocab_size  # the text does not end with (1, 2): the phrase cannot win
    here = model.generate(ids, max_new_tokens=1, do_sample=False, phrase_contexts={tail: [phrase]})
    assert here[0, -1].item() == model.vocab_size
    unknown = model.generate(ids, max_new_tokens=1, do_sample=False, phrase_contexts={tail: [(7, 7)]})
    assert unknown[0, -1].item() < model.vocab_size  # a phrase not in the table is ignored, the table's is gated


def test_generate_takes_one_context_mapping_per_prompt(llama, tokenizer):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([[" New York City"], [" New York City"]])
    model.scorer = PhrasesAlwaysWin()
    phrase = tuple(tokenizer(" New York City", add_special_tokens=False).input_ids)
    ids = tokenizer(["I moved to", "I moved to"], return_tensors="pt").input_ids
    tail = tuple(ids[0, -2:].tolist())
    out = model.generate(ids, max_new_tokens=1, do_sample=False, phrase_contexts=[{tail: [phrase]}, {}])
    assert out[0, -1].item() == model.vocab_size and out[1, -1].item() < model.vocab_size
    ungated = model.generate(ids, max_new_tokens=1, do_sample=False, phrase_contexts=[{(1, 2): [phrase]}, None])
    assert ungated[0, -1].item() < model.vocab_size and ungated[1, -1].item() == model.vocab_size


@pytest.mark.parametrize("bad, match", [
    ([], "non-empty list"), ("ab", "mapping"), (5, "mapping"), ({(1,): [], (1, 2): []}, "tuples of n token ids"),
    ([{(1,): []}, {"x": []}], "tuples of n token ids"),
])
def test_bad_phrase_contexts_are_refused_with_the_fix(llama, tokenizer, bad, match):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" New York City"])
    ids = tokenizer("I moved to", return_tensors="pt").input_ids
    with pytest.raises((TypeError, ValueError), match=match):
        model.generate(ids, max_new_tokens=1, phrase_contexts=bad)
