"""``time_limit`` stops a Python loop in the calling thread, even one that swallows
exceptions, leaves nothing pending once its block is left (in a traced process too: coverage.py
traces the test run), and its watchdog ends when no limit is in force."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from paged_tutorial.teaching import time_limit as module
from paged_tutorial.teaching.time_limit import TimeLimitExceeded, time_limit


def swallowing_loop():
    n = 0
    while True:
        try:
            n += 1
        except BaseException:
            pass


def test_a_loop_that_swallows_exceptions_is_stopped_and_nothing_stays_pending():
    started = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        with time_limit(0.2) as limit:
            swallowing_loop()
    assert limit.fired and time.monotonic() - started < 5
    time.sleep(2 * module.REPEAT_S)            # nothing raised after the block was left
    total = sum(range(1000))
    assert total == 499500


def test_a_call_within_its_limit_is_untouched_and_the_watchdog_ends():
    with time_limit(5.0) as limit:
        value = sum(range(10))
    assert value == 45 and not limit.fired
    time.sleep(5 * module.POLL_S)
    assert not module._WATCHDOG and not module._ACTIVE


def test_the_inner_limit_of_nested_ones_decides():
    with pytest.raises(TimeLimitExceeded):
        with time_limit(30.0) as outer:
            with time_limit(0.2) as inner:
                swallowing_loop()
    assert inner.fired and not outer.fired


TRACED = textwrap.dedent("""
    import sys, threading
    tracer = lambda frame, event, arg: None
    sys.settrace(tracer)
    threading.settrace(tracer)
    from paged_tutorial.teaching.time_limit import TimeLimitExceeded, time_limit
    try:
        with time_limit(0.2):
            while True:
                pass
    except TimeLimitExceeded:
        pass
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    print("ended")
""")


def test_a_traced_process_runs_and_ends_threads_after_a_limit_fired():
    done = subprocess.run([sys.executable, "-c", TRACED], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ended", done.stderr
