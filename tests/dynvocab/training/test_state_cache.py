import numpy as np
import pytest
import torch
import torch.nn.functional as F
from accelerate import PartialState

from dynvocab import DynamicVocabLM
from dynvocab.training.collate import collate
from dynvocab.training.loss import encode_phrase_set
from dynvocab.training.readback_loss import cached_readback_loss, readback_positions, token_readback_loss
from dynvocab.training.samples import MixedSample
from dynvocab.training.state_cache import StaleCacheError, StateCache, build_state_cache, cache_key
from tests.helpers import tiny_llama

TEXTS = [
    "The cat sat on the mat, and the dog ran to the red house by the river.",
    "A big blue ship sailed to the small island where it was met by the crowd.",
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
]


def _build(llama, tokenizer, directory, **settings):
    settings = {"max_length": 8, "dtype": "float32"} | settings
    return build_state_cache(llama, tokenizer, TEXTS, directory, shard_chunks=2, **settings)


def test_cache_holds_the_lm_states_of_every_chunk(llama, tokenizer, tmp_path):
    cache = StateCache.open(_build(llama, tokenizer, tmp_path / "cache"))
    assert len(cache) > len(TEXTS)  # chunks of 8 tokens
    for index in range(len(cache)):
        ids = torch.tensor([cache.chunk_tokens(index)])
        with torch.no_grad():
            out = llama(input_ids=ids, output_hidden_states=True)
        hidden, stats = cache.states([index])
        torch.testing.assert_close(hidden[0], out.hidden_states[-1][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(stats[0, :, 0], out.logits[0].logsumexp(-1), atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(stats[0, :-1, 1], out.logits[0, :-1].gather(-1, ids[0, 1:, None])[:, 0])
        assert torch.isnan(stats[0, -1, 1])
        torch.testing.assert_close(stats[0, :, 2], out.logits[0].max(-1).values)


def test_a_resumed_build_equals_an_uninterrupted_one(llama, tokenizer, tmp_path):
    whole = _build(llama, tokenizer, tmp_path / "whole", dtype="bfloat16")
    _build(llama, tokenizer, tmp_path / "resumed", dtype="bfloat16", stop_after_shards=1)
    with pytest.raises(ValueError, match="not complete"):
        StateCache.open(tmp_path / "resumed")
    partial = StateCache.open(tmp_path / "resumed", allow_incomplete=True)  # the finished shard only
    assert partial.available.tolist() == [True] * 2 + [False] * (len(partial) - 2)
    resumed = _build(llama, tokenizer, tmp_path / "resumed", dtype="bfloat16")
    for name in ("chunks.npy", "tokens.npy", "hidden.npy", "token_stats.npy", "texts.jsonl"):
        assert (whole / name).read_bytes() == (resumed / name).read_bytes(), name


def test_a_stale_cache_is_refused_with_the_rebuild_command(llama, tokenizer, tmp_path):
    directory = _build(llama, tokenizer, tmp_path / "cache")
    other = tiny_llama(len(tokenizer), seed=1)
    hint = "dynvocab cache-states --output-dir NEW"
    with pytest.raises(StaleCacheError, match="lm .*cache-states --output-dir NEW"):
        _build(other, tokenizer, directory, rebuild_hint=hint)
    with pytest.raises(StaleCacheError, match="max_length"):
        StateCache.open(directory, cache_key(llama, tokenizer, TEXTS, 16, "float32"), hint)
    with pytest.raises(StaleCacheError, match="corpus"):
        StateCache.open(directory, cache_key(llama, tokenizer, TEXTS[:2], 8, "float32"), hint)
    StateCache.open(directory, cache_key(llama, tokenizer, TEXTS, 8, "float32"))  # the matching key opens


def _brute_force_loss(model, batch, spelling_negatives):
    """L_p as token read-back decodes: the LM runs over the plain text, the next item is scored at sigma;
    without ``spelling_negatives`` a phrase that spells the following text (and is not the target) is left out there."""
    vectors = encode_phrase_set(model, batch.phrases)
    logits = model(input_ids=batch.token_ids, attention_mask=batch.token_mask, phrase_vectors=vectors,
                   phrase_mask=batch.phrase_mask).logits  # (B, Tt, V + P)
    rows, sigma, target = readback_positions(batch)
    logits = logits[rows, sigma].float()
    if not spelling_negatives:
        V = model.vocab_size
        for k, (row, position) in enumerate(zip(rows.tolist(), sigma.tolist())):
            following = batch.token_ids[row, position + 1 : int(batch.token_mask[row].sum())].tolist()
            for p, tokens in enumerate(batch.phrases):
                if tuple(following[: len(tokens)]) == tokens and V + p != int(target[k]):
                    logits[k, V + p] = float("-inf")
    return F.cross_entropy(logits, target)


@pytest.mark.parametrize("spelling_negatives", [True, False])
def test_the_loss_from_cached_states_equals_the_loss_from_running_the_lm(llama, tokenizer, tmp_path, spelling_negatives):
    cache = StateCache.open(_build(llama, tokenizer, tmp_path / "cache", max_length=16))
    model = DynamicVocabLM.from_causal_lm(llama, tokenizer)
    torch.nn.init.normal_(model.phrase_encoder.head[-1].weight, std=0.1)  # phrases that do not tie with their first token
    first, second = sorted(range(len(cache)), key=lambda i: -len(cache.chunk_tokens(i)))[:2]
    samples = [MixedSample(cache.chunk_tokens(first), [(1, 3), (6, 9)]), MixedSample(cache.chunk_tokens(second), [(0, 4)])]
    text = samples[0].token_ids
    spelling = [tuple(text[1:4]), tuple(text[7:9]), tuple(text[2:4])]  # a gold's continuation, inside a gold, off any gold
    batch = collate(samples, negatives=[tuple(cache.chunk_tokens(2)[:3]), *spelling], vocab_size=model.vocab_size)
    hidden, stats = cache.states([first, second])
    cached = cached_readback_loss(model, batch, hidden, stats, spelling_negatives=spelling_negatives)
    reference = _brute_force_loss(model, batch, spelling_negatives)
    torch.testing.assert_close(cached["loss"], reference, atol=1e-5, rtol=1e-5)
    cached["loss"].backward()
    cached_grad = model.phrase_encoder.head[-1].weight.grad.clone()
    model.zero_grad()
    reference.backward()
    torch.testing.assert_close(cached_grad, model.phrase_encoder.head[-1].weight.grad, atol=1e-5, rtol=1e-4)
    assert 0 < cached["phrase_mass"] < 1
    uncached = token_readback_loss(model, batch, train_lm=False, spelling_negatives=spelling_negatives)
    torch.testing.assert_close(uncached["phrase"], cached["phrase"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(uncached["accuracy"], cached["accuracy"])
    torch.testing.assert_close(uncached["token"], cached["token"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(uncached["distill"], cached["distill"], atol=1e-4, rtol=1e-5)
    assert cached["distill"] > 0


def test_the_lm_phrase_logprob_from_cached_states_is_the_lms_own(llama, tokenizer, tmp_path):
    from dynvocab.training.readback_loss import lm_phrase_logprob

    cache = StateCache.open(_build(llama, tokenizer, tmp_path / "cache", max_length=16))
    index = max(range(len(cache)), key=lambda i: len(cache.chunk_tokens(i)))
    ids = torch.tensor([cache.chunk_tokens(index)])
    with torch.no_grad():
        logprobs = llama(input_ids=ids).logits[0].log_softmax(-1)
    _, stats = cache.states([index])
    for position, length in [(0, 2), (3, 4), (ids.shape[1] - 3, 2)]:
        expected = sum(float(logprobs[position + j, ids[0, position + j + 1]]) for j in range(length))
        got = lm_phrase_logprob(stats, torch.tensor([0]), torch.tensor([position]), torch.tensor([length]))
        assert abs(float(got) - expected) < 1e-4, (position, length)


def test_the_spelling_mask_marks_each_phrase_where_it_spells_the_text():
    from dynvocab.training.readback_loss import spelling_mask

    batch = collate([MixedSample([5, 6, 7, 5, 6], [(0, 2)])], negatives=[(6, 7), (5, 6, 7), (7, 5, 9)], vocab_size=10)
    rows, sigma, _ = readback_positions(batch)  # mixed items: [5 6], 7, 5, 6 at token positions 1, 2, 3, 4
    fits = spelling_mask(batch, rows, sigma)
    assert batch.phrases == [(5, 6), (6, 7), (5, 6, 7), (7, 5, 9)]
    # after token position 1 comes "7 5 6"; after 2, "5 6"; after 3, "6": only (5, 6) fits, after position 2
    assert fits.tolist() == [[False] * 4, [True, False, False, False], [False] * 4]


def test_the_lm_runs_on_the_process_device_and_goes_back(llama, tokenizer, tmp_path, monkeypatch):
    """A GPU machine caches on its GPU (``PartialState().device``), not where the LM was loaded; then it goes back."""
    moves = []
    original_to = type(llama).to

    def spy(module, *args, **kwargs):
        moves.append(torch.device(args[0]))
        return original_to(module, *args, **kwargs)

    monkeypatch.setattr(type(llama), "to", spy)
    _build(llama, tokenizer, tmp_path / "cache")
    assert moves == [PartialState().device, torch.device("cpu")]
