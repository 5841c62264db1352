import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dynvocab.assets import wikipedia_leads
from dynvocab.cli import main
from dynvocab.multiword import CONFIG_NAME, MultiWordLM, MultiWordVocab
from dynvocab.training.multiword import MultiWordTrainConfig, train_multiword


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


def test_training_moves_only_the_new_rows_and_the_loss_falls(tmp_path, tiny_lm_dir):
    data = tmp_path / "data.txt"
    data.write_text("\n\n".join(lead["text"] for lead in wikipedia_leads()[:80]))
    config = MultiWordTrainConfig(
        model=str(tiny_lm_dir), data=str(data), output_dir=str(tmp_path / "mwt"), num_ngrams=40, min_count=3,
        max_steps=30, batch_size=4, max_length=32, learning_rate=0.05, warmup_steps=1, log_every=1,
    )
    trained, log = train_multiword(config)
    losses = [r["loss"] for r in log]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1
    base = AutoModelForCausalLM.from_pretrained(tiny_lm_dir)
    start = MultiWordLM.from_causal_lm(AutoModelForCausalLM.from_pretrained(tiny_lm_dir), trained.vocab).lm.state_dict()
    V = base.get_input_embeddings().num_embeddings
    for name, tensor in trained.lm.state_dict().items():
        if tensor.shape[0] == V + 40:  # embedding matrices: old rows as before, new rows trained away from the mean
            torch.testing.assert_close(tensor[:V], base.state_dict()[name])
            assert not torch.allclose(tensor[V:], start[name][V:])
        else:
            torch.testing.assert_close(tensor, base.state_dict()[name])
    saved = json.loads((tmp_path / "mwt" / CONFIG_NAME).read_text())
    assert saved["train_log"] == log and saved["train_config"]["max_steps"] == 30 and len(saved["ngrams"]) == 40
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir)
    loaded = MultiWordLM.from_pretrained(tmp_path / "mwt", AutoModelForCausalLM.from_pretrained(tiny_lm_dir), tokenizer)
    for a, b in zip(MultiWordLM.embedding_matrices(loaded.lm), MultiWordLM.embedding_matrices(trained.lm)):
        torch.testing.assert_close(a, b)


def test_the_command_line_trains_and_saves(tmp_path, tiny_lm_dir):
    data = tmp_path / "data.txt"
    data.write_text("\n\n".join(lead["text"] for lead in wikipedia_leads()[:30]))
    main(["train-mwt", "--model", str(tiny_lm_dir), "--data", str(data), "--output-dir", str(tmp_path / "mwt"),
          "--num-ngrams", "10", "--min-count", "2", "--max-steps", "2", "--batch-size", "2", "--max-length", "16"])
    assert len(json.loads((tmp_path / "mwt" / CONFIG_NAME).read_text())["ngrams"]) == 10


def test_loading_onto_an_lm_of_another_shape_is_refused(_base_models, tokenizer, vocab, tmp_path):
    MultiWordLM.from_causal_lm(copy.deepcopy(_base_models["gpt2"]), vocab).save_pretrained(tmp_path / "tied")
    with pytest.raises(ValueError, match="tied embeddings: True.*train-mwt"):
        MultiWordLM.from_pretrained(tmp_path / "tied", copy.deepcopy(_base_models["llama"]), tokenizer)


def test_config_refuses_bad_settings():
    with pytest.raises(ValueError, match="max_ngram_tokens"):
        MultiWordTrainConfig(max_ngram_tokens=1)
    with pytest.raises(ValueError, match="num_ngrams"):
        MultiWordTrainConfig(num_ngrams=0)
