"""Documents' keys and values read once and joined: the first document exactly the LM's, a later one its own states
turned to where it stands, the LM reading only what the store lacks."""

import pytest
import torch
from transformers import DynamicCache

from dynvocab.states.kv import DocumentKV, rotated_keys
from dynvocab.states.store import write_document_states
from tests.helpers import tiny_gpt2, tiny_llama

FIRST, SECOND = [5, 6, 7, 8, 9, 10], [20, 21, 22, 23]


def lm_cache(lm, ids, positions=None) -> DynamicCache:
    cache = DynamicCache()
    lm(torch.tensor([ids]), past_key_values=cache, use_cache=True,
       **({"position_ids": torch.tensor([positions])} if positions is not None else {}))
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_document_is_exactly_the_lms_keys_and_values(dtype):
    lm = tiny_llama(64).to(dtype)
    joined, own = DocumentKV(lm).cache([FIRST]), lm_cache(lm, FIRST)
    assert joined.layers[0].keys.dtype == dtype  # kept in float32, read back in the LM's dtype
    for mine, theirs in zip(joined.layers, own.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys)
        torch.testing.assert_close(mine.values, theirs.values)


def test_a_later_document_is_its_own_states_turned_to_its_positions():
    lm = tiny_llama(64)
    joined = DocumentKV(lm, batch_size=2).cache([FIRST, SECOND])
    there = lm_cache(lm, SECOND, positions=list(range(len(FIRST), len(FIRST) + len(SECOND))))  # read alone, placed
    for mine, theirs in zip(joined.layers, there.layers, strict=True):
        torch.testing.assert_close(mine.keys[:, :, len(FIRST) :], theirs.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(mine.values[:, :, len(FIRST) :], theirs.values, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(joined.layers[0].keys[:, :, len(FIRST) :], lm_cache(lm, SECOND).layers[0].keys)


def test_rotating_twice_adds_the_offsets():
    lm = tiny_llama(64)
    keys = torch.randn(2, 3, 5, lm.config.hidden_size // lm.config.num_attention_heads)
    torch.testing.assert_close(rotated_keys(lm, rotated_keys(lm, keys, 3), 4), rotated_keys(lm, keys, 7))


def test_the_prompt_after_one_cached_document_reads_what_it_reads_after_the_document():
    lm, prompt = tiny_llama(64), [30, 31, 32]
    cache = DocumentKV(lm).cache([FIRST])
    after_cache = lm(torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits
    whole = lm(torch.tensor([FIRST + prompt])).logits[:, len(FIRST) :]
    torch.testing.assert_close(after_cache, whole, atol=1e-5, rtol=1e-4)


def test_documents_are_read_once_and_then_from_a_store(tmp_path):
    lm = tiny_llama(64)
    calls = []
    lm.register_forward_hook(lambda module, args, kwargs, out: calls.append(1), with_kwargs=True)
    kv = DocumentKV(lm)
    kv.cache([FIRST, SECOND])
    kv.cache([SECOND, FIRST])
    assert len(calls) == 1 and kv.hits == 2  # one batch read both; the second request found them kept
    store = write_document_states(DocumentKV(lm, max_bytes=0), [FIRST, SECOND], tmp_path, dtype="float32")
    assert store.dim == kv.dim == 2 * 2 * 2 * 4 and store.tokens == 10  # layers, key and value, KV heads, head size
    fresh, before = DocumentKV(lm), len(calls)
    fresh.use_store(tmp_path)
    joined = fresh.cache([FIRST, SECOND])
    assert len(calls) == before and fresh.loaded == 2  # the LM read nothing
    for mine, theirs in zip(joined.layers, kv.cache([FIRST, SECOND]).layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys)


def test_refuses_an_lm_without_rotary_positions_and_a_document_longer_than_kept():
    with pytest.raises(ValueError, match="rotary position embedding.*document_kv=0"):
        DocumentKV(tiny_gpt2(64))
    with pytest.raises(ValueError, match="longer than max_tokens=4.*larger max_tokens"):
        DocumentKV(tiny_llama(64), max_tokens=4).cache([FIRST])
