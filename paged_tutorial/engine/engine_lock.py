"""One step at a time, and no re-entry from inside one: the thread rules of an ``Engine``.

Steps are serialized by one lock, so threads that share an engine batch their requests
together.  The thread running a step may run the callbacks of that step (``on_token``, after
the commit) and its caller's ``on_step``: from there, ``cancel`` and ``add_request`` change
the engine (the step has committed), while ``step`` / ``run_until_done`` / ``generate`` /
``stream`` are refused with a RuntimeError naming the call, since they would step an engine
that is inside a step.  A cache listener runs in the middle of the bookkeeping: it observes
and may change nothing.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from paged_tutorial.engine.interrupts import SIGNALS


class EngineLock:
    def __init__(self):
        self.lock = threading.Lock()
        self.owner: int | None = None          # thread holding the lock, while it does
        self.dispatching = False                # that thread is running on_token callbacks
        self.in_callback = threading.local()    # .depth > 0: this thread is in an on_step

    def refuse_reentry(self, what: str) -> None:
        """Raise if this thread is inside a step or a callback of this engine."""
        if self.owner == threading.get_ident() or getattr(self.in_callback, "depth", 0):
            raise RuntimeError(
                f"engine.{what}() was called from inside a callback (on_token, on_step, or a "
                "cache listener) while this engine is running on the same thread.  Collect "
                "what you need in the callback and call it after generate()/the step returns; "
                "cancel() and add_request() are allowed inside callbacks")

    def mid_step(self) -> bool:
        """This thread is inside a step's bookkeeping (a cache listener, or a stream
        garbage-collected there): a change must wait for the next step."""
        return self.owner == threading.get_ident() and not self.dispatching

    def step(self, run_step):
        """``run_step()`` holding the engine (re-entry is checked by the caller, naming
        itself).  Written out rather than as a generator context manager: an interrupt can
        then never leave the owner set with no ``finally`` pending to clear it."""
        with self.lock:
            try:
                self.owner = threading.get_ident()
                return run_step()
            finally:
                self.owner = None
                self.dispatching = False

    @contextmanager
    def state(self, what: str):
        """Hold the engine's state for a change, as a critical section: take the lock, or --
        on the thread running a step, while it runs callbacks -- go ahead (the step has
        committed)."""
        me = threading.get_ident()
        if self.owner == me:
            if not self.dispatching:
                raise RuntimeError(f"engine.{what}() cannot be called from a cache listener: "
                                   "listeners observe, they must not change the engine")
            with SIGNALS.critical():
                yield
            return
        with self.lock:
            try:
                self.owner = me
                with SIGNALS.critical():
                    yield
            finally:
                self.owner = None

    def dispatch(self, run_callbacks, *args) -> None:
        """The stepping thread runs the step's on_token callbacks: ``run_callbacks(*args)``."""
        self.dispatching = True
        try:
            run_callbacks(*args)
        finally:
            self.dispatching = False

    def call_on_step(self, on_step, report) -> None:
        """``on_step(report)``, with re-entry into the engine refused while it runs."""
        self.in_callback.depth = getattr(self.in_callback, "depth", 0) + 1
        try:
            on_step(report)
        finally:
            self.in_callback.depth -= 1
