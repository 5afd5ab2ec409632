"""Ctrl-C at any instant: a KeyboardInterrupt raised by a signal at a random moment of
``generate`` (prefill, decode, preemption, release, the prefix cache's bookkeeping, cleanup)
leaves the engine idle and consistent, and its next request gets the tokens of a solo run.

Two ways of choosing the moment: a timer armed when ``generate`` starts (a random delay:
instants spread over time, so mostly inside the model's arithmetic), and a timer of a few
microseconds armed when the package's code has executed a random number of lines (instants
spread over the code, so the bookkeeping gets its share: the slot release, preemption and the
prefix cache's reference counts are a small part of the time but a large part of the lines).
Either way it is a real signal, handled by a Python handler raising KeyboardInterrupt, as
Ctrl-C's is."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig
from paged_tutorial.engine.interrupts import SIGNALS

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
BLOCK_SIZE = 4          # small blocks: many table entries to push, pop and share per request
BLOCK_BYTES = 2 * BLOCK_SIZE * TINY.kv_dim * 4   # float32 K and V of a block, one layer
BASE = [int(t) for t in np.random.default_rng(3).integers(1, 97, 48)]
# shared prefixes (prefix caching finds them), a prompt of whole blocks, a short one
PROMPTS = [BASE[:30], BASE[:28] + [5, 6, 7], BASE[:32], [7, 8, 9] * 4]
PROBE = BASE[:20] + [11]
MAX_NEW = 12


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


def small_engine(model, prefix_caching: bool, async_scheduling: bool = False):
    # three prompts of ~30 tokens take 48 blocks (20 sharing their prefix), growing to ~44
    # tokens they need 66 (44): with 52 (30) blocks, decode steps preempt
    return pt.Engine(model, backend="torch", max_slots=3, max_seq_len=96,
                     block_size=BLOCK_SIZE, prefix_caching=prefix_caching,
                     kv_cache_bytes=(30 if prefix_caching else 52) * BLOCK_BYTES,
                     async_scheduling=async_scheduling)


@pytest.fixture(scope="module")
def solo(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=1, max_seq_len=96)
    return {tuple(p): engine.generate([p], max_tokens=MAX_NEW)[0].token_ids
            for p in PROMPTS + [PROBE]}


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def run_with_alarm(fn, delay: float):
    """fn() with SIGALRM raising KeyboardInterrupt after ``delay`` s: (result, interrupted)."""
    previous = signal.signal(signal.SIGALRM, _raise_interrupt)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, delay)
            return fn(), False
        except KeyboardInterrupt:
            return None, True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:         # it fired just before the timer was disarmed
        return None, True
    finally:
        signal.signal(signal.SIGALRM, previous)


PACKAGE_DIR = str(Path(pt.__file__).parent)


class SignalAtLine:
    """A trace function that, when the package's code has executed ``n`` lines (0: never; it
    only counts them, in ``lines``), stops tracing and arms a timer of ``delay`` seconds: the
    signal then arrives tens of microseconds later, wherever the interpreter really checks for
    signals.  (Raising it from the trace function would run the handler at a line start, a
    point where the interpreter does not check for signals when nothing traces it.)"""

    def __init__(self, n: int = 0, delay: float = 1e-4):
        self.n, self.delay, self.lines = n, delay, 0

    def __call__(self, frame, event, arg):
        return self._line if frame.f_code.co_filename.startswith(PACKAGE_DIR) else None

    def _line(self, frame, event, arg):
        if event != "line":
            return self._line
        self.lines += 1
        if self.lines != self.n:
            return self._line
        sys.settrace(None)
        while frame is not None:
            frame.f_trace = None
            frame = frame.f_back
        signal.setitimer(signal.ITIMER_REAL, self.delay)
        return None


def run_with_signal_at_line(fn, n: int, delay: float):
    """fn() with SIGALRM raising KeyboardInterrupt ``delay`` s after the package has run n
    lines."""
    previous = signal.signal(signal.SIGALRM, _raise_interrupt)
    tracer, outer = SignalAtLine(n, delay), sys.gettrace()     # outer: coverage's, if measured
    try:
        try:
            sys.settrace(tracer)
            return fn(), False
        except KeyboardInterrupt:
            return None, True
        finally:
            sys.settrace(outer)
            signal.setitimer(signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:
        return None, True
    finally:
        signal.signal(signal.SIGALRM, previous)


def assert_idle_and_consistent(engine):
    assert not engine.has_unfinished()
    engine.scheduler.check_invariants()
    engine.cache.check_invariants()
    assert sorted(engine.scheduler.free_slots) == list(range(engine.max_slots))
    owned = [engine.cache.blocks_owned(s) for s in range(engine.max_slots)]
    assert owned == [0] * engine.max_slots, f"table entries owned per slot: {owned}"
    assert engine.num_requests == 0


def interrupt_trials(model, solo, prefix_caching: bool, trials: int, seed: int,
                     async_scheduling: bool = False) -> dict:
    engine = small_engine(model, prefix_caching, async_scheduling)
    spans = []
    for _ in range(2):
        t0 = time.perf_counter()
        results = engine.generate(PROMPTS, max_tokens=MAX_NEW)
        spans.append(time.perf_counter() - t0)
    span = min(spans)
    assert [r.token_ids for r in results] == [solo[tuple(p)] for p in PROMPTS]
    assert sum(r.num_preemptions for r in results) > 0, "the cache is meant to preempt"
    rng = np.random.default_rng(seed)
    counts = {"interrupted": 0, "completed": 0}
    for _ in range(trials):
        delay = float(rng.uniform(1e-6, 1.1 * span))
        results, interrupted = run_with_alarm(
            lambda: engine.generate(PROMPTS, max_tokens=MAX_NEW), delay)
        counts["interrupted" if interrupted else "completed"] += 1
        assert_idle_and_consistent(engine)
        if results is not None:
            assert [r.token_ids for r in results] == [solo[tuple(p)] for p in PROMPTS]
        probe = engine.generate([PROBE], max_tokens=4)[0]
        assert probe.token_ids == solo[tuple(PROBE)][:4]
        assert_idle_and_consistent(engine)
    return counts


def line_trials(model, solo, prefix_caching: bool, trials: int, seed: int,
                async_scheduling: bool = False) -> dict:
    engine = small_engine(model, prefix_caching, async_scheduling)
    engine.generate(PROMPTS, max_tokens=MAX_NEW)        # warm: the prefix cache is filled
    counter, outer = SignalAtLine(), sys.gettrace()
    sys.settrace(counter)
    try:
        engine.generate(PROMPTS, max_tokens=MAX_NEW)
    finally:
        sys.settrace(outer)
    rng = np.random.default_rng(seed)
    counts = {"interrupted": 0, "completed": 0}
    for _ in range(trials):
        results, interrupted = run_with_signal_at_line(
            lambda: engine.generate(PROMPTS, max_tokens=MAX_NEW),
            int(rng.integers(1, counter.lines + 1)), float(rng.uniform(2e-5, 2e-4)))
        counts["interrupted" if interrupted else "completed"] += 1
        assert_idle_and_consistent(engine)
        if results is not None:
            assert [r.token_ids for r in results] == [solo[tuple(p)] for p in PROMPTS]
        probe = engine.generate([PROBE], max_tokens=4)[0]
        assert probe.token_ids == solo[tuple(PROBE)][:4]
        assert_idle_and_consistent(engine)
    return counts


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_ctrl_c_at_random_lines_leaves_the_engine_idle_and_serving(tiny_model, solo,
                                                                   prefix_caching):
    counts = line_trials(tiny_model, solo, prefix_caching, trials=40, seed=3)
    assert counts["interrupted"] >= 30, counts


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_ctrl_c_at_random_lines_with_a_step_in_flight(tiny_model, solo, prefix_caching):
    """The same with asynchronous scheduling: a decode step may be launched ahead when the
    signal lands (preemptions included: the cache is small)."""
    counts = line_trials(tiny_model, solo, prefix_caching, trials=40, seed=5,
                         async_scheduling=True)
    assert counts["interrupted"] >= 30, counts


@pytest.mark.slow
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_ctrl_c_at_random_lines_many_trials(tiny_model, solo, prefix_caching):
    line_trials(tiny_model, solo, prefix_caching, trials=400, seed=4)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_ctrl_c_at_random_instants_leaves_the_engine_idle_and_serving(tiny_model, solo,
                                                                        prefix_caching):
    counts = interrupt_trials(tiny_model, solo, prefix_caching, trials=20, seed=1)
    assert counts["interrupted"] >= 10, counts       # most alarms land inside generate


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_ctrl_c_at_random_instants_with_a_step_in_flight(tiny_model, solo, prefix_caching):
    counts = interrupt_trials(tiny_model, solo, prefix_caching, trials=20, seed=6,
                              async_scheduling=True)
    assert counts["interrupted"] >= 10, counts


@pytest.mark.slow
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_ctrl_c_at_random_instants_many_trials(tiny_model, solo, prefix_caching):
    interrupt_trials(tiny_model, solo, prefix_caching, trials=600, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_ctrl_c_at_random_instants_many_trials_with_a_step_in_flight(tiny_model, solo,
                                                                     prefix_caching):
    interrupt_trials(tiny_model, solo, prefix_caching, trials=600, seed=7,
                     async_scheduling=True)


def test_a_signal_inside_a_critical_section_waits_for_its_end():
    seen = []
    previous = signal.signal(signal.SIGALRM, _raise_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            with SIGNALS.critical():
                signal.setitimer(signal.ITIMER_REAL, 1e-4)
                deadline = time.perf_counter() + 0.05      # the alarm fires meanwhile
                while time.perf_counter() < deadline:
                    pass
                seen.append("section finished")
        assert seen == ["section finished"]
        assert signal.getsignal(signal.SIGALRM) is _raise_interrupt     # handler restored
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_model_run_stays_interruptible_inside_a_step(tiny_model):
    """The forward pass is not deferred: an alarm during it interrupts the step at once, and
    the step is rolled back (the request is recomputed later with the same tokens)."""
    engine = pt.Engine(tiny_model, backend="torch", max_slots=1, max_seq_len=96)
    request = engine.add_request([1, 2, 3], max_tokens=4)
    seen = []

    def slow_forward(*args, **kwargs):
        seen.append("forward")
        signal.setitimer(signal.ITIMER_REAL, 1e-4)
        time.sleep(5)                  # the alarm interrupts the sleep
        seen.append("not interrupted")

    engine.model_runner.network.forward = slow_forward
    previous = signal.signal(signal.SIGALRM, _raise_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.step()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert seen == ["forward"]
    assert request.status.value == "waiting" and request.num_preemptions == 1
    engine.scheduler.check_invariants()
    engine.cache.check_invariants()
