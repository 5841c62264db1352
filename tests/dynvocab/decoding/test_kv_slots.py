"""Rows in and out of a KV cache: kept rows, slots dropped and added on the left, a joining group laid into the
batch's slots; a sliding-window cache is refused."""

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from dynvocab.decoding.kv_slots import check_layers, drop_leading_slots, join_rows, pad_leading_slots, select_rows


def cache_of(*layers: torch.Tensor) -> DynamicCache:
    """A cache whose layer ``i`` holds ``layers[i]`` as keys and ``-layers[i]`` as values, ``(B, 1, S, 1)``."""
    cache = DynamicCache()
    for index, keys in enumerate(layers):
        cache.update(keys, -keys, index)
    return cache


def slots(cache: DynamicCache, layer: int = 0) -> list[list[float]]:
    return cache.layers[layer].keys[:, 0, :, 0].tolist()


def test_rows_are_kept_and_slots_dropped_or_added_on_the_left():
    cache = cache_of(torch.arange(12.0).reshape(3, 1, 4, 1), torch.ones(3, 1, 4, 1))
    select_rows(cache, torch.tensor([2, 0]))
    assert slots(cache) == [[8, 9, 10, 11], [0, 1, 2, 3]]
    drop_leading_slots(cache, 1)
    assert slots(cache) == [[9, 10, 11], [1, 2, 3]] and slots(cache, 1) == [[1, 1, 1]] * 2
    pad_leading_slots(cache, 2)
    assert slots(cache) == [[0, 0, 9, 10, 11], [0, 0, 1, 2, 3]]
    assert cache.layers[0].values[:, 0, :, 0].tolist() == [[0, 0, -9, -10, -11], [0, 0, -1, -2, -3]]


def test_a_joining_group_lands_in_the_slots_it_is_given_with_zeros_elsewhere():
    cache = cache_of(torch.ones(1, 1, 5, 1))
    joining = cache_of(torch.tensor([[[[7.0], [8.0]]]]))
    join_rows(cache, joining, torch.tensor([2, 4]))
    assert slots(cache) == [[1, 1, 1, 1, 1], [0, 0, 7, 0, 8]]
    assert cache.layers[0].values[1, 0, :, 0].tolist() == [0, 0, -7, 0, -8]


def test_a_sliding_window_cache_is_refused_with_the_fix():
    cache = DynamicCache()
    cache.layers = [DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4)]
    with pytest.raises(ValueError, match="DynamicSlidingWindowLayer.*--max-batch-size 1"):
        check_layers(cache)
    check_layers(cache_of(torch.ones(1, 1, 2, 1)))
