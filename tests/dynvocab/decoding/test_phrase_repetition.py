"""Repetition control that counts a phrase as the tokens it spells."""

import pytest
import torch
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

from dynvocab.decoding.repetition import PhraseMaxUses, PhraseNoRepeatNGram, PhraseRepetitionPenalty
from tests.helpers import PhrasesAlwaysWin

V = 20
PHRASES = [(3, 4), (4, 5, 6), (7, 8), (9, 3, 4)]  # ids V .. V + 3


def _spell(ids, vocab=V, phrases=PHRASES):
    return [t for i in ids for t in (phrases[i - vocab] if i >= vocab else (i,))]


def _brute_force_banned(ids, n, vocab=V, phrases=PHRASES, candidates=None):
    """Every id (of ``candidates``, default all) whose tokens, appended to the row's tokens, would repeat an n-gram."""
    tokens = _spell(ids, vocab, phrases)
    seen = {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}
    banned = set()
    for candidate in candidates if candidates is not None else range(vocab + len(phrases)):
        extended = tokens + _spell([candidate], vocab, phrases)
        new_ends = range(len(tokens), len(extended))
        if any(end + 1 >= n and tuple(extended[end + 1 - n : end + 1]) in seen for end in new_ends):
            banned.add(candidate)
    return banned


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_matches_brute_force(n):
    generator = torch.Generator().manual_seed(n)
    processor = PhraseNoRepeatNGram(n, V, PHRASES)
    for _ in range(30):
        ids = torch.randint(0, V + len(PHRASES), (2, 7), generator=generator)
        out = processor(ids, torch.zeros(2, V + len(PHRASES)))
        for row in range(2):
            assert set(torch.isinf(out[row]).nonzero().flatten().tolist()) == _brute_force_banned(ids[row].tolist(), n)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_extends_growing_rows_and_rebuilds_rows_that_go_back(n):
    """Rows grow a step at a time (their records are extended), go back (verified decoding) or swap (beam search;
    rebuilt): every step's bans equal the brute force's."""
    generator = torch.Generator().manual_seed(20 + n)
    processor = PhraseNoRepeatNGram(n, V, PHRASES)
    ids = torch.randint(0, V + len(PHRASES), (2, 3), generator=generator)
    for step in range(60):
        before = processor._rows.get(0)
        if step % 13 == 12:
            ids, grows = ids[:, :-3], False
        elif step % 17 == 16:
            ids, grows = ids.flip(0), False
        else:
            ids, grows = torch.cat([ids, torch.randint(0, V + len(PHRASES), (2, 1), generator=generator)], 1), True
        out = processor(ids, torch.zeros(2, V + len(PHRASES)))
        for row in range(2):
            assert set(torch.isinf(out[row]).nonzero().flatten().tolist()) == _brute_force_banned(ids[row].tolist(), n)
        if before is not None:
            assert (processor._rows[0] is before) == grows


def test_no_repeat_with_a_real_vocabulary_size_and_long_ngrams():
    """SmolLM2's V = 49152 and n = 5 (V**5 > 2**63: an integer hash of the n-grams would wrap): the bans equal the
    brute force's."""
    vocab, generator = 49152, torch.Generator().manual_seed(5)
    words = torch.tensor([7, 512, 40000, 49151])  # few distinct tokens, so n-grams repeat
    phrases = [tuple(words[torch.randint(0, 4, (k,), generator=generator)].tolist()) for k in (2, 3, 5, 6, 7)]
    processor = PhraseNoRepeatNGram(5, vocab, phrases)
    ids = words[torch.randint(0, 4, (1, 6), generator=generator)]
    for _ in range(30):
        step = words[torch.randint(0, 4, (1,), generator=generator)] if torch.rand(1, generator=generator) < 0.7 else (
            torch.randint(vocab, vocab + len(phrases), (1,), generator=generator))
        ids = torch.cat([ids, step[None]], 1)
        out = processor(ids, torch.zeros(1, vocab + len(phrases)))
        candidates = [*words.tolist(), *range(vocab, vocab + len(phrases))]
        banned = {c for c in candidates if torch.isinf(out[0, c])}
        assert banned == _brute_force_banned(ids[0].tolist(), 5, vocab, phrases, candidates)
        assert int(torch.isinf(out[0, :vocab]).sum()) == len(banned & set(words.tolist()))


def test_no_repeat_equals_transformers_on_plain_tokens():
    ids = torch.tensor([[1, 2, 3, 1, 2, 5, 1, 2]])
    scores = torch.randn(1, V + len(PHRASES))
    ours = PhraseNoRepeatNGram(3, V, PHRASES)(ids, scores.clone())[:, :V]
    theirs = NoRepeatNGramLogitsProcessor(3)(ids, scores.clone()[:, :V])
    assert torch.equal(ours, theirs)


def test_a_phrase_that_repeats_its_own_text_is_banned():
    ids = torch.tensor([[1, 3, 4, 5, 6, 2]])  # the tokens of phrases 0 and 1 already written
    out = PhraseNoRepeatNGram(2, V, PHRASES)(ids, torch.zeros(1, V + len(PHRASES)))
    assert torch.isinf(out[0, V]) and torch.isinf(out[0, V + 1]) and not torch.isinf(out[0, V + 2])


def test_penalty_equals_transformers_on_tokens_and_hits_written_phrases():
    ids = torch.tensor([[1, 7, 8, V + 1]])  # phrase 2's tokens are written; phrase 1 was emitted
    scores = torch.randn(1, V + len(PHRASES)).abs() + 0.5
    out = PhraseRepetitionPenalty(2.0, V, PHRASES)(ids, scores.clone())
    tokens = torch.tensor([[1, 7, 8, 4, 5, 6]])
    assert torch.allclose(out[:, :V], RepetitionPenaltyLogitsProcessor(2.0)(tokens, scores.clone()[:, :V]))
    assert torch.allclose(out[0, V + 1 :V + 3], scores[0, V + 1 : V + 3] / 2)
    assert out[0, V] == scores[0, V] and out[0, V + 3] == scores[0, V + 3]


@pytest.mark.parametrize("max_uses", [1, 2])
def test_max_uses_bans_a_phrase_once_emitted_that_often_in_its_row_only(max_uses):
    ids = torch.tensor([[1, V, 3, V + 2, V, 2], [V + 2, 3, 4, 5, 6, 7]])  # row 1 spells phrases 0 and 1 as tokens
    scores = torch.randn(2, V + len(PHRASES) + 2)  # two columns past the table: another row's phrases
    out = PhraseMaxUses(max_uses, V)(ids, scores.clone())
    banned = {0: {V, V + 2}, 1: {V + 2}} if max_uses == 1 else {0: {V}, 1: set()}
    for row in range(2):
        assert set(torch.isinf(out[row]).nonzero().flatten().tolist()) == banned[row]
        kept = [i for i in range(scores.shape[1]) if i not in banned[row]]
        assert torch.equal(out[row, kept], scores[row, kept])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_max_uses_is_refused(bad):
    with pytest.raises(ValueError, match="phrase_max_uses must be a positive int"):
        PhraseMaxUses(bad, V)


@pytest.mark.parametrize("bad", [0, -2, 1.5, "3"])
def test_bad_ngram_size_is_refused(bad):
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be a positive int"):
        PhraseNoRepeatNGram(bad, V, PHRASES)


def test_generate_uses_phrase_aware_processors(llama, tokenizer):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" of the United States"])

    model.scorer = PhrasesAlwaysWin()
    ids = tokenizer("Hello", return_tensors="pt").input_ids
    looping = model.generate(ids, max_new_tokens=4, do_sample=False)[0, 1:].tolist()
    assert looping == [model.vocab_size] * 4
    guarded = model.generate(ids, max_new_tokens=4, do_sample=False, no_repeat_ngram_size=3)[0, 1:].tolist()
    assert guarded.count(model.vocab_size) == 1


def test_generate_builds_the_phrase_ngram_lookups_once_per_phrase_table(llama, tokenizer):
    """The no-repeat rule's phrase lookups are kept between generate calls and rebuilt when the phrases change."""
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" of the United States"])
    model.scorer = PhrasesAlwaysWin()
    ids = tokenizer("Hello", return_tensors="pt").input_ids
    model.generate(ids, max_new_tokens=2, do_sample=False, no_repeat_ngram_size=3)
    first = model._ngrams
    model.generate(ids, max_new_tokens=2, do_sample=False, no_repeat_ngram_size=3)
    assert model._ngrams is first
    model.set_phrases([" in the middle of"])
    guarded = model.generate(ids, max_new_tokens=4, do_sample=False, no_repeat_ngram_size=3)[0, 1:].tolist()
    first_token = tokenizer(" in the middle of", add_special_tokens=False).input_ids[0]
    assert model._ngrams is not first and model._ngrams.starting[(first_token,)] == [0]
    assert guarded.count(model.vocab_size) == 1


def test_generate_guards_only_the_new_text_when_asked(llama, tokenizer):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" of the United States"])
    model.scorer = PhrasesAlwaysWin()
    ids = tokenizer("Hello of the United States", return_tensors="pt").input_ids  # the prompt already says the phrase
    everything = model.generate(ids, max_new_tokens=3, do_sample=False, no_repeat_ngram_size=3)[0, ids.shape[1] :].tolist()
    new = model.generate(ids, max_new_tokens=3, do_sample=False, no_repeat_ngram_size=3,
                         no_repeat_ngram_scope="new")[0, ids.shape[1] :].tolist()
    assert model.vocab_size not in everything  # its text would repeat the prompt's 3-grams
    assert new[0] == model.vocab_size and new.count(model.vocab_size) == 1  # once, then the answer's own 3-grams ban it


def test_generate_emits_a_phrase_at_most_max_uses_times(llama, tokenizer):
    from dynvocab import DynamicVocabLM

    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases([" of the United States", " New York"])
    model.scorer = PhrasesAlwaysWin()
    ids = tokenizer("Hello", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=6, do_sample=False, phrase_max_uses=2)[0, 1:].tolist()
    phrases = [i for i in out if i >= model.vocab_size]
    assert len(phrases) == 4 and all(phrases.count(i) == 2 for i in set(phrases))
    assert all(i < model.vocab_size for i in out[4:])  # every phrase used up: tokens only from there


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_over_new_ids_counts_only_what_generate_wrote(n):
    """scope="new": the columns of the first call are the prompt; n-grams there stay allowed, the new ones are not."""
    generator = torch.Generator().manual_seed(10 + n)
    prompt = torch.randint(0, V + len(PHRASES), (2, 6), generator=generator)
    processor = PhraseNoRepeatNGram(n, V, PHRASES, scope="new")
    processor(prompt, torch.zeros(2, V + len(PHRASES)))  # the first step sees the prompt alone: nothing written yet
    ids = prompt
    for _ in range(6):
        ids = torch.cat([ids, torch.randint(0, V + len(PHRASES), (2, 1), generator=generator)], 1)
        out = processor(ids, torch.zeros(2, V + len(PHRASES)))
        for row in range(2):
            banned = set(torch.isinf(out[row]).nonzero().flatten().tolist())
            assert banned == _brute_force_banned(ids[row, prompt.shape[1] :].tolist(), n)


def test_no_repeat_over_new_ids_lets_the_text_copy_its_prompt():
    prompt = torch.tensor([[1, 2, 3, 5]])
    written = torch.tensor([[1, 2, 3, 5, 1, 2]])
    everything, new = PhraseNoRepeatNGram(3, V, PHRASES), PhraseNoRepeatNGram(3, V, PHRASES, scope="new")
    for processor in (everything, new):
        processor(prompt, torch.zeros(1, V + len(PHRASES)))
    assert torch.isinf(everything(written, torch.zeros(1, V + len(PHRASES)))[0, 3])  # "1 2 3" is in the prompt
    assert not torch.isinf(new(written, torch.zeros(1, V + len(PHRASES)))).any()


def test_an_unknown_no_repeat_scope_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'all'.*'new'"):
        PhraseNoRepeatNGram(3, V, PHRASES, scope="answer")
