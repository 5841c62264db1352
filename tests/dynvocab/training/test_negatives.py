import copy
import json

import pytest
import torch

from dynvocab.tokens.ngrams import SuccessorIndex
from dynvocab.training.negatives import (
    SOURCES,
    NegativeSampler,
    PreBatchQueue,
    generation_negatives,
    greedy_continuations,
    group_by_prefix,
    prefix_groups,
    prefix_negatives,
    self_retrieval_negatives,
)
from dynvocab.training.samples import MixedSample

VOCAB = 64


@pytest.fixture(scope="module")
def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=VOCAB
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def tiny_llama(_tiny_llama):
    return copy.deepcopy(_tiny_llama)


@pytest.fixture(scope="module")
def tiny_gpt2():
    """Absolute learned positions (large init so they matter): wrong position ids change the argmax."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=16, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=32, initializer_range=0.5,
        bos_token_id=0, eos_token_id=0,
    )
    return GPT2LMHeadModel(config).eval()


def unpadded_greedy(model, phrase, n):
    """Reference: no batching, no padding, no cache."""
    ids = torch.tensor([list(phrase)])
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(phrase) :].tolist()


def test_prefix_negatives_excludes_single_tokens_and_the_phrase():
    assert prefix_negatives((1, 2, 3, 4)) == [(1, 2), (1, 2, 3)]
    assert prefix_negatives((1, 2)) == []
    assert prefix_negatives([7]) == []


def test_self_retrieval_negatives_extend_within_the_sample():
    sample = MixedSample([10, 11, 12, 13, 14, 15, 16], [(0, 2), (4, 6)])
    assert self_retrieval_negatives(sample, 0, n=3) == [(10, 11, 12), (10, 11, 12, 13), (10, 11, 12, 13, 14)]
    assert self_retrieval_negatives(sample, 1, n=3) == [(14, 15, 16)]  # the sample ends
    assert self_retrieval_negatives(sample, 0, n=3, max_phrase_tokens=3) == [(10, 11, 12)]


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
def test_generation_left_padding_matches_unpadded_greedy(name, request):
    model = request.getfixturevalue(name)
    phrases = [(5, 6), (7, 8, 9, 10, 11, 12, 13), (12, 13, 14), (3, 4), (40, 41, 42, 43)]
    batched = greedy_continuations(model, phrases, n=4, pad_token_id=0)
    assert batched.shape == (5, 4)
    for row, phrase in enumerate(phrases):
        assert batched[row].tolist() == unpadded_greedy(model, phrase, 4)


def test_generation_negatives_order_batches_and_mode(tiny_llama):
    phrases = [(5, 6, 7), (8, 9), (10, 11, 12, 13)]
    tiny_llama.train()
    found = generation_negatives(tiny_llama, phrases, n=2, batch_size=2)
    assert tiny_llama.training  # mode restored
    expected = []
    for phrase in phrases:
        continuation = unpadded_greedy(tiny_llama.eval(), phrase, 2)
        expected += [phrase + tuple(continuation[:1]), phrase + tuple(continuation)]
    assert found == expected
    with pytest.raises(ValueError, match="n="):
        generation_negatives(tiny_llama, phrases, n=0)


def test_prebatch_queue_keeps_last_k_batches():
    queue = PreBatchQueue(num_batches=2)
    assert queue.get() == []
    queue.push([(1, 2)])
    queue.push([(3, 4), (1, 2)])
    queue.push([(5, 6)])
    assert len(queue) == 2
    assert queue.get() == [(5, 6), (3, 4), (1, 2)]
    with pytest.raises(ValueError, match="num_batches"):
        PreBatchQueue(0)


def make_batch():
    return [
        MixedSample([1, 2, 3, 4, 5, 6, 7, 8], [(0, 3), (5, 7)]),  # golds (1,2,3), (6,7)
        MixedSample([9, 1, 2, 3, 4, 10], [(1, 4)]),  # gold (1,2,3) again
    ]


def test_negative_sampler_prefix_and_self_retrieval():
    sampler = NegativeSampler(["prefix", "self-retrieval"], retrieval_tokens=2)
    negatives = sampler(make_batch())
    assert negatives == [(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5), (6, 7, 8), (1, 2, 3, 4, 10)]
    assert len(negatives) == len(set(negatives))


def test_negative_sampler_removes_golds_and_single_tokens():
    # in this corpus (6,7) continues as the gold (6,7,1), and (6,7,1)'s prefix (6,7) is a gold too
    index = SuccessorIndex([[6, 7, 1, 2, 3], [1, 2, 3, 9]])
    batch = [MixedSample([6, 7, 0, 0, 0, 1, 2, 3], [(0, 2), (5, 8)]), MixedSample([6, 7, 1, 0], [(0, 3)])]
    golds = {(6, 7), (1, 2, 3), (6, 7, 1)}
    sampler = NegativeSampler(["in-batch", "prefix", "corpus-retrieval"], successor_index=index, retrieval_tokens=1)
    negatives = sampler(batch)
    assert sampler.in_batch
    assert not golds & set(negatives)
    assert all(len(p) >= 2 for p in negatives)
    assert negatives == [(1, 2), (1, 2, 3, 9), (6, 7, 1, 2)]


def test_negative_sampler_prebatch_uses_previous_batches_only():
    sampler = NegativeSampler(["pre-batch"], num_prebatches=1)
    first = [MixedSample([1, 2, 3], [(0, 2)])]
    second = [MixedSample([4, 5, 6, 1, 2], [(0, 2), (3, 5)])]
    assert sampler(first) == []
    assert sampler(second) == []  # (1,2) came back as a gold of this batch
    assert sampler(first) == [(4, 5)]


def test_negative_sampler_generation_and_max_negatives(tiny_llama):
    batch = [MixedSample([5, 6, 7, 8, 9], [(0, 2)])]
    sampler = NegativeSampler(["generation"], model=tiny_llama, generation_tokens=3)
    continuation = unpadded_greedy(tiny_llama, (5, 6), 3)
    assert sampler(batch) == [(5, 6) + tuple(continuation[:j]) for j in (1, 2, 3)]
    capped = NegativeSampler(["generation"], model=tiny_llama, generation_tokens=3, max_negatives=2)(batch)
    assert len(capped) == 2 and set(capped) < set(sampler(batch))


def test_negative_sampler_rejects_bad_configs():
    with pytest.raises(ValueError, match="valid|choose from") as error:
        NegativeSampler(["prefix", "nearest"])
    assert all(name in str(error.value) for name in SOURCES)
    with pytest.raises(ValueError, match="successor_index"):
        NegativeSampler(["corpus-retrieval"])
    with pytest.raises(ValueError, match="model"):
        NegativeSampler(["generation"])


def test_group_by_prefix_covers_every_phrase():
    phrases = [(1, 2, 3, 4), (1, 2), (5, 6), (1, 2, 3), (5, 6, 7), (1, 2, 9), (8, 9), (1, 2)]
    groups = prefix_groups(phrases)
    assert group_by_prefix(phrases) == groups.groups
    assert groups.groups == [((1, 2, 3, 4), [2, 3, 4]), ((1, 2, 9), [3]), ((5, 6, 7), [2, 3]), ((8, 9), [2])]
    for i, phrase in enumerate(phrases):
        longest, lengths = groups.groups[groups.group_of[i]]
        assert longest[: groups.length_of[i]] == phrase
        assert groups.length_of[i] in lengths
    # every (group, length) slot is used by some input: nothing is encoded for nothing
    used = {(g, n) for g, n in zip(groups.group_of, groups.length_of)}
    assert used == {(g, n) for g, (_, lengths) in enumerate(groups.groups) for n in lengths}
    # gather with the causal trick's index arrays
    hidden = torch.arange(4 * 4).reshape(4, 4, 1)
    vectors = hidden[torch.tensor(groups.group_of), torch.tensor(groups.length_of) - 1]
    assert vectors.shape == (len(phrases), 1)
    with pytest.raises(ValueError, match="empty"):
        prefix_groups([(1,), ()])


def test_negative_sampler_state_dict_resumes_exactly():
    batches = [[MixedSample([i, i + 1, i + 2, 0, 0, 0, 0], [(0, 3)])] for i in range(1, 30, 3)]
    sampler = NegativeSampler(["pre-batch", "prefix"], num_prebatches=2, max_negatives=2, seed=1)
    for batch in batches[:4]:
        sampler(batch)
    state = json.loads(json.dumps(sampler.state_dict()))  # a checkpoint keeps it as JSON, never pickled
    expected = [sampler(batch) for batch in batches[4:]]
    resumed = NegativeSampler(["pre-batch", "prefix"], num_prebatches=2, max_negatives=2, seed=99)
    resumed.load_state_dict(state)
    assert [resumed(batch) for batch in batches[4:]] == expected


def test_same_text_negatives_are_other_candidate_spans_of_the_sample_never_its_golds():
    import random

    from dynvocab.training.negatives import same_text_negatives

    sample = MixedSample([1, 2, 3, 4, 5, 6, 7], [(0, 2)], candidate_spans=[(0, 2), (2, 4), (3, 6), (4, 6), (5, 7)])
    drawn = same_text_negatives(sample, 3, random.Random(0))
    assert len(drawn) == 3 and len(set(drawn)) == 3
    assert set(drawn) <= {(3, 4), (4, 5, 6), (5, 6), (6, 7)} and (1, 2) not in drawn
    assert sorted(same_text_negatives(sample, 10, random.Random(0))) == [(3, 4), (4, 5, 6), (5, 6), (6, 7)]
    sampler = NegativeSampler(["same-text"], seed=0)
    assert set(sampler([sample])) <= {(3, 4), (4, 5, 6), (5, 6), (6, 7)}


def test_a_sampler_records_every_span_it_could_have_chosen():
    import random

    from dynvocab.training.samples import NIdsSampler

    sample = NIdsSampler(min_tokens=2, max_tokens=3, min_gap=1, phrase_prob=0.0)(list(range(5)), rng=random.Random(0))
    assert sample.phrase_spans == []
    assert sorted(sample.candidate_spans) == [(0, 2), (0, 3), (1, 3), (1, 4), (2, 4), (2, 5), (3, 5)]
