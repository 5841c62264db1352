"""One decoding step's choice: the warpers and the draw are generate()'s, so a seed samples the same text."""

import pytest
import torch

from dynvocab import DynamicVocabLM, generate_grounded
from dynvocab.decoding.sampling import choose, sampling_warpers


def test_greedy_takes_no_warper_and_the_best_id():
    assert len(sampling_warpers(False, temperature=0.5, top_k=3, top_p=0.9)) == 0
    assert choose(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]]), do_sample=False).tolist() == [1, 0]


def test_warpers_come_in_generates_order_and_only_where_they_change_something():
    names = [type(w).__name__ for w in sampling_warpers(True, temperature=0.7, top_k=5, top_p=0.9)]
    assert names == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]
    assert len(sampling_warpers(True)) == 0


@pytest.mark.parametrize("settings", [{"temperature": 0.7, "top_p": 0.8}, {"temperature": 1.3, "top_p": 1.0}])
def test_a_seed_samples_generates_text_in_grounded_decoding(llama, tokenizer, settings):
    """No drafts and gamma = 1: each step draws once from the same warped law, so the seed gives generate()'s text."""
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer).eval()
    ids = tokenizer("The river rises in the hills", return_tensors="pt").input_ids
    torch.manual_seed(5)
    reference = llama.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=True, top_k=0,
                               pad_token_id=0, **settings)[0, ids.shape[1] :].tolist()
    torch.manual_seed(5)
    ours = generate_grounded(model, ids, 12, gamma=1.0, do_sample=True, **settings).sequences[0, ids.shape[1] :]
    assert ours.tolist() == reference
