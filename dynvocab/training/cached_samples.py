"""Training samples over a state cache's chunks: each sample knows the cached states it is scored on.

Every 50th text of the cache (``VALIDATION_EVERY``; texts 49, 99, ...) is held out: it never trains, and the
trainer's ``eval_every`` figures are scored on its chunks, so a learning curve is honest.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from .samples import MixedSample, SpanSampler
from .state_cache import StateCache

__all__ = ["VALIDATION_EVERY", "cached_sample_stream", "chunk_sample", "split_chunks"]

VALIDATION_EVERY = 50


def split_chunks(cache: StateCache) -> tuple[list[int], list[int]]:
    """``(training, held-out)`` chunk indices: the chunks of every ``VALIDATION_EVERY``-th text are held out
    (none of a corpus of fewer texts)."""
    held_out = cache.chunks[:, 0] % VALIDATION_EVERY == VALIDATION_EVERY - 1
    training, validation = ~held_out & cache.available, held_out & cache.available
    return [int(i) for i in training.nonzero()[0]], [int(i) for i in validation.nonzero()[0]]


def chunk_sample(cache: StateCache, index: int, tokenizer, sampler: SpanSampler, rng: random.Random) -> MixedSample:
    """The sampler's phrase spans over cached chunk ``index`` (with the character offsets it needs)."""
    text_index, begin, end, _ = (int(v) for v in cache.chunks[index])
    tokens = cache.chunk_tokens(index)
    if not sampler.needs_text:
        return sampler(tokens, rng=rng)
    text = cache.texts[text_index]
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return sampler(tokens, text=text, offsets=[tuple(o) for o in offsets[begin:end]], rng=rng)


def cached_sample_stream(
    cache: StateCache, tokenizer, sampler: SpanSampler, batch_size: int, seed: int, shard: int = 0, num_shards: int = 1
) -> Iterator[list[tuple[int, MixedSample]]]:
    """Endless batches of ``(chunk index, sample)`` over the training chunks, reshuffled each epoch with ``seed + epoch``.

    Like ``trainer.sample_stream``: the same for the same arguments (a resume skips ahead), and shard ``shard`` gets the
    ``shard``-th ``batch_size`` of each global batch. Samples without a phrase are skipped.
    """
    training, _ = split_chunks(cache)
    if not training:
        raise ValueError(f"the state cache {cache.directory} holds no training chunk; build it over more texts")
    rng = random.Random(seed)

    def samples() -> Iterator[tuple[int, MixedSample]]:
        for epoch in itertools.count():
            produced = False
            for index in random.Random(seed + epoch).sample(training, len(training)):
                sample = chunk_sample(cache, index, tokenizer, sampler, rng)
                if sample.phrase_spans:
                    produced = True
                    yield index, sample
            if not produced:
                raise ValueError(
                    f"the state cache {cache.directory} yields no training sample with a phrase (its texts are too "
                    "short); pass texts of a few sentences each, or lower --min-gap"
                )

    stream = samples()
    while True:
        batch = [next(stream) for _ in range(batch_size * num_shards)]
        yield batch[shard * batch_size : (shard + 1) * batch_size]
