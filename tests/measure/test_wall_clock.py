"""``measure.wall_clock``: the host timers every CPU benchmark and the step profile share, on a
fake clock so the arithmetic is exact."""

from __future__ import annotations

import types

import pytest

from paged_tutorial.measure import wall_clock


class FakeClock:
    """``perf_counter`` that moves only when a call of the timed function advances it; records
    every event (calls and syncs) in order."""

    def __init__(self, steps):
        self.now, self.steps, self.events = 0.0, list(steps), []

    def perf_counter(self):
        return self.now

    def work(self):
        self.events.append("call")
        self.now += self.steps.pop(0)
        return "result"

    def sync(self):
        self.events.append("sync")


@pytest.fixture
def clock(monkeypatch):
    def make(steps):
        fake = FakeClock(steps)
        monkeypatch.setattr(wall_clock, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
        return fake
    return make


def test_timed_call_returns_the_seconds_and_the_result(clock):
    fake = clock([0.25])
    assert wall_clock.timed_call(fake.work, fake.sync) == (0.25, "result")
    assert fake.events == ["call", "sync"]


def test_median_wall_ms_leaves_the_first_call_out_and_syncs_after_each(clock):
    fake = clock([9.0, 0.001, 0.003, 0.002])          # the untimed first call is slow
    assert wall_clock.median_wall_ms(fake.work, reps=3, sync=fake.sync) == pytest.approx(2.0)
    assert fake.events == ["call", "sync"] * 4


def test_per_call_us_syncs_once_after_the_burst(clock):
    fake = clock([5.0] + [1e-6] * 4)
    assert wall_clock.per_call_us(fake.work, n=4, sync=fake.sync) == pytest.approx(1.0)
    assert fake.events == ["call", "sync", "call", "call", "call", "call", "sync"]


def test_fastest_keeps_the_run_that_used_least_cpu(monkeypatch, clock):
    fake = clock([1.0, 2.0, 3.0])
    cpu = iter([0.0, 0.9, 1.0, 1.2, 2.0, 2.5])         # runs use 0.9, 0.2 and 0.5 CPU seconds
    monkeypatch.setattr(wall_clock, "cpu_seconds", lambda: next(cpu))
    assert wall_clock.fastest(fake.work, repeats=3) == {"wall_s": 2.0, "cpu_s": 0.2}
