import pytest
import torch

from dynvocab import DynamicVocabLM, Phrase
from tests.helpers import count_tokenized


@pytest.fixture
def model(llama, tokenizer):
    return DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()


@pytest.mark.parametrize(
    "bad, message",
    [
        (42, "must be a str or dynvocab.Phrase"),
        ("", "empty or only whitespace"),
        ("   ", "empty or only whitespace"),
        (" the", "single token"),
        (" one two three four five six seven eight nine", "more than max_phrase_tokens=8"),
    ],
)
def test_bad_phrases_are_rejected_and_nothing_changes(model, bad, message):
    model.set_phrases([" New York City"])
    with pytest.raises((ValueError, TypeError), match=message):
        model.add_phrases([" of the", bad])
    assert [p.text for p in model.phrases] == [" New York City"]


def test_ids_follow_the_vocabulary_and_duplicates_merge(model):
    model.set_phrases([" New York City", Phrase(" of the", "doc-a"), Phrase(" of the", "doc-b")])
    assert len(model.phrase_table) == 2
    assert model.phrase_table.id_of(" New York City") == model.vocab_size
    assert model.phrase_table.phrases[1].source == "doc-a"


def test_only_new_phrases_are_encoded(model, monkeypatch):
    model.set_phrases([" New York City", " of the"])
    before = model.phrase_table.output_vectors.clone()
    encoded = []
    original = model.phrase_encoder.encode_ids
    monkeypatch.setattr(model.phrase_encoder, "encode_ids", lambda ids, *a: encoded.extend(ids) or original(ids, *a))
    model.add_phrases([" in the", " of the"])
    assert encoded == [model.phrase_table.token_ids[2]]
    torch.testing.assert_close(model.phrase_table.output_vectors[:2], before)
    model.set_phrases([" in the", " New York City", " at the end"])
    assert encoded[1:] == [model.phrase_table.token_ids[2]]
    assert [p.text for p in model.phrases] == [" New York City", " in the", " at the end"]


def test_remove_keeps_every_id_and_vector_and_set_phrases_renumbers(model):
    model.set_phrases([" New York City", " of the", " in the"])
    vectors = model.phrase_table.output_vectors.clone()
    ids = [model.phrase_table.id_of(p) for p in (" New York City", " of the", " in the")]
    model.remove_phrases([" of the", " not there"])
    assert [p.text for p in model.phrases] == [" New York City", " in the"]
    assert [model.phrase_table.id_of(p) for p in (" New York City", " in the")] == [ids[0], ids[2]]
    assert " of the" not in model.phrase_table and model.decode([ids[1]]) == " of the"
    torch.testing.assert_close(model.phrase_table.output_vectors, vectors)
    model.set_phrases([" New York City", " in the"])  # a new set: removed entries go, ids renumber
    assert model.phrase_table.id_of(" in the") == ids[1]
    torch.testing.assert_close(model.phrase_table.output_vectors, vectors[[0, 2]])


def test_vectors_are_refreshed_when_the_encoder_changes(model):
    model.set_phrases([" New York City"])
    before = model.phrase_table.output_vectors.clone()
    with torch.no_grad():
        model.phrase_encoder.head[-1].bias.add_(1.0)
    model(torch.tensor([[1, 2]]))
    assert not torch.allclose(model.phrase_table.output_vectors, before)


def test_validation_in_chunks_matches_one_call_and_shares_token_ints(model, monkeypatch):
    import dynvocab.phrases.table as phrase_table

    phrases = [" New York City", " of the", " the river valley", " York City Hall", " the city of York"]
    whole = model.phrase_table.validate(phrases)
    monkeypatch.setattr(phrase_table, "VALIDATE_CHUNK", 2)
    chunked = model.phrase_table.validate(phrases)
    assert chunked == whole
    assert whole[0][1] == tuple(model.tokenizer(" New York City", add_special_tokens=False).input_ids)
    york = model.tokenizer(" York", add_special_tokens=False).input_ids[0]
    occurrences = [i for _, ids in chunked for i in ids if i == york]
    assert len(occurrences) >= 2 and all(i is occurrences[0] for i in occurrences)  # one int object, not one each


def test_the_table_tokenizes_a_text_once_and_remembers_a_bounded_number(model, monkeypatch):
    import dynvocab.phrases.table as phrase_table

    table = model.phrase_table
    expected = [tuple(model.tokenizer(t, add_special_tokens=False).input_ids) for t in (" New York City", " of the")]
    asked = count_tokenized(model.tokenizer, monkeypatch)
    assert table.tokenize([" New York City", " of the", " New York City"]) == [expected[0], expected[1], expected[0]]
    model.set_phrases([" New York City", " of the"], mid_sentence_forms=False)
    assert asked == [" New York City", " of the"]  # set_phrases found both remembered
    monkeypatch.setattr(phrase_table, "TOKEN_MEMO_SIZE", 2)
    table.tokenize([" the river", " New York City"])  # " of the" is now the least recently used: forgotten
    table.tokenize([" of the", " New York City"])
    assert asked == [" New York City", " of the", " the river", " of the"]
