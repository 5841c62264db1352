import copy

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from dynvocab import DynamicVocabLM, Phrase
from dynvocab.scoring.dot_product import DotProductScorer

PHRASES = [" New York City", " the United States", Phrase(" of the", source="doc-1"), " in the"]
TEXT = "He moved from New York City to the United States in the spring of the year."


class BoostedScorer(DotProductScorer):
    """Adds a large bonus to chosen phrases so that greedy decoding must pick them."""

    def __init__(self, boost: dict[int, float]) -> None:
        super().__init__()
        self.boost = boost

    def forward(self, hidden, phrase_vectors, phrase_mask=None):
        scores = hidden @ phrase_vectors.to(hidden.dtype).T
        for index, bonus in self.boost.items():
            scores[..., index] += bonus
        if phrase_mask is not None:
            scores = scores.masked_fill(~phrase_mask[:, None, :], float("-inf"))
        return scores


@pytest.fixture
def model(base_model, tokenizer):
    return DynamicVocabLM.from_causal_lm(base_model, tokenizer).eval()


def test_empty_phrase_set_is_the_bare_lm(base_model, tokenizer):
    model = DynamicVocabLM.from_causal_lm(base_model, tokenizer).eval()
    batch = tokenizer(["Hello world, this is", "A longer prompt about the weather"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, base_model(**batch).logits)
    expected = base_model.generate(**batch, max_new_tokens=10, do_sample=False)
    assert torch.equal(model.generate(**batch, max_new_tokens=10, do_sample=False), expected)


def test_logits_cover_tokens_and_phrases(model, base_model, tokenizer):
    model.set_phrases(PHRASES)
    ids = torch.tensor([model.tokenize(TEXT)])
    assert (ids >= model.vocab_size).sum() == 4
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.vocab_size + len(PHRASES))
    plain = torch.tensor([tokenizer(TEXT).input_ids[:3]])
    with torch.no_grad():
        assert torch.allclose(model(plain).logits[..., : model.vocab_size], base_model(plain).logits)


def test_cached_logits_equal_uncached(model):
    model.set_phrases(PHRASES)
    ids = torch.tensor([model.tokenize(TEXT)])
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :3], use_cache=True)
        steps = [out.logits[:, -1]]
        for t in range(3, ids.shape[1]):
            out = model(ids[:, t : t + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 2:], rtol=1e-4, atol=1e-5)


def test_a_phrase_is_generated_in_one_step_and_fed_back_as_one_input(model, tokenizer):
    model.set_phrases(PHRASES)
    model.scorer = BoostedScorer({0: 1e4})
    prompt = tokenizer(["He lives in"], return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=3, do_sample=False)
    new = out[0, prompt.input_ids.shape[1] :].tolist()
    assert new == [model.vocab_size] * 3
    assert model.decode(new) == " New York City" * 3


def test_sampling_beams_and_generation_options(model, tokenizer):
    model.set_phrases(PHRASES)
    prompt = tokenizer(["He lives in", "The capital of"], return_tensors="pt", padding=True)
    seen = []

    class Collect(BaseStreamer):
        def put(self, value):
            seen.append(value)

        def end(self):
            seen.append("end")

    class StopAtFour(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= prompt.input_ids.shape[1] + 4)

    torch.manual_seed(0)
    sampled = model.generate(
        **prompt, max_new_tokens=12, do_sample=True, top_p=0.9, top_k=50, temperature=0.7, repetition_penalty=1.3,
        stopping_criteria=StoppingCriteriaList([StopAtFour()]),
    )
    assert sampled.shape[1] == prompt.input_ids.shape[1] + 4
    assert int(sampled.max()) < model.vocab_size + len(PHRASES)
    beams = model.generate(**prompt, max_new_tokens=5, num_beams=3, num_return_sequences=2, do_sample=False)
    assert beams.shape[0] == 4
    model.generate(prompt.input_ids[:1], max_new_tokens=3, streamer=Collect())
    assert seen[-1] == "end" and len(seen) == 5


def test_text_streamer_prints_phrases(model, tokenizer, capsys):
    model.set_phrases(PHRASES)
    model.scorer = BoostedScorer({1: 1e4})
    model.generate(tokenizer(["Welcome to"], return_tensors="pt").input_ids, max_new_tokens=2, streamer=model.text_streamer())
    assert " the United States the United States" in capsys.readouterr().out


def test_each_row_keeps_its_own_phrase_set(model, tokenizer):
    model.set_phrases([[" New York City", " of the"], [" the United States"]])
    model.scorer = BoostedScorer({i: 1e4 for i in range(3)})
    prompt = tokenizer(["He lives in", "The capital of the"], return_tensors="pt", padding=True)
    rows = {0: {model.phrase_table.id_of(" New York City"), model.phrase_table.id_of(" of the")},
            1: {model.phrase_table.id_of(" the United States")}}
    for kwargs in ({"do_sample": False}, {"num_beams": 2, "num_return_sequences": 2}, {"do_sample": True, "top_k": 5}):
        out = model.generate(**prompt, max_new_tokens=4, **kwargs)
        per_row = out.shape[0] // 2
        for row, sequence in enumerate(out):
            new = set(sequence[prompt.input_ids.shape[1] :].tolist())
            own, other = rows[row // per_row], rows[1 - row // per_row]
            assert new & own and not new & other, (kwargs, row, new)


def test_left_padded_batch_matches_single_rows(model, tokenizer):
    model.set_phrases(PHRASES)
    prompts = ["He lives in", "The capital city of the United States is"]
    batch = model.generate(**tokenizer(prompts, return_tensors="pt", padding=True), max_new_tokens=6, do_sample=False)
    for row, prompt in enumerate(prompts):
        single = model.generate(**tokenizer([prompt], return_tensors="pt"), max_new_tokens=6, do_sample=False)
        assert batch[row, -6:].tolist() == single[0, -6:].tolist()


def test_ids_past_the_table_are_rejected(model):
    model.set_phrases(PHRASES)
    with pytest.raises(ValueError, match="past the vocabulary"):
        model(torch.tensor([[1, model.vocab_size + len(PHRASES)]]))


def test_per_row_sets_need_one_list_per_prompt(model, tokenizer):
    model.set_phrases([[" New York City"], [" of the"]])
    with pytest.raises(ValueError, match="one list per prompt"):
        model.generate(tokenizer(["one prompt"], return_tensors="pt").input_ids, max_new_tokens=2)


def test_labels_give_the_mixed_vocabulary_loss(model):
    model.set_phrases(PHRASES)
    ids = torch.tensor([model.tokenize(TEXT)])
    out = model(ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:])
    torch.testing.assert_close(out.loss, expected)


def test_wraps_a_peft_model(llama, tokenizer):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(llama, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    model = DynamicVocabLM.from_causal_lm(peft_model, tokenizer).eval()
    ids = tokenizer(["Hello world"], return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, peft_model(input_ids=ids).logits)
    model.set_phrases(PHRASES)
    assert model.generate(ids, max_new_tokens=4).shape == (1, ids.shape[1] + 4)


def test_embeddings_are_not_copied(model):
    lm_embeddings = model.lm.get_input_embeddings().weight
    assert model.phrase_encoder.body.get_input_embeddings().weight.data_ptr() == lm_embeddings.data_ptr()
    assert not any("embed_tokens" in k or "wte" in k for k in model.phrase_encoder.trainable_state_dict())


def test_a_bfloat16_phrase_table_scores_close_to_float32(base_model, tokenizer):
    exact = DynamicVocabLM.from_causal_lm(copy.deepcopy(base_model), tokenizer).eval()
    half = DynamicVocabLM.from_causal_lm(base_model, tokenizer, phrase_dtype="bfloat16").eval()
    half.phrase_encoder.load_state_dict(exact.phrase_encoder.state_dict())
    for model in (exact, half):
        model.set_phrases(PHRASES)
    assert half.phrase_table.output_vectors.dtype == torch.bfloat16
    ids = torch.tensor([exact.tokenize(TEXT)])
    with torch.no_grad():
        a, b = exact(ids).logits, half(ids).logits
    assert b.dtype == torch.float32
    torch.testing.assert_close(b[..., : exact.vocab_size], a[..., : exact.vocab_size])
    torch.testing.assert_close(b[..., exact.vocab_size :], a[..., exact.vocab_size :], rtol=0.02, atol=0.02)


def test_a_bfloat16_encoder_pass_gives_vectors_close_to_float32(base_model, tokenizer):
    exact = DynamicVocabLM.from_causal_lm(copy.deepcopy(base_model), tokenizer, encode_dtype="float32").eval()
    fast = DynamicVocabLM.from_causal_lm(base_model, tokenizer, encode_dtype="bfloat16").eval()
    fast.phrase_encoder.load_state_dict(exact.phrase_encoder.state_dict())
    for model in (exact, fast):
        model.set_phrases(PHRASES)
    a, b = exact.phrase_table.output_vectors, fast.phrase_table.output_vectors
    assert b.dtype == torch.float32  # stored in phrase_dtype; only the pass ran in bfloat16
    assert not torch.equal(a, b)
    assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.999
    torch.testing.assert_close(fast._cached_input_vectors([0, 1]), exact._cached_input_vectors([0, 1]), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("bf16_cpu, expected", [(True, torch.bfloat16), (False, None)])
def test_auto_encode_dtype_uses_bfloat16_only_where_the_cpu_computes_it(monkeypatch, bf16_cpu, expected):
    from dynvocab.hardware.precision import encode_autocast_dtype

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16_cpu)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert encode_autocast_dtype("auto", torch.device("cpu")) is expected
    assert encode_autocast_dtype("float32", torch.device("cpu")) is None
    assert encode_autocast_dtype("float16", torch.device("cpu")) is torch.float16


def test_generate_continuations_stops_each_row_at_its_own_character_budget(llama, tokenizer):
    from dynvocab.decoding.generation import generate_continuations

    prompts = [tokenizer("The cat sat")["input_ids"], tokenizer("A much longer prompt about the city of Rome")["input_ids"]]
    new = generate_continuations(llama, prompts, tokenizer.eos_token_id, 40, decode=tokenizer.decode, max_chars=[5, 25])
    for ids, budget in zip(new, (5, 25)):
        text = tokenizer.decode(ids)
        assert len(text) >= budget and len(tokenizer.decode(ids[:-1])) < budget
    unbounded = generate_continuations(llama, prompts, tokenizer.eos_token_id, 6)
    assert [len(ids) for ids in unbounded] == [6, 6]
    with pytest.raises(ValueError, match="needs decode"):
        generate_continuations(llama, prompts, tokenizer.eos_token_id, 6, max_chars=[5, 5])


def test_continuations_end_at_their_first_end_of_text_token_which_counts_as_a_step(llama, tokenizer):
    from dynvocab.decoding.generation import generate_continuations

    prompts = [tokenizer("The cat sat")["input_ids"], tokenizer("A much longer prompt about Rome")["input_ids"]]
    free = generate_continuations(llama, prompts, tokenizer.eos_token_id, 8, eos_token_id=-5)
    stop = free[0][2]
    first = free[0].index(stop)
    ended = generate_continuations(llama, prompts, tokenizer.eos_token_id, 8, eos_token_id=stop)
    assert ended[0] == free[0][: first + 1]
    # padding with the end-of-text id: a row stopped by its budget does not count the padding
    budget = len(tokenizer.decode(free[1][:2]))
    padded = generate_continuations(llama, prompts, stop, 8, decode=tokenizer.decode, max_chars=[10**6, budget],
                                    eos_token_id=stop)
    assert padded[0] == free[0][: first + 1] and padded[1] == free[1][: len(padded[1])]
    assert len(tokenizer.decode(padded[1])) >= budget > len(tokenizer.decode(padded[1][:-1]))


def test_a_plain_forward_applies_the_per_row_phrase_sets(model, tokenizer):
    model.set_phrases([[" New York City"], [" of the", " the United States"]])
    ids = tokenizer(["He lives in", "The capital of"], return_tensors="pt", padding=True).input_ids
    phrase_logits = model(ids).logits[:, -1, model.vocab_size :]
    first, second, third = (model.phrase_table.id_of(p) - model.vocab_size for p in
                            (" New York City", " of the", " the United States"))
    assert torch.isfinite(phrase_logits[0, first]) and torch.isinf(phrase_logits[0, [second, third]]).all()
    assert torch.isinf(phrase_logits[1, first]) and torch.isfinite(phrase_logits[1, [second, third]]).all()


def test_add_phrases_after_per_row_sets_gives_the_new_phrase_to_every_row(model):
    model.set_phrases([[" New York City"], [" of the"]])
    model.add_phrases([" the United States"], mid_sentence_forms=False)
    new = model.phrase_table.id_of(" the United States") - model.vocab_size
    old = [model.phrase_table.id_of(p) - model.vocab_size for p in (" New York City", " of the")]
    masks = model._default_row_mask(2)
    assert masks[:, new].all()
    assert masks[0, old].tolist() == [True, False] and masks[1, old].tolist() == [False, True]
