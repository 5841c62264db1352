import torch

from dynvocab import DynamicVocabLM, PhraseEncoder
from dynvocab.tokens.padding import pad_sequences


def test_left_and_right_padding_give_the_same_vectors(base_model):
    encoder = PhraseEncoder.from_causal_lm(base_model, num_layers=1).eval()
    phrases = [[11, 12, 13, 14], [21, 22]]
    ids, mask = pad_sequences(phrases)
    left_ids = torch.tensor([[11, 12, 13, 14], [0, 0, 21, 22]])
    left_mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with torch.no_grad():
        right = encoder(ids, mask)
        left = encoder(left_ids, left_mask)
    for a, b in zip(right, left):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_one_pass_gives_every_prefix(base_model):
    encoder = PhraseEncoder.from_causal_lm(base_model, num_layers=2).eval()
    phrase = [31, 32, 33, 34, 35]
    ids, mask = pad_sequences([phrase])
    with torch.no_grad():
        all_in, all_out = encoder.encode_all_prefixes(ids, mask)
        one_in, one_out = encoder.encode_ids([phrase[:k] for k in range(1, 6)])
    torch.testing.assert_close(all_in[0], one_in, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(all_out[0], one_out, rtol=1e-5, atol=1e-6)


def test_encoder_layers_are_copies_of_the_lm(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer, encoder_layers=2)
    source = llama.model.layers[1].mlp.up_proj.weight
    copy = model.phrase_encoder.body.layers[1].mlp.up_proj.weight
    assert torch.equal(source, copy) and source.data_ptr() != copy.data_ptr()


def test_encoder_from_another_causal_lm(llama, tokenizer):
    from tests.helpers import tiny_llama

    other = tiny_llama(len(tokenizer), seed=3)
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer, encoder_model=other)
    assert not model.phrase_encoder.shares_embeddings
    assert torch.equal(model.phrase_encoder.body.embed_tokens.weight, other.model.embed_tokens.weight)
    model.set_phrases([" New York City"])
    assert model.phrase_table.output_vectors.shape == (1, llama.config.hidden_size)


def test_vectors_are_anchored_on_the_lm_embeddings(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer).eval()
    torch.nn.init.zeros_(model.phrase_encoder.head[-1].weight)
    model.set_phrases([" New York City"])
    ids = model.phrase_table.token_ids[0]
    out_embeddings = base_model.get_output_embeddings().weight
    torch.testing.assert_close(model.phrase_table.output_vectors[0], out_embeddings[ids[0]])
    torch.testing.assert_close(model._cached_input_vectors([0])[0], base_model.get_input_embeddings().weight[ids[-1]])
    prompt = torch.tensor([tokenizer(" He lives in").input_ids])
    with torch.no_grad():
        logits = model(prompt).logits[0, -1]
    torch.testing.assert_close(logits[model.vocab_size], logits[ids[0]])


def test_a_progress_bar_only_when_asked_or_for_many_phrases(base_model, capsys, monkeypatch):
    import dynvocab.phrases.encoder as phrase_encoder

    encoder = PhraseEncoder.from_causal_lm(base_model, num_layers=1).eval()
    phrases = [[11, 12], [13, 14, 15], [16, 17]]
    with torch.no_grad():
        encoder.encode_ids(phrases, batch_size=1)  # a prompt's few phrases: no bar
        assert "encoding phrases" not in capsys.readouterr().err
        monkeypatch.setattr(phrase_encoder, "PROGRESS_FROM", 3)
        encoder.encode_ids(phrases, batch_size=1)
        assert "encoding phrases" in capsys.readouterr().err
        monkeypatch.setattr(phrase_encoder, "PROGRESS_FROM", 4)
        encoder.encode_ids(phrases, batch_size=1)
        assert "encoding phrases" not in capsys.readouterr().err
        encoder.encode_ids(phrases, batch_size=1, show_progress_bar=True)
    assert "encoding phrases" in capsys.readouterr().err
