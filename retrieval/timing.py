"""Stage timing of the pipeline: named stages of each request, and their summary.

All times are in seconds, read from an injectable ``clock`` (``time.perf_counter`` by
default) so that tests can drive a fake one. On a GPU pass ``synchronize=torch.cuda.synchronize``
so that queued kernels are counted in the stage that launched them. ``evals.latency``
builds its measurements on these.

    timer = StageTimer(warmup=1)
    for query in queries:
        with timer.stage("retrieve"):
            ...
        with timer.stage("decode"):
            ...
    timer.summary()["decode"].median
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["STAGES", "Clock", "LatencyStats", "StageTimer", "summarize"]

logger = logging.getLogger(__name__)

Clock = Callable[[], float]

#: the stages of one retrieval-augmented request, in order
STAGES = ("retrieve", "extract", "encode", "decode")


@dataclass(frozen=True)
class LatencyStats:
    """Summary of ``n`` timed runs in seconds; percentiles use linear interpolation (numpy's default)."""

    n: int
    mean: float
    median: float
    p10: float
    p90: float
    q1: float
    q3: float
    min: float
    max: float
    total: float

    @property
    def iqr(self) -> float:
        """Interquartile range ``q3 - q1``."""
        return self.q3 - self.q1


def summarize(samples: Sequence[float]) -> LatencyStats:
    """``LatencyStats`` of a non-empty list of durations."""
    if len(samples) == 0:
        raise ValueError("samples is empty; time at least one run after the warm-up runs")
    values = np.asarray(samples, dtype=np.float64)
    if (values < 0).any():
        raise ValueError(f"samples must be >= 0 seconds, got min {values.min()}; is the clock monotonic?")
    p10, q1, median, q3, p90 = np.percentile(values, [10, 25, 50, 75, 90])
    return LatencyStats(
        n=len(values),
        mean=float(values.mean()),
        median=float(median),
        p10=float(p10),
        p90=float(p90),
        q1=float(q1),
        q3=float(q3),
        min=float(values.min()),
        max=float(values.max()),
        total=float(values.sum()),
    )


class StageTimer:
    """Records durations of named stages (e.g. retrieve, extract, encode, decode).

    The first ``warmup`` recordings of each stage are dropped. Stages may nest; each
    records its own wall time. ``timer.durations[name]`` is the list of kept durations.
    """

    def __init__(
        self, *, warmup: int = 0, clock: Clock = time.perf_counter, synchronize: Callable[[], object] | None = None
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.warmup = warmup
        self.clock = clock
        self.synchronize = synchronize
        self.durations: dict[str, list[float]] = {}
        self._seen: dict[str, int] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the ``with`` block as one run of stage ``name`` (recorded even if the block raises)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"stage name must be a non-empty str, got {name!r}")
        if self.synchronize is not None:
            self.synchronize()
        start = self.clock()
        try:
            yield
        finally:
            if self.synchronize is not None:
                self.synchronize()
            self.record(name, self.clock() - start)

    def record(self, name: str, seconds: float) -> None:
        """Add one duration measured elsewhere (subject to the same warm-up rule)."""
        seen = self._seen.get(name, 0)
        self._seen[name] = seen + 1
        if seen >= self.warmup:
            self.durations.setdefault(name, []).append(float(seconds))

    def reset(self) -> None:
        """Forget every recording, including the warm-up counts."""
        self.durations.clear()
        self._seen.clear()

    def totals(self) -> dict[str, float]:
        """Summed kept seconds per stage, in first-recorded order."""
        return {name: float(sum(values)) for name, values in self.durations.items()}

    def summary(self) -> dict[str, LatencyStats]:
        """``LatencyStats`` per stage that has at least one kept recording."""
        return {name: summarize(values) for name, values in self.durations.items()}

    def fractions(self) -> dict[str, float]:
        """Share of the summed stage time spent in each stage (nested stages are double-counted)."""
        totals = self.totals()
        grand = sum(totals.values())
        if grand <= 0:
            raise ValueError("no time recorded yet; time some stages first")
        return {name: value / grand for name, value in totals.items()}
