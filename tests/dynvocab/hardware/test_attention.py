"""Attention over grouped key/value heads uncopied: the same numbers as transformers' SDPA, without ``repeat_kv``."""

import copy
import json

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.integrations import sdpa_attention

from dynvocab.hardware.attention import GROUPED_SDPA, use_grouped_attention
from dynvocab.loading import load_lm


def _pair(config) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    cls = LlamaForCausalLM if isinstance(config, LlamaConfig) else GPT2LMHeadModel
    plain = cls(config).eval()
    grouped = cls(copy.deepcopy(config)).eval()
    grouped.load_state_dict(plain.state_dict())
    assert use_grouped_attention(grouped)
    assert plain.config._attn_implementation == "sdpa" and grouped.config._attn_implementation == GROUPED_SDPA
    return plain, grouped


def _llama() -> LlamaConfig:
    return LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2)


def _logits(lm, ids, mask, split: int) -> list[torch.Tensor]:
    """The logits of a prefill over ``ids[:, :split]`` and of one cached forward over the rest."""
    cache = DynamicCache()
    with torch.no_grad():
        first = lm(ids[:, :split], attention_mask=mask[:, :split], past_key_values=cache).logits
        return [first, lm(ids[:, split:], attention_mask=mask, past_key_values=cache).logits]


@pytest.mark.parametrize("config", [_llama(), GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4)],
                         ids=["llama-grouped", "gpt2"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("new_tokens", [1, 2, 5])
def test_the_grouped_attention_computes_what_sdpa_computes(config, padded, new_tokens):
    plain, grouped = _pair(config)
    ids = torch.randint(0, 97, (2, 9 + new_tokens), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :4] = 0
    for expected, got in zip(_logits(plain, ids, mask, 9), _logits(grouped, ids, mask, 9)):
        torch.testing.assert_close(got[mask[:, -got.shape[1]:].bool()], expected[mask[:, -got.shape[1]:].bool()],
                                   atol=1e-6, rtol=1e-6)


def test_a_cached_forward_over_several_tokens_copies_no_key_value_heads(monkeypatch):
    plain, grouped = _pair(_llama())
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    caches = {lm: DynamicCache() for lm in (plain, grouped)}
    with torch.no_grad():
        for lm, cache in caches.items():
            lm(ids[:, :8], past_key_values=cache)

        def copied(*args, **kwargs):
            raise AssertionError("the key/value heads were copied out to every query head")

        monkeypatch.setattr(sdpa_attention, "repeat_kv", copied)
        mask = torch.ones_like(ids)  # with a mask transformers' SDPA copies them
        grouped(ids[:, 8:], attention_mask=mask, past_key_values=caches[grouped])
        with pytest.raises(AssertionError, match="copied out"):
            plain(ids[:, 8:], attention_mask=mask, past_key_values=caches[plain])


def test_greedy_generation_writes_the_same_text():
    plain, grouped = _pair(_llama())
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert grouped.generate(ids, **kwargs).tolist() == plain.generate(ids, **kwargs).tolist()
    lookup = dict(kwargs, attention_mask=torch.ones_like(ids[:1]), prompt_lookup_num_tokens=3)
    assert grouped.generate(ids[:1], **lookup).tolist() == plain.generate(ids[:1], **lookup).tolist()


def test_the_loader_attends_grouped_and_a_saved_lm_does_not_need_the_library(tiny_lm_dir, tmp_path):
    lm, _ = load_lm(str(tiny_lm_dir))
    assert lm.config._attn_implementation == GROUPED_SDPA
    lm.save_pretrained(tmp_path)
    assert GROUPED_SDPA not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
    eager = LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert not use_grouped_attention(eager)  # only an LM on SDPA changes
