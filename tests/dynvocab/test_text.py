import pytest

from dynvocab import DynamicVocabLM, Phrase

TEXT = "The city of New York is in the United States. Most of the people of the city live in the boroughs."


@pytest.fixture
def model(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer)
    model.set_phrases([" New York", " New York is in", Phrase(" of the", "doc-7"), " the United States", " in the"])
    return model


def test_forward_maximum_matching_takes_the_longest_phrase(model):
    ids = model.tokenize(TEXT)
    phrases = [model.phrase_table.phrases[i - model.vocab_size].text for i in ids if i >= model.vocab_size]
    assert phrases == [" New York is in", " the United States", " of the", " of the", " in the"]


def test_decode_and_tokenize_round_trip(model):
    ids = model.tokenize(TEXT)
    assert model.decode(ids) == TEXT
    assert model.tokenize(model.decode(ids)) == ids


def test_segments_mark_phrases_and_sources(model):
    segments = model.segments(model.tokenize(TEXT))
    assert "".join(s.text for s in segments) == TEXT
    assert [s.source for s in segments if s.is_phrase] == [None, None, "doc-7", "doc-7", None]
    assert not any(a.is_phrase is False and b.is_phrase is False for a, b in zip(segments, segments[1:]))


def test_tokenize_for_one_row_uses_only_its_phrases(model):
    model.set_phrases([[" of the"], [" in the"]])
    assert model.vocab_size + 1 not in model.tokenize(TEXT, row=0)
    assert model.vocab_size + 1 in model.tokenize(TEXT, row=1)


def test_decode_rejects_unknown_ids(model):
    with pytest.raises(ValueError, match="past the vocabulary"):
        model.decode([model.vocab_size + 99])
