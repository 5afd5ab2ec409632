"""``measure.gpu_timers``: how many input sets a timing graph rotates among (on the CPU), and on
a GPU that the timers call the function as often as they say and time real work."""

from __future__ import annotations

import pytest
import torch

from paged_tutorial.measure import gpu_timers


def test_enough_input_sets_that_one_graph_reads_more_than_the_l2():
    assert gpu_timers.copies_for(gpu_timers.ROTATE_BYTES) == 1
    assert gpu_timers.copies_for(gpu_timers.ROTATE_BYTES // 4) == 4
    assert gpu_timers.copies_for(gpu_timers.ROTATE_BYTES // 4 - 1) == 5      # rounded up
    assert gpu_timers.copies_for(1) == gpu_timers.N_INNER      # never more than one per call
    assert gpu_timers.copies_for(0) == gpu_timers.N_INNER


@pytest.mark.gpu
def test_events_ms_calls_warmup_plus_reps_times_and_times_the_work():
    a = torch.randn(2048, 2048, device="cuda")
    calls = []

    def work():
        calls.append(1)
        for _ in range(4):
            a @ a
    ms = gpu_timers.events_ms(work, reps=5, warmup=2)
    assert len(calls) == 7 and ms > 0
    assert gpu_timers.events_ms(lambda: a @ a, reps=5) < ms


@pytest.mark.gpu
def test_graph_ms_is_per_captured_call():
    a = torch.randn(2048, 2048, device="cuda")
    out = torch.empty_like(a)
    seen = []

    def call(i):
        seen.append(i)
        torch.matmul(a, a, out=out)
    per_call = gpu_timers.graph_ms(call, n_inner=4, reps=5)
    assert seen == [0, 1, 0, 1, 2, 3]                 # two warm-up calls, then the capture
    whole = gpu_timers.events_ms(lambda: [torch.matmul(a, a, out=out) for _ in range(4)])
    assert per_call == pytest.approx(whole / 4, rel=0.5)
