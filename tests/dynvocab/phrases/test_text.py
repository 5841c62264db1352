import pytest

from dynvocab import DynamicVocabLM, Phrase
from dynvocab.phrases.mixed_ids import PhraseAwareDecoder, Segment, decode, segments, tokenize
from dynvocab.phrases.table import PhraseTable
from tests.helpers import WORDS, word_tokenizer

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


def test_a_replaced_phrase_set_gives_reused_phrases_their_new_source(model):
    model.set_phrases([Phrase(" of the", "doc-9"), Phrase(" in the", "doc-9")])
    sources = {s.text: s.source for s in model.segments(model.tokenize(TEXT)) if s.is_phrase}
    assert sources == {" of the": "doc-9", " in the": "doc-9"}


def test_each_row_keeps_its_own_source_for_the_same_text(model):
    model.set_phrases([[Phrase(" of the", "a"), Phrase(" in the", "a")], [Phrase(" in the", "b"), Phrase(" of the", "c")]])
    ids = model.tokenize(TEXT, row=0)
    for row, expected in ((0, {" of the": "a", " in the": "a"}), (1, {" of the": "c", " in the": "b"})):
        assert {s.text: s.source for s in model.segments(ids, row=row) if s.is_phrase} == expected
    with pytest.raises(ValueError, match="row=2"):
        model.segments(ids, row=2)


def test_decode_rejects_unknown_ids(model):
    with pytest.raises(ValueError, match="past the vocabulary"):
        model.decode([model.vocab_size + 99])
    with pytest.raises(ValueError, match="past the vocabulary"):  # the first id after the last phrase
        model.decode([model.vocab_size + len(model.phrase_table)])


def test_segments_give_each_phrase_its_text_and_source_and_each_token_run_its_text(model):
    assert model.segments(model.tokenize("The city of New York is in the United States.")) == [
        Segment("The city of", False),
        Segment(" New York is in", True),
        Segment(" the United States", True),
        Segment(".", False),
    ]
    assert model.segments(model.tokenize("Most of the people")) == [
        Segment("Most", False), Segment(" of the", True, "doc-7"), Segment(" people", False)
    ]


def _table(tokenizer, phrases):
    table = PhraseTable(tokenizer, len(tokenizer))
    table.add(phrases)
    return table


def test_a_table_of_one_phrase_is_used():
    tokenizer = word_tokenizer()
    table = _table(tokenizer, ["the cat"])
    sat = tokenizer.convert_tokens_to_ids("sat")
    assert tokenize("the cat sat", tokenizer, table) == [table.vocab_size, sat]


def test_tokenize_adds_no_special_tokens_even_with_a_tokenizer_that_puts_bos_first():
    tokenizer = word_tokenizer(adds_bos=True)
    table = _table(tokenizer, ["the cat"])
    ids = tokenize("the cat sat on a mat", tokenizer, table)
    assert ids == [table.vocab_size, *tokenizer("sat on a mat", add_special_tokens=False)["input_ids"]]


def test_decoded_text_keeps_its_spaces_with_a_tokenizer_that_cleans_them_up():
    tokenizer = word_tokenizer(words=[*WORDS, "."], cleans_up_spaces=True)
    table = _table(tokenizer, ["the cat"])
    ids = tokenize("a dog ran .", tokenizer, table)
    assert decode(ids, tokenizer, table) == "a dog ran ."
    assert segments(ids, tokenizer, table) == [Segment("a dog ran .", False)]


def test_special_tokens_are_kept_unless_skipping_them_is_asked_for(tokenizer):
    table = _table(tokenizer, [" New York"])
    ids = tokenize("I live in New York", tokenizer, table) + [tokenizer.eos_token_id]
    streamer_decoder = PhraseAwareDecoder(tokenizer, table)
    for kept in (decode(ids, tokenizer, table), streamer_decoder.decode(ids)):
        assert kept == "I live in New York<|endoftext|>"
    assert segments(ids, tokenizer, table)[-1] == Segment("<|endoftext|>", False)
    for skipped in (decode(ids, tokenizer, table, True), streamer_decoder.decode(ids, skip_special_tokens=True)):
        assert skipped == "I live in New York"
    assert segments(ids, tokenizer, table, skip_special_tokens=True)[-1] == Segment(" New York", True)
