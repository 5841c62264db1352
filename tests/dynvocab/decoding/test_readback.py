"""Reading emitted phrases back as their tokens: batched = single-row, cached = uncached, per-row sets, beams."""

import pytest
import torch

from dynvocab import DynamicVocabLM
from dynvocab.decoding.readback import expansion_table, physical_inputs
from tests.helpers import RandomScorer

PHRASES = [" New York City", " the United States", " of the big", " in the"]
PROMPTS = ["Hello world, this is", "A longer prompt about the weather today", "x"]


@pytest.fixture
def model(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer).eval()
    model.scorer = RandomScorer(base_model.config.hidden_size, len(PHRASES))
    model.set_phrases(PHRASES)
    return model


def _batch(tokenizer, prompts=PROMPTS):
    return tokenizer(prompts, return_tensors="pt", padding=True)


def test_tokens_is_the_default_readback(model):
    assert model.dynvocab_config.readback == "tokens"


def test_phrases_and_tokens_both_win_steps(model, tokenizer):
    new = model.generate(**_batch(tokenizer), max_new_tokens=20, do_sample=False)[:, -20:]
    assert (new >= model.vocab_size).any() and (new < model.vocab_size).any()


def test_cached_equals_uncached(model, tokenizer):
    batch = _batch(tokenizer)
    cached = model.generate(**batch, max_new_tokens=20, do_sample=False)
    assert torch.equal(cached, model.generate(**batch, max_new_tokens=20, do_sample=False, use_cache=False))


def test_batched_equals_single_row(model, tokenizer):
    batched = model.generate(**_batch(tokenizer), max_new_tokens=20, do_sample=False)[:, -20:]
    for row, prompt in enumerate(PROMPTS):
        single = model.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=20, do_sample=False)
        assert single[0, -20:].tolist() == batched[row].tolist()


def test_beams_cached_equal_uncached(model, tokenizer):
    batch = _batch(tokenizer)
    cached = model.generate(**batch, max_new_tokens=10, num_beams=3, do_sample=False)
    uncached = model.generate(**batch, max_new_tokens=10, num_beams=3, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


def test_the_config_gives_the_width_of_the_scores_while_generating(model, tokenizer, base_model):
    """transformers 5.17's beam search reads the scores' width off the config (5.23 reads the scores): V + P inside
    ``generate``, the LM's own V again after it."""
    from transformers import LogitsProcessorList

    seen = []

    def record(ids, scores):
        seen.append((model.config.get_text_config().vocab_size, scores.shape[-1]))
        return scores

    model.generate(**_batch(tokenizer), max_new_tokens=3, num_beams=2, logits_processor=LogitsProcessorList([record]))
    assert seen and all(width == model.vocab_size + len(PHRASES) for pair in seen for width in pair)
    assert model.config.get_text_config().vocab_size == base_model.config.vocab_size == model.vocab_size


def test_per_row_sets_are_respected(model, tokenizer):
    rows = [[PHRASES[0]], [PHRASES[1], PHRASES[2]], [PHRASES[3]]]
    model.set_phrases(rows)
    new = model.generate(**_batch(tokenizer), max_new_tokens=20, do_sample=False)[:, -20:]
    for row, allowed in enumerate(rows):
        used = {model.phrase_table.phrases[i - model.vocab_size].text for i in new[row].tolist() if i >= model.vocab_size}
        assert used <= set(allowed)


def test_the_lm_reads_exactly_the_text(model, tokenizer, base_model):
    """After a phrase, the next-id logits over tokens are the bare LM's on the decoded text."""
    ids = _batch(tokenizer, PROMPTS[:1]).input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True)
    sequence = out.sequences[0].tolist()
    step = next(i for i in range(ids.shape[1], len(sequence) - 1) if sequence[i] >= model.vocab_size)
    text_ids = tokenizer(model.decode(sequence[: step + 1]), return_tensors="pt").input_ids
    with torch.no_grad():
        expected = base_model(text_ids).logits[0, -1]
    got = out.logits[step + 1 - ids.shape[1]][0, : model.vocab_size]
    assert torch.allclose(got, expected, atol=1e-4)


def test_continuing_from_a_returned_cache(model, tokenizer):
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    whole = model.generate(ids, max_new_tokens=16, do_sample=False)
    first = model.generate(ids, max_new_tokens=8, do_sample=False, return_dict_in_generate=True)
    rest = model.generate(first.sequences, past_key_values=first.past_key_values, max_new_tokens=8, do_sample=False)
    assert torch.equal(rest, whole)


def test_sampling_runs_with_phrases(model, tokenizer):
    torch.manual_seed(0)
    out = model.generate(**_batch(tokenizer), max_new_tokens=12, do_sample=True, top_p=0.9)
    assert out.shape[1] == _batch(tokenizer).input_ids.shape[1] + 12


def test_vector_readback_still_available(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer, readback="vector").eval()
    model.scorer = RandomScorer(base_model.config.hidden_size, len(PHRASES))
    model.set_phrases(PHRASES)
    batch = _batch(tokenizer)
    cached = model.generate(**batch, max_new_tokens=12, do_sample=False)
    assert torch.equal(cached, model.generate(**batch, max_new_tokens=12, do_sample=False, use_cache=False))


def test_bad_readback_setting_is_refused(base_model, tokenizer):
    with pytest.raises(ValueError, match="readback must be 'tokens' or 'vector'"):
        DynamicVocabLM.from_causal_lm(base_model, tokenizer, readback="text")


def test_physical_layout_right_aligns_each_step():
    table, lengths = expansion_table([(7, 8, 9), (5, 6)], torch.device("cpu"))
    vocab = 100
    ids = torch.tensor([[1, 2, 100], [0, 3, 4]])  # row 0: a 3-token phrase last; row 1: left pad then tokens
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    physical = physical_inputs(ids, mask, None, vocab, table, lengths)
    assert physical.widths.tolist() == [1, 1, 3]
    assert physical.input_ids.tolist() == [[1, 2, 7, 8, 9], [0, 3, 0, 0, 4]]
    assert physical.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 0, 0, 1]]
    assert physical.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 1]]
    step = physical_inputs(torch.cat([ids, torch.tensor([[3], [101]])], 1), None, physical.widths, vocab, table, lengths)
    assert step.input_ids.tolist() == [[0, 3], [5, 6]] and step.widths.tolist() == [1, 1, 3, 2]


def test_plain_word_phrases_work_mid_sentence(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer).eval()
    model.set_phrases(["New York City"])
    assert [p.text for p in model.phrases] == ["New York City", " New York City"]
    ids = model.tokenize("New York City is big. He moved to New York City.")
    phrase_ids = [i for i in ids if i >= model.vocab_size]
    assert phrase_ids == [model.phrase_table.id_of("New York City"), model.phrase_table.id_of(" New York City")]
    model.remove_phrases(["New York City"])
    assert model.phrases == []
    model.set_phrases(["New York City"], mid_sentence_forms=False)
    assert [p.text for p in model.phrases] == ["New York City"]
    model.set_phrases(["1924"])  # " 1924" is one GPT-2 token: no mid-sentence phrase
    assert [p.text for p in model.phrases] == ["1924"]


def test_inputs_embeds_are_refused_with_the_fix(model, tokenizer):
    embeds = model.get_input_embeddings()(tokenizer("Hello", return_tensors="pt").input_ids)
    with pytest.raises(ValueError, match="needs input_ids, not inputs_embeds"):
        model.generate(inputs_embeds=embeds, max_new_tokens=2)


def test_readback_lookup_follows_table_changes(model, tokenizer):
    """After phrases are removed and added again (ids move), each phrase is still read back as its own tokens."""
    ids = _batch(tokenizer, PROMPTS[:1]).input_ids
    model.generate(ids, max_new_tokens=4, do_sample=False)  # builds the lookup for the first order
    model.remove_phrases([PHRASES[0]])
    model.add_phrases([PHRASES[0]])
    table, lengths = model._expansions(ids.device)
    for row, token_ids in enumerate(model.phrase_table.token_ids):
        assert table[row, table.shape[1] - lengths[row] :].tolist() == list(token_ids)
