"""Median milliseconds of a GPU function: timed with CUDA events, or replayed from a CUDA graph
(the launches' host cost left out)."""

from __future__ import annotations

import statistics

import torch

#: calls captured in one timing graph
N_INNER = 10
#: bytes the calls of one timing graph read in all, at least: more than the L2 cache (50 MB on
#: an H200), so that repeated calls do not read their inputs from it
ROTATE_BYTES = 256 * 2**20


def copies_for(nbytes: int) -> int:
    """Input sets to rotate among so that one graph's ``N_INNER`` calls, each reading
    ``nbytes``, read >= ``ROTATE_BYTES`` in all."""
    return max(1, min(N_INNER, -(-ROTATE_BYTES // max(1, nbytes))))


def events_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` (already compiled), timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_ms(fn, n_inner: int = N_INNER, reps: int = 20) -> float:
    """Median milliseconds per call of ``fn(i)``: ``n_inner`` calls (i = 0..n_inner-1, e.g. to
    rotate among input sets) are captured in one CUDA graph, whose replays are timed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(n_inner, 2)):
            fn(i)                                       # compile / warm up outside capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n_inner):
            fn(i)
    return events_ms(graph.replay, reps=reps) / n_inner
