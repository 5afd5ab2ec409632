"""Ctrl-C from the command's first instant: one line on standard error and exit status 130.

Python's own SIGINT handler raises ``KeyboardInterrupt`` between any two bytecodes.  While
torch, numpy or numba are importing that leaves a module half-imported (a later import then
fails with an ``AttributeError`` about a name the module never got), and a library that
catches every exception while it starts may swallow the interrupt.  So while the command
starts and while it answers, SIGINT does not raise: it writes the line and ends the process
at once (``os._exit``; the answer is flushed piece by piece, so what was already shown stays
shown).  Nothing needs unwinding, because the process ends.

The interactive chat keeps its session across a Ctrl-C: while an answer is generated (and
while it waits for the next line) ``KeyboardInterrupt`` is raised as usual, inside
``raising()``, and the engine's critical sections (``engine/interrupts.py``) keep its
bookkeeping whole.

Only the program's own process takes these handlers (``take_over``); a caller that runs
``main([...])`` in its process (a test, a notebook) keeps its own.  A process started with
SIGINT ignored (``nohup``, a background job of a shell without job control) keeps it ignored.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager

EXIT_INTERRUPTED = 130          # 128 + SIGINT: what a shell reports for Ctrl-C
INTERRUPTED_LINE = "error: interrupted (Ctrl-C)"


def _exit_now(signum, frame) -> None:
    """Flush what the answer already holds, say so in one line, and end the process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # a second Ctrl-C changes nothing
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:        # noqa: BLE001 - interrupted mid-write, closed, full
            pass
    try:
        os.write(2, f"\n{INTERRUPTED_LINE}\n".encode())
    except OSError:                  # standard error closed or full: the status says it
        pass
    os._exit(EXIT_INTERRUPTED)


def take_over() -> bool:
    """Make SIGINT end this process at once (see the module's doc); False when SIGINT was
    ignored when the process started (then it stays ignored)."""
    current = signal.getsignal(signal.SIGINT)
    if current is _exit_now:
        return True
    if current is not signal.default_int_handler:
        return False
    signal.signal(signal.SIGINT, _exit_now)
    return True


def took_over() -> bool:
    return signal.getsignal(signal.SIGINT) is _exit_now


@contextmanager
def raising():
    """Inside: Ctrl-C raises ``KeyboardInterrupt`` (the chat catches it and keeps the session);
    after: back to the handler that was there."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is not _exit_now:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
