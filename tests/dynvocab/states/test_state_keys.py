"""State keys: a phrase competes only where the LM's state is close to its state before the phrase in a document."""

import pytest
import torch
import torch.nn.functional as F

from dynvocab import DotProductScorer, DynamicVocabLM, StateKeys, state_keys
from dynvocab.states.keys import StateGatedScorer
from dynvocab.states.store import DocumentStates
from tests.helpers import PhrasesAlwaysWin

DOCUMENTS = ["The castle by the river stood on a hill above the old town.",
             "A market by the river sold fish, and the castle watched it by the river"]  # a phrase ends it
PHRASES = [" castle by the river", " by the river", " the old town", " a hill above", " by the river bank"]


@pytest.fixture
def model(llama, tokenizer):
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    model.set_phrases(PHRASES)
    return model


def _documents(tokenizer) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False).input_ids for text in DOCUMENTS]


def _head_inputs(model, ids: list[int]) -> torch.Tensor:
    """``(T, d)``: what the LM's output layer reads over ``ids`` (the states phrases are scored on)."""
    seen = []
    hook = model.lm.get_output_embeddings().register_forward_pre_hook(lambda _, inputs: seen.append(inputs[0]))
    with torch.no_grad():
        model.lm(input_ids=torch.tensor([ids]))
    hook.remove()
    return seen[0][0]


def test_a_key_is_the_lm_state_just_before_each_place_a_phrase_starts(model, tokenizer):
    documents = _documents(tokenizer)
    table = model.phrase_table.token_ids
    keys = state_keys(DocumentStates(model.lm, batch_size=1), documents, table, threshold=0.9)
    expected = []  # brute force: every start past the first token, in document order
    for ids in documents:
        states = F.normalize(_head_inputs(model, ids), dim=-1)
        for start in range(1, len(ids)):
            expected += [(p, states[start - 1]) for p, tokens in enumerate(table)
                         if tuple(ids[start:start + len(tokens)]) == tokens]
    assert sorted(keys.phrases.tolist()) == sorted(p for p, _ in expected) and keys.rows is None
    for p, state in expected:
        assert any(torch.allclose(key, state, atol=1e-5) for key in keys.keys[keys.phrases == p])
    assert keys.phrases.tolist().count(0) == 1 and keys.phrases.tolist().count(1) == 3  # each place once
    batched = state_keys(model.lm, documents, table, threshold=0.9)  # right-padded together
    torch.testing.assert_close(batched.keys, keys.keys, atol=1e-5, rtol=1e-5)
    short = state_keys(model.lm, [[], documents[0][:1], *documents], table, threshold=0.9, rows=[0, 0, 1, 0])
    assert short.phrases.tolist() == keys.phrases.tolist() and set(short.rows.tolist()) == {0, 1}  # nothing to read
    # from first_key on only: the tokens before condition the states (a prompt's example) and give no key
    first = [len(ids) // 2 for ids in documents]
    later = state_keys(model.lm, documents, table, threshold=0.9, first_key=first)
    after = [(p, state) for (p, state), (n, start) in zip(expected, _starts(documents, table)) if start >= first[n]]
    assert 0 < len(after) < len(expected) and sorted(later.phrases.tolist()) == sorted(p for p, _ in after)
    for p, state in after:
        assert any(torch.allclose(key, state, atol=1e-5) for key in later.keys[later.phrases == p])
    with pytest.raises(ValueError, match="first_key has 1 entries for 2 documents"):
        state_keys(model.lm, documents, table, threshold=0.9, first_key=[0])


def _starts(documents: list[list[int]], table: list[tuple[int, ...]]) -> list[tuple[int, int]]:
    """``(document, position)`` of every place a phrase starts past the first token, in the brute force's order."""
    return [(n, start) for n, ids in enumerate(documents) for start in range(1, len(ids)) for tokens in table
            if tuple(ids[start:start + len(tokens)]) == tokens]


def test_document_states_read_each_document_once_and_keep_what_fits(model, tokenizer, monkeypatch):
    documents = _documents(tokenizer)
    states = DocumentStates(model.lm, max_tokens=8)
    read, decoder = [], model.lm.get_decoder()
    forward = decoder.forward

    def spy(*args, **kwargs):
        read.append(kwargs["input_ids"].shape)
        return forward(*args, **kwargs)

    monkeypatch.setattr(decoder, "forward", spy)
    first = states(documents)
    again = states([documents[1], documents[0], documents[1]])
    assert len(read) == 1 and (states.hits, states.misses) == (3, 2)  # one batch of both, then nothing new to read
    assert torch.equal(again[1], first[0]) and first[0].shape == (8, model.lm.config.hidden_size)
    torch.testing.assert_close(first[0], _head_inputs(model, documents[0][:8]), atol=1e-5, rtol=1e-5)
    size = first[0].numel() * 4
    small = DocumentStates(model.lm, max_tokens=8, max_bytes=size)  # room for one document
    small(documents)
    small([documents[0]])
    assert small.misses == 3 and small.bytes == size  # the first was dropped for the second, then read again
    with pytest.raises(ValueError, match="max_tokens=1 must be >= 2"):
        DocumentStates(model.lm, max_tokens=1)


def test_document_states_read_documents_of_similar_lengths_together(model, monkeypatch):
    lengths = [2, 30, 3, 29]
    documents = [list(range(5, 5 + n)) for n in lengths]
    states, read, decoder = DocumentStates(model.lm, batch_size=2), [], model.lm.get_decoder()
    forward = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **k: read.append(k["input_ids"].shape[1]) or forward(*a, **k))
    got = states(documents)
    assert read == [3, 30]  # not [30, 29]: short documents are not padded to the long ones
    assert [g.shape[0] for g in got] == lengths  # each comes back in its place
    for document, kept in zip(documents, got):
        torch.testing.assert_close(kept, _head_inputs(model, document), atol=1e-5, rtol=1e-5)


def test_the_gate_leaves_open_phrases_scored_as_before_and_closes_the_rest(model, tokenizer):
    keys = state_keys(model.lm, _documents(tokenizer), model.phrase_table.token_ids, threshold=0.6)
    ids = tokenizer(["The castle by the river and the old town"], return_tensors="pt").input_ids
    with torch.no_grad():
        plain = model(ids).logits
        model.scorer = StateGatedScorer(DotProductScorer(), keys)
        gated = model(ids).logits
    states = F.normalize(_head_inputs(model, ids[0].tolist()), dim=-1)
    cosines = states @ keys.keys.T  # (T, n)
    opened = torch.stack([(cosines[:, keys.phrases == p] >= 0.6).any(-1) for p in range(len(PHRASES))], dim=-1)
    assert opened.any() and not opened.all()
    vocab = model.vocab_size
    torch.testing.assert_close(gated[0, :, vocab:][opened], plain[0, :, vocab:][opened])
    assert torch.isneginf(gated[0, :, vocab:][~opened]).all()
    assert torch.equal(gated[..., :vocab], plain[..., :vocab])


def test_generate_takes_the_keys_for_the_call_only(model, tokenizer):
    model.scorer = PhrasesAlwaysWin()  # without a gate every step is a phrase
    # not a document's opening: there the state is a key's own, whose cosine rounds to 1 or just below it by machine
    prompt = tokenizer(["The old castle"], return_tensors="pt").input_ids
    documents = _documents(tokenizer)
    shut = state_keys(model.lm, documents, model.phrase_table.token_ids, threshold=1.0)
    gated = model.generate(prompt, max_new_tokens=6, do_sample=False, phrase_state_keys=shut)
    assert not (gated[0, prompt.shape[1]:] >= model.vocab_size).any()
    assert gated[0].tolist() == model.lm.generate(prompt, max_new_tokens=6, do_sample=False)[0].tolist()
    assert isinstance(model.scorer, PhrasesAlwaysWin)  # put back after the call
    wide_open = state_keys(model.lm, documents, model.phrase_table.token_ids, threshold=-1.0)
    free = model.generate(prompt, max_new_tokens=6, do_sample=False, phrase_state_keys=wide_open)
    assert (free[0, prompt.shape[1]:] >= model.vocab_size).all()


def test_a_row_opens_phrases_with_its_own_documents_keys_only_beams_included(model, tokenizer):
    documents = _documents(tokenizer)
    keys = state_keys(model.lm, documents, model.phrase_table.token_ids, threshold=-1.0, rows=[0, 1])
    assert set(keys.phrases[keys.rows == 0].tolist()) == {0, 1, 2, 3}
    assert set(keys.phrases[keys.rows == 1].tolist()) == {1}  # the market document has no town, hill or castle
    hidden = torch.randn(4, 3, model.lm.config.hidden_size)  # two rows, each twice (beams)
    opened = keys.open(hidden, len(PHRASES))
    for row, copies in ((0, (0, 1)), (1, (2, 3))):
        theirs = set(keys.phrases[keys.rows == row].tolist())
        for copy in copies:
            assert {p for p in range(len(PHRASES)) if opened[copy, 0, p]} == theirs
    with pytest.raises(ValueError, match="made for 2 rows but the batch has 3"):
        keys.open(hidden[:3], len(PHRASES))
    model.scorer = PhrasesAlwaysWin()
    prompts = tokenizer(["The castle", "A market by"], return_tensors="pt", padding=True)
    out = model.generate(**prompts, max_new_tokens=3, num_beams=2, do_sample=False, phrase_state_keys=keys)
    for row in range(2):
        used = {i - model.vocab_size for i in out[row, prompts.input_ids.shape[1]:].tolist() if i >= model.vocab_size}
        assert used and used <= set(keys.phrases[keys.rows == row].tolist())


def test_bad_keys_are_refused():
    with pytest.raises(ValueError, match=r"threshold=1.5 is a cosine: pass a value in \[-1, 1\]"):
        StateKeys(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), 1.5)
    with pytest.raises(ValueError, match="must be \\(n, d\\), \\(n,\\) and \\(n,\\)"):
        StateKeys(torch.zeros(2, 4), torch.zeros(3, dtype=torch.long), 0.5)
    with pytest.raises(ValueError, match="rows must be 0..1 for num_rows=2"):
        StateKeys(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), 0.5, torch.tensor([0, 2]), num_rows=2)
