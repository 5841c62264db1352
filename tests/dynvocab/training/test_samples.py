import random

import pytest

from dynvocab.training.samples import (
    FMMSampler,
    MixedSample,
    NIdsSampler,
    NWordsSampler,
    build_samples,
    chunk_bounds,
    token_boundaries,
    word_spans,
)

TEXT = (
    "The quick brown fox jumps over the lazy dog. A café in São Paulo serves naïve coffee 🤖 daily, "
    "but don't  expect   double spaces to vanish.\n\nNew York City's mayor (born 1961) said \"hello\" twice; "
    "U.S. officials weren't there. Isn't it 20th-century-ish?"
)


def assert_spacing(sample: MixedSample, min_gap: int, min_len: int = 2, max_len: int | None = None):
    previous_end = None
    for start, end in sample.phrase_spans:
        assert end - start >= min_len
        assert max_len is None or end - start <= max_len
        if previous_end is not None:
            assert start - previous_end >= min_gap
        previous_end = end


def test_mixed_sample_phrases_and_validation():
    sample = MixedSample([5, 6, 7, 8, 9], [(0, 2), (3, 5)])
    assert sample.phrases() == [(5, 6), (8, 9)]
    with pytest.raises(ValueError, match="phrase_spans"):
        MixedSample([1, 2, 3], [(1, 3), (0, 1)])
    with pytest.raises(ValueError, match="phrase_spans"):
        MixedSample([1, 2, 3], [(2, 4)])


@pytest.mark.parametrize("min_gap", [0, 1, 5])
def test_nids_spacing_and_lengths(min_gap):
    sampler = NIdsSampler(min_tokens=2, max_tokens=5, min_gap=min_gap, phrase_prob=1.0)
    ids = list(range(100, 300))
    for seed in range(20):
        sample = sampler(ids, rng=random.Random(seed))
        assert sample.token_ids == ids
        assert sample.phrase_spans
        assert_spacing(sample, min_gap, 2, 5)
        assert sample.phrases() == [tuple(ids[s:e]) for s, e in sample.phrase_spans]
        # with phrase_prob=1 a phrase starts as soon as spacing allows
        assert sample.phrase_spans[0][0] == 0
        for (_, end), (start, _) in zip(sample.phrase_spans, sample.phrase_spans[1:]):
            assert start == end + min_gap


def test_phrase_prob_zero_and_bad_arguments():
    assert NIdsSampler(phrase_prob=0.0)(list(range(50)), rng=random.Random(0)).phrase_spans == []
    with pytest.raises(ValueError, match="min_tokens"):
        NIdsSampler(min_tokens=1)
    with pytest.raises(ValueError, match="min_gap"):
        NIdsSampler(min_gap=-1)
    with pytest.raises(ValueError, match="phrase_prob"):
        NIdsSampler(phrase_prob=1.5)
    with pytest.raises(ValueError, match="offsets"):
        NWordsSampler()(list(range(5)), rng=random.Random(0))


def test_token_boundaries_byte_level_offsets():
    # " café 🤖": one token for " café", then three byte tokens sharing the emoji's character
    text = "A café 🤖 x"
    offsets = [(0, 1), (1, 6), (6, 8), (7, 8), (7, 8), (8, 10)]
    start_at, end_at = token_boundaries(text, offsets)
    assert start_at == {0: 0, 2: 1, 7: 2, 9: 5}
    assert end_at == {1: 1, 6: 2, 8: 5, 10: 6}


def test_nwords_spans_are_whole_word_runs(tokenizer):
    encoded = tokenizer(TEXT, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], [tuple(o) for o in encoded["offset_mapping"]]
    words = word_spans(TEXT)
    word_starts = {s for s, _ in words}
    word_ends = {e for _, e in words}
    sampler = NWordsSampler(min_words=2, max_words=5, min_gap=3, phrase_prob=0.7)
    seen = 0
    for seed in range(30):
        sample = sampler(ids, text=TEXT, offsets=offsets, rng=random.Random(seed))
        assert_spacing(sample, 3)
        for start, end in sample.phrase_spans:
            seen += 1
            first = offsets[start][0] + (1 if TEXT[offsets[start][0]].isspace() else 0)
            last = offsets[end - 1][1]
            assert first in word_starts and last in word_ends
            n_words = sum(1 for s, e in words if first <= s and e <= last)
            assert 2 <= n_words <= 5
            # the phrase's tokens decode to exactly the text they replace
            assert tokenizer.decode(list(sample.token_ids[start:end])) == TEXT[offsets[start][0] : last]
            # no token before the span reaches into it, none after starts inside it
            assert start == 0 or offsets[start - 1][1] <= first
            assert end == len(ids) or offsets[end][0] >= last
    assert seen > 30


def test_nwords_never_splits_a_word_across_tokens(tokenizer):
    # NLTK splits "don't" into do|n't while GPT-2 gives don|'t: no phrase may end after "do"
    text = "we don't know, they don't care"
    encoded = tokenizer(text, return_offsets_mapping=True)
    sampler = NWordsSampler(min_words=2, max_words=3, min_gap=0, phrase_prob=1.0)
    candidates = sampler.candidates(encoded["input_ids"], text, encoded["offset_mapping"])
    cut = text.index("don") + 2  # between "do" and "n't"
    for start, ends in candidates.items():
        for end in ends:
            assert encoded["offset_mapping"][end - 1][1] != cut


def test_fmm_takes_longest_match_and_respects_gap():
    sampler = FMMSampler({(1, 2), (1, 2, 3), (3, 4), (7, 8)}, min_gap=2)
    sample = sampler([1, 2, 3, 4, 9, 1, 2, 7, 8, 0, 0, 3, 4], rng=random.Random(0))
    # (1,2,3) at 0 wins over (1,2); (3,4) would need no gap; (1,2) at 5 is 2 after end 3;
    # (7,8) at 7 starts right after it and is skipped; (3,4) at 11 is 4 after end 7.
    assert sample.phrase_spans == [(0, 3), (5, 7), (11, 13)]
    assert sample.phrases() == [(1, 2, 3), (1, 2), (3, 4)]


def test_fmm_max_phrase_tokens_and_prefix_walk():
    sampler = FMMSampler({(1, 2, 3, 4), (1, 2)}, min_gap=0, max_phrase_tokens=3)
    # (1,2,3,4) is too long; (1,2,3) is only a prefix, so the longest match is (1,2)
    assert sampler([1, 2, 3, 4], rng=random.Random(0)).phrase_spans == [(0, 2)]


def test_build_samples_chunks_and_bookkeeping(tokenizer):
    texts = [TEXT, "short one", TEXT.upper()]
    samples = list(build_samples(texts, tokenizer, NWordsSampler(min_gap=2), max_length=16, seed=1))
    full = [tokenizer(t)["input_ids"] for t in texts]
    assert [i for s in samples for i in s.token_ids] == [i for ids in full for i in ids]  # "short one" has 2 tokens
    assert all(2 <= len(s.token_ids) <= 16 for s in samples)
    assert any(s.phrase_spans for s in samples)
    for sample in samples:
        assert_spacing(sample, 2)
    again = list(build_samples(texts, tokenizer, NWordsSampler(min_gap=2), max_length=16, seed=1))
    assert [s.phrase_spans for s in again] == [s.phrase_spans for s in samples]


def test_chunk_cuts_avoid_words_and_split_characters(tokenizer):
    text = "aa bb 🤖 " * 6 + "extraordinarily"  # the emoji is 3 byte tokens, the last word 3 tokens
    encoded = tokenizer(text, return_offsets_mapping=True)
    offsets = [tuple(o) for o in encoded["offset_mapping"]]
    n = len(offsets)
    assert chunk_bounds(n, 4) == [(i, min(i + 4, n)) for i in range(0, n, 4)]  # no text: plain cuts
    for max_length in range(8, 20):  # a back-off of >= 2 tokens always reaches a word start here
        bounds = chunk_bounds(n, max_length, text, offsets)
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(0 < end - begin <= max_length for begin, end in bounds)
        for (_, end), (begin, _) in zip(bounds, bounds[1:]):
            assert end == begin
            assert text[offsets[begin][0]] == " "


def test_build_samples_streams_lazily(tokenizer):
    consumed = []

    def texts():
        for i in range(10_000):
            consumed.append(i)
            yield f"text number {i} has a few words in it"

    stream = build_samples(texts(), tokenizer, NIdsSampler(), max_length=8, batch_size=4)
    first = next(stream)
    assert first.token_ids and len(consumed) == 4


def test_build_samples_rejects_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="max_length"):
        build_samples(["a b"], tokenizer, NIdsSampler(), max_length=0)
