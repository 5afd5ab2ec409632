"""Wall-clock time of work the host waits for: a function's median over synchronized calls, the
mean per call of a burst of calls, and the fastest of several runs by CPU time.

``sync`` is what makes the host wait for the work it queued (``torch.cuda.synchronize`` on a
GPU; ``no_sync`` where the work is done when the call returns)."""

from __future__ import annotations

import resource
import statistics
import time


def no_sync() -> None:
    """Nothing to wait for: the work is done when the call returns (the CPU)."""


def timed_call(fn, sync=no_sync):
    """(seconds, fn's result) of one call of ``fn()``, waited for with ``sync``."""
    t0 = time.perf_counter()
    value = fn()
    sync()
    return time.perf_counter() - t0, value


def median_wall_ms(fn, reps: int, sync=no_sync) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls, each waited for with ``sync``, after
    one untimed call."""
    fn()
    sync()
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        walls.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(walls)


def per_call_us(fn, n: int = 2000, sync=no_sync) -> float:
    """Mean microseconds per call of ``n`` calls of ``fn()`` issued back to back and waited for
    once at the end (after one untimed call): on a GPU that keeps up, the host's cost of a
    call."""
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def cpu_seconds() -> float:
    """User + system CPU seconds this process has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fastest(fn, repeats: int) -> dict:
    """``{"wall_s", "cpu_s"}`` of the run of ``fn()`` (of ``repeats``) that used the least CPU
    time, rounded to milliseconds: on a shared machine, the least disturbed."""
    best = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), cpu_seconds()
        fn()
        run = {"wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0}
        if best is None or run["cpu_s"] < best["cpu_s"]:
            best = run
    return {k: round(v, 3) for k, v in best.items()}
