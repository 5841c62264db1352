import pytest

from evals import StageTimer, summarize, time_callable


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_summarize_by_hand():
    stats = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (stats.n, stats.mean, stats.median, stats.min, stats.max, stats.total) == (5, 3.0, 3.0, 1.0, 5.0, 15.0)
    # linear interpolation at rank 0.1 * 4 = 0.4 and 0.9 * 4 = 3.6
    assert stats.p10 == pytest.approx(1.4)
    assert stats.p90 == pytest.approx(4.6)
    assert (stats.q1, stats.q3, stats.iqr) == (2.0, 4.0, 2.0)


def test_time_callable_excludes_warmup_runs():
    clock = FakeClock()
    durations = iter([50.0, 40.0, 1.0, 2.0, 3.0])  # two slow warm-up runs, then three timed runs
    stats = time_callable(lambda: clock.advance(next(durations)), repeats=3, warmup=2, clock=clock)
    assert stats.n == 3
    assert stats.median == pytest.approx(2.0)
    assert stats.max == pytest.approx(3.0)


def test_time_callable_calls_synchronize_around_each_run():
    calls = []
    time_callable(lambda: calls.append("run"), repeats=2, warmup=1, synchronize=lambda: calls.append("sync"))
    assert calls == ["sync", "run", "sync"] * 3


def test_stage_timer_records_named_stages_and_skips_warmup():
    clock = FakeClock()
    timer = StageTimer(warmup=1, clock=clock)
    for step in range(3):
        with timer.stage("retrieve"):
            clock.advance(10.0 if step == 0 else 1.0)
        with timer.stage("decode"):
            with timer.stage("encode"):
                clock.advance(0.5)
            clock.advance(2.0 + step)
    assert timer.durations == {"retrieve": [1.0, 1.0], "decode": [3.5, 4.5], "encode": [0.5, 0.5]}
    assert timer.totals() == {"retrieve": 2.0, "decode": 8.0, "encode": 1.0}
    assert timer.summary()["decode"].median == pytest.approx(4.0)
    assert timer.fractions()["retrieve"] == pytest.approx(2.0 / 11.0)
    timer.reset()
    assert timer.durations == {} and timer.summary() == {}


def test_stage_is_recorded_when_the_block_raises():
    clock = FakeClock()
    timer = StageTimer(clock=clock)
    with pytest.raises(RuntimeError):
        with timer.stage("extract"):
            clock.advance(0.25)
            raise RuntimeError("boom")
    assert timer.durations == {"extract": [0.25]}


def test_bad_inputs():
    with pytest.raises(ValueError, match="samples is empty"):
        summarize([])
    with pytest.raises(ValueError, match="repeats"):
        time_callable(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="no time recorded"):
        StageTimer().fractions()
    with pytest.raises(ValueError, match="stage name"):
        with StageTimer().stage(""):
            pass
