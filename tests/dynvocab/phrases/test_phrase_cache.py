"""Phrase vectors kept across phrase sets: bounded, least recently used first out, exact, and emptied for a new encoder."""

import pytest
import torch

from dynvocab import DynamicVocabLM
from dynvocab.phrases.cache import PhraseVectorCache
from tests.helpers import count_encoded

A = [" New York City", " the United States", " in the morning"]
B = [" the river bank", " a small village", " New York City"]


def vector(value: float, d: int = 4) -> torch.Tensor:
    return torch.full((1, d), float(value))


def test_the_least_recently_used_vectors_leave_first_once_the_budget_is_spent():
    cache = PhraseVectorCache(max_bytes=3 * 4 * 4)  # three float32 vectors of 4
    for i in range(3):
        cache.put([(i,)], vector(i))
    found, missing = cache.split([(0,), (9,)])  # (0,) becomes the most recent
    assert list(found) == [0] and missing == [1] and (cache.hits, cache.misses) == (1, 1)
    cache.put([(3,)], vector(3))
    assert len(cache) == 3 and cache.bytes == 48
    assert cache.split([(1,)])[1] == [0]  # (1,) was the least recently used: dropped
    assert torch.equal(cache.split([(0,)])[0][0], torch.zeros(4))
    cache.put([(0,)], vector(7))  # a new vector for the same phrase replaces the old one
    assert cache.bytes == 48 and torch.equal(cache.split([(0,)])[0][0], torch.full((4,), 7.0))
    cache.clear()
    assert (len(cache), cache.bytes) == (0, 0) and cache.stats()["hit_rate"] == pytest.approx(3 / 5)


@pytest.mark.parametrize("budget", [-1, 1.5, "1"])
def test_a_bad_budget_is_refused(budget):
    with pytest.raises(ValueError, match="max_bytes"):
        PhraseVectorCache(budget)


def test_a_phrase_set_seen_before_is_not_encoded_again_and_gets_the_same_vectors(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer).eval()
    calls = count_encoded(model)
    model.set_phrases(A, mid_sentence_forms=False)
    first = model.phrase_table.output_vectors.clone()
    model.set_phrases(B, mid_sentence_forms=False)
    model.set_phrases(A, mid_sentence_forms=False)
    assert calls == [3, 2]  # B's shared phrase was kept by the table; A came back from the cache
    assert torch.equal(model.phrase_table.output_vectors, first)
    fresh = DynamicVocabLM.from_causal_lm(base_model, tokenizer, phrase_cache_mb=0).eval()
    fresh.phrase_encoder.load_state_dict(model.phrase_encoder.state_dict())
    fresh.set_phrases(A, mid_sentence_forms=False)
    assert torch.equal(fresh.phrase_table.output_vectors, first)  # a cached vector is the vector encoding makes
    assert model.phrase_cache.stats()["hits"] == 2 and model.phrase_cache.stats()["phrases"] == 5


def test_new_encoder_weights_empty_the_cache(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer).eval()
    model.set_phrases(A, mid_sentence_forms=False)
    old = model.phrase_table.output_vectors.clone()
    model.set_phrases(B, mid_sentence_forms=False)
    with torch.no_grad():
        next(model.phrase_encoder.parameters()).add_(0.5)  # as a training step would
    calls = count_encoded(model)
    model.set_phrases(A, mid_sentence_forms=False)
    assert calls == [3] and not torch.equal(model.phrase_table.output_vectors, old)


def test_with_the_cache_off_every_new_set_is_encoded(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer, phrase_cache_mb=0).eval()
    calls = count_encoded(model)
    for phrases in (A, B, A):
        model.set_phrases(phrases, mid_sentence_forms=False)
    assert calls == [3, 2, 2] and len(model.phrase_cache) == 0
