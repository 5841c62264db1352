"""Latency measurement: time a callable with warm-up runs excluded, or time named stages of a pipeline.

The stage timer and the summary statistics live with the pipeline that uses them
(``retrieval.timing``); they are re-exported here with ``time_callable``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from retrieval.timing import STAGES, Clock, LatencyStats, StageTimer, summarize

__all__ = ["STAGES", "LatencyStats", "StageTimer", "summarize", "time_callable"]


def time_callable(
    fn: Callable[[], object],
    *,
    repeats: int = 10,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
    synchronize: Callable[[], object] | None = None,
) -> LatencyStats:
    """Call ``fn()`` ``warmup + repeats`` times and summarize the last ``repeats`` durations."""
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments, got {type(fn).__name__}; pass e.g. lambda: f(x)")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    samples = []
    for run in range(warmup + repeats):
        if synchronize is not None:
            synchronize()
        start = clock()
        fn()
        if synchronize is not None:
            synchronize()
        if run >= warmup:
            samples.append(clock() - start)
    return summarize(samples)
