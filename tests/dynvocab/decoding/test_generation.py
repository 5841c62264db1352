"""Batched generation (dynvocab.decoding.generation): left-padded rows give what each prompt gives alone, cut at their budget."""

import pytest
import torch

from dynvocab.decoding.generation import generate_continuations

PROMPTS = ["The history of", "A much longer prompt about the weather in the north of"]


def test_a_batch_gives_each_prompt_what_it_gets_alone(base_model, tokenizer):
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    batched = generate_continuations(base_model, prompts, tokenizer.eos_token_id, max_new_tokens=6, do_sample=False)
    alone = [generate_continuations(base_model, [p], tokenizer.eos_token_id, max_new_tokens=6, do_sample=False)[0] for p in prompts]
    assert batched == alone
    with torch.no_grad():
        ids = torch.tensor([prompts[0]])
        reference = base_model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert batched[0] == reference[0, ids.shape[1] :].tolist()[: len(batched[0])]


def test_each_row_stops_at_its_own_character_budget(base_model, tokenizer):
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    budgets = [3, 10_000]
    out = generate_continuations(
        base_model, prompts, tokenizer.eos_token_id, max_new_tokens=8, decode=tokenizer.decode, max_chars=budgets,
        do_sample=False,
    )
    assert len(tokenizer.decode(out[0])) >= 3 and len(tokenizer.decode(out[0][:-1])) < 3
    assert len(out[1]) == 8 or out[1][-1] == tokenizer.eos_token_id


def test_a_budget_needs_a_decoder(base_model, tokenizer):
    with pytest.raises(ValueError, match="max_chars needs decode"):
        generate_continuations(base_model, [[1, 2]], tokenizer.eos_token_id, max_new_tokens=2, max_chars=[5])
