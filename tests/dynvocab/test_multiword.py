import copy
import json

import pytest
import torch

from dynvocab.data.assets import wikipedia_leads
from dynvocab.multiword import CONFIG_NAME, MultiWordLM, MultiWordVocab


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture
def vocab(tokenizer):
    grams = [ids(tokenizer, " of the"), ids(tokenizer, " in the"), ids(tokenizer, " United States"), ids(tokenizer, " one of the")]
    return MultiWordVocab(tokenizer, grams, len(tokenizer))


def test_merges_ngrams_on_word_boundaries_longest_first(vocab, tokenizer):
    V = len(tokenizer)
    merged = vocab.encode("He was one of the best in the United States.")
    assert merged == [*ids(tokenizer, "He was"), V + 3, *ids(tokenizer, " best"), V + 1, V + 2, *ids(tokenizer, ".")]
    assert vocab.decode(merged) == "He was one of the best in the United States."


def test_does_not_merge_inside_a_word(vocab, tokenizer):
    text = " of thebes and in theta"  # " of" + " the" + "bes": the n-gram would end inside a word
    assert ids(tokenizer, " of thebes")[:2] == ids(tokenizer, " of the")
    assert vocab.encode(text) == ids(tokenizer, text)


def test_mined_ngrams_are_frequent_multiword_and_round_trip(tokenizer):
    texts = [lead["text"] for lead in wikipedia_leads()[:300]]
    vocab = MultiWordVocab.mine(texts, tokenizer, len(tokenizer), num_ngrams=50, min_count=5)
    assert len(vocab) == 50 and " of the" in [tokenizer.decode(g) for g in vocab.ngrams[:3]]
    assert all(len(tokenizer.decode(g).split()) >= 2 for g in vocab.ngrams)
    shorter = 0
    for text in texts[:50]:
        merged = vocab.encode(text)
        assert vocab.decode(merged) == tokenizer.decode(ids(tokenizer, text))
        shorter += len(merged) < len(ids(tokenizer, text))
    assert shorter >= 40


def test_bad_ngrams_and_ids_are_refused(tokenizer):
    with pytest.raises(ValueError, match="2\\+ token ids"):
        MultiWordVocab(tokenizer, [[5]], len(tokenizer))
    with pytest.raises(ValueError, match="duplicates"):
        MultiWordVocab(tokenizer, [[5, 6], [5, 6]], len(tokenizer))
    with pytest.raises(ValueError, match="past the vocabulary"):
        MultiWordVocab(tokenizer, [[5, 6]], len(tokenizer)).decode([len(tokenizer) + 1])


def test_new_rows_are_the_mean_of_their_pieces_and_the_old_ones_stay(base_model, vocab, tokenizer):
    before = [m.detach().clone() for m in MultiWordLM.embedding_matrices(base_model)]
    model = MultiWordLM.from_causal_lm(base_model, vocab)
    V = len(tokenizer)
    for old, new in zip(before, MultiWordLM.embedding_matrices(model.lm)):
        assert new.shape[0] == V + len(vocab)
        torch.testing.assert_close(new[:V], old)
        for i, gram in enumerate(vocab.ngrams):
            torch.testing.assert_close(new[V + i], old[list(gram)].mean(0))


def test_save_and_load_round_trip(base_model, vocab, tokenizer, tmp_path):
    untouched = copy.deepcopy(base_model)
    model = MultiWordLM.from_causal_lm(base_model, vocab)
    with torch.no_grad():
        for matrix in MultiWordLM.embedding_matrices(model.lm):
            matrix[len(tokenizer) :] += 1.0  # as if trained
    model.save_pretrained(tmp_path / "mwt", note="kept")
    loaded = MultiWordLM.from_pretrained(tmp_path / "mwt", untouched, tokenizer)
    assert loaded.vocab.ngrams == vocab.ngrams
    for a, b in zip(MultiWordLM.embedding_matrices(model.lm), MultiWordLM.embedding_matrices(loaded.lm)):
        torch.testing.assert_close(a, b)
    assert json.loads((tmp_path / "mwt" / CONFIG_NAME).read_text())["note"] == "kept"


def test_loading_onto_another_tokenizer_is_refused(base_model, vocab, tmp_path, word_tokenizer):
    MultiWordLM.from_causal_lm(base_model, vocab).save_pretrained(tmp_path / "mwt")
    with pytest.raises(ValueError, match="another tokenizer"):
        MultiWordLM.from_pretrained(tmp_path / "mwt", base_model, word_tokenizer)
    with pytest.raises(FileNotFoundError, match="train-mwt"):
        MultiWordLM.from_pretrained(tmp_path / "missing", base_model, word_tokenizer)


def test_loading_onto_an_lm_of_another_shape_is_refused(_base_models, tokenizer, vocab, tmp_path):
    MultiWordLM.from_causal_lm(copy.deepcopy(_base_models["gpt2"]), vocab).save_pretrained(tmp_path / "tied")
    with pytest.raises(ValueError, match="tied embeddings: True.*train-mwt"):
        MultiWordLM.from_pretrained(tmp_path / "tied", copy.deepcopy(_base_models["llama"]), tokenizer)
