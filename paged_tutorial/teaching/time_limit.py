"""A time limit for the learner's code run in the notebook's own thread: a call still running
after its limit gets an exception raised inside it, so an endless loop ends the check with a
verdict and the notebook kernel stays usable.

    with time_limit(10.0) as limit:
        value = her_function(*args)
    # a call past 10 s raises TimeLimitExceeded inside her_function (limit.seconds says how long)

One watchdog thread (running while a limit is in force) looks at every limit a few times a second
and raises ``TimeLimitExceeded`` in the thread whose limit has passed, again and again until
that thread leaves its ``with`` block, so an ``except`` in her loop cannot swallow it.
``TimeLimitExceeded`` derives from ``BaseException`` for the same reason.  Python raises it at
the next bytecode: a loop of Python code always stops; a single call into C code that never
returns (a blocking read) cannot be interrupted this way.
"""

from __future__ import annotations

import ctypes
import threading
import time
from contextlib import contextmanager

#: how often the watchdog looks at the limits in force, in seconds
POLL_S = 0.05
#: how often a call past its limit gets the exception again (an ``except`` swallowed it)
REPEAT_S = 0.5
#: backward jumps at which a pending exception is delivered and dropped on release (the
#: first one delivers it)
ABSORB_STEPS = 100


class TimeLimitExceeded(BaseException):
    """Raised inside a call that ran past its ``time_limit``."""


class _Limit:
    def __init__(self, seconds: float, thread: int):
        self.seconds = seconds
        self.thread = thread
        self.deadline = time.monotonic() + seconds
        self.fired = False
        self.last_fired = 0.0


_LOCK = threading.Lock()
_ACTIVE: list[_Limit] = []
_WATCHDOG: list[threading.Thread] = []


def _set_async(thread: int, exception) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               ctypes.py_object(exception))


def _watch() -> None:
    while True:
        time.sleep(POLL_S)
        now = time.monotonic()
        with _LOCK:
            if not _ACTIVE:                   # nothing to watch: end; the next limit restarts it
                _WATCHDOG.clear()
                return
            innermost: dict[int, _Limit] = {}
            for limit in _ACTIVE:             # the earliest deadline of each thread decides
                if limit.deadline <= now and (limit.thread not in innermost or
                                              limit.deadline < innermost[limit.thread].deadline):
                    innermost[limit.thread] = limit
            for limit in innermost.values():
                if now - limit.last_fired >= REPEAT_S:
                    limit.fired, limit.last_fired = True, now
                    _set_async(limit.thread, TimeLimitExceeded)


@contextmanager
def time_limit(seconds: float):
    """Run the ``with`` block with a limit of ``seconds``: past it, ``TimeLimitExceeded`` is
    raised in this thread (and the limit's ``fired`` is set)."""
    limit = _Limit(float(seconds), threading.get_ident())
    with _LOCK:
        _ACTIVE.append(limit)
        if not _WATCHDOG:
            thread = threading.Thread(target=_watch, name="learner-time-limit", daemon=True)
            thread.start()
            _WATCHDOG.append(thread)
    try:
        yield limit
    finally:
        while True:
            try:
                _release(limit)
                break
            except TimeLimitExceeded:               # delivered while leaving: leave again
                continue


def _release(limit: _Limit) -> None:
    with _LOCK:
        if limit in _ACTIVE:
            _ACTIVE.remove(limit)
        mine = limit.fired and not any(a.thread == limit.thread and a.fired for a in _ACTIVE)
    if mine:
        _absorb_pending()


def _absorb_pending() -> None:
    """Drop a ``TimeLimitExceeded`` the watchdog raised in this thread that Python has not
    delivered yet: the watchdog no longer fires for the released limit, and a pending one
    arrives at the next check, this call (``time_limit`` then releases again) or the loop's
    first backward jump.  (Clearing it with ``PyThreadState_SetAsyncExc(id, NULL)`` instead
    leaves CPython 3.11's eval breaker set for good: every thread then stops at every check,
    and a traced process -- coverage.py's -- hangs when a thread ends.)"""
    try:
        for _ in range(ABSORB_STEPS):
            pass
    except TimeLimitExceeded:
        pass
