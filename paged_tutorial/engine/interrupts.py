"""Deferring Ctrl-C (and other signal handlers) while the engine's bookkeeping is half done.

Python runs a signal handler -- ``KeyboardInterrupt`` is the default SIGINT handler raising --
in the main thread, between any two bytecodes.  A step's bookkeeping (admitting a request,
preempting one, pushing a slot's blocks back to ``free_blocks``, dropping a prefix record) is
many bytecodes long; an exception in the middle of one leaves a slot that is free but still
owns table entries, or a reference count one too high.  So those few pieces of code run as
*critical sections*: a signal that arrives during one is recorded, and its handler is called
as soon as the section ends, so the exception surfaces at a point where every structure
agrees with every other.  Everything else -- the model's forward pass, sampling, the user's
callbacks -- stays interruptible at once.

Why deferral and not "block the signal with ``signal.pthread_sigmask``": a mask applies to one
thread, and a process-directed signal (Ctrl-C from the terminal, a ``setitimer`` alarm) is then
delivered to any other thread that does not block it -- torch and numba start such threads --
whose C-level handler marks it, and the main thread still runs the Python handler at its next
bytecode, inside the section.  Why not "order every change so that a rollback can complete":
that holds for one interrupt only if every rollback is itself written against being cut at any
bytecode, for every allocator (the article's, the prefix cache, a puzzle's); a deferral keeps
the allocators simple.

How: a critical section on the main thread puts a small handler in place of every Python-level
handler of ``DEFERRED_SIGNALS`` (restored when the outermost section ends); inside a section it
records the signal, and the section's end calls the original handler.  A step is one section
that is *opened* for the forward pass and the callbacks: there the small handler calls the
original at once, so the exception rises exactly where it would have.  Entering and leaving a
nested section or an opening is a few attribute updates; the outermost section swaps the
handlers and back (a few microseconds, once a step).  Signal handlers only ever run in the main
thread, so on other threads there is nothing to defer and all of this is skipped.

One signal is always handled cleanly: every counter a section changes is changed with no call
in between that could run a handler, and every cleanup path enters a section of its own.  A
handler on a signal outside ``DEFERRED_SIGNALS`` is left alone (and not deferred).  An exception
raised by a deferred or passed-through handler is marked (``from_signal``), so that the engine
can tell Ctrl-C from an exception a callback raised itself.
"""

from __future__ import annotations

import signal
import threading

#: the signals whose Python handlers are deferred during critical sections (those present here)
DEFERRED_SIGNALS = tuple(getattr(signal, name) for name in (
    "SIGINT", "SIGTERM", "SIGALRM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGVTALRM",
    "SIGPROF") if hasattr(signal, name))


def from_signal(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a signal handler the deferral called (Ctrl-C), rather than
    by the code that was running."""
    return getattr(exc, "from_signal", False) is True


class SignalDeferral:
    """The process's signal deferral (one: signal handlers are per process).

    ``critical()`` marks a critical section; ``open()`` inside one lets signals through again
    for a while (the model's forward pass, the callbacks), delivering any that waited."""

    def __init__(self):
        self._saved: dict[int, object] = {}      # signal -> the handler it had before
        self._pending: list[tuple[int, object]] = []
        self._depth = 0                          # critical sections entered and not left
        self._open = False                       # inside an open(): signals go through
        self._installs = 0                       # sections that hold the handlers swapped

    @property
    def deferring(self) -> bool:
        return self._depth > 0 and not self._open

    # --- the handler -------------------------------------------------------------------------
    def _handle(self, signum, frame) -> None:
        if self._depth > 0 and not self._open:
            self._pending.append((signum, frame))
            return
        self._call(self._saved.get(signum), signum, frame)

    @staticmethod
    def _call(handler, signum, frame) -> None:
        if not callable(handler):
            return
        try:
            handler(signum, frame)
        except BaseException as exc:
            try:
                exc.from_signal = True
            except AttributeError:           # an exception type with __slots__
                pass
            raise

    def _deliver(self, handlers: dict) -> None:
        """Call the handlers of the signals that waited (the first that raises propagates;
        the others are dropped with it: one interrupt is enough)."""
        pending, self._pending = self._pending, []
        for signum, frame in pending:
            self._call(handlers.get(signum), signum, frame)

    # --- installing ----------------------------------------------------------------------------
    def _install(self) -> None:
        """Swap in the deferring handler (called with ``_depth`` > 0, so a signal arriving
        for an already swapped one is recorded); a nested section finds it in place."""
        if self._installs:
            self._installs += 1
            return
        try:
            for signum in DEFERRED_SIGNALS:
                current = signal.getsignal(signum)
                if callable(current) and current != self._handle:
                    self._saved[signum] = current
                    signal.signal(signum, self._handle)
        except BaseException:            # a handler not yet swapped ran: undo, re-raise
            self._restore()
            raise
        self._installs += 1

    def _restore(self) -> dict:
        """Put the original handlers back; returns them."""
        originals = dict(self._saved)
        for signum, original in originals.items():
            signal.signal(signum, original)
        self._saved.clear()
        return originals

    # --- the regions ---------------------------------------------------------------------------
    def critical(self) -> "_Critical":
        return _Critical(self)

    def open(self) -> "_Opening":
        return _Opening(self)


_MAIN_THREAD = threading.main_thread()


class _Critical:
    """``with`` support for a critical section (a class, not a generator: its counters change
    with no call in between)."""

    __slots__ = ("deferral", "active", "was_open")

    def __init__(self, deferral: SignalDeferral):
        self.deferral = deferral
        self.active = False
        self.was_open = False

    def __enter__(self):
        if threading.current_thread() is not _MAIN_THREAD:
            return self
        d = self.deferral
        # one line and no call: no handler can run between these updates
        d._depth += 1; self.active = True; self.was_open, d._open = d._open, False  # noqa: E702
        try:
            d._install()
        except BaseException:
            self.active = False
            d._open = self.was_open
            d._depth -= 1
            raise
        return self

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        self.active = False
        d = self.deferral
        d._installs -= 1
        try:                # the outermost section puts the original handlers back
            handlers = d._restore() if d._installs == 0 else d._saved
        finally:
            d._open = self.was_open
            d._depth -= 1
        if d._pending and not d.deferring:
            d._deliver(handlers)


class _Opening:
    """Inside a critical section: let signals through (delivering those that waited) until
    the block ends, then defer again -- also when the block raises, so that the cleanup that
    follows is protected."""

    __slots__ = ("deferral", "active")

    def __init__(self, deferral: SignalDeferral):
        self.deferral = deferral
        self.active = False

    def __enter__(self):
        d = self.deferral
        if d._depth == 0 or d._open or threading.current_thread() is not _MAIN_THREAD:
            return self
        d._open = self.active = True
        if d._pending:
            try:
                d._deliver(d._saved)
            except BaseException:
                d._open = self.active = False
                raise
        return self

    def __exit__(self, *exc) -> None:
        if self.active:
            self.deferral._open = self.active = False


#: the process's one deferral
SIGNALS = SignalDeferral()
