"""The command's two output streams.  Standard output carries the answer: a write that fails
ends the command (status 141 when nobody reads any more, 2 with an error line when it is
full).  Standard error carries diagnostics only: when it cannot be written (closed, full,
broken) the diagnostics are dropped and the answer still goes out."""

from __future__ import annotations

import os


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


class OutputClosed(Exception):
    """Nobody reads standard output any more (the reader of the pipe left, or it was closed)."""


class OutputFailed(Exception):
    """Standard output refused the answer (a full disk, ``/dev/full``, an I/O error)."""


class AnswerOutput:
    """Standard output for the answer.  A write that fails becomes OutputClosed or OutputFailed,
    and stays failed: an engine that hands a callback's exception to its caller later still
    ends the command the same way."""

    def __init__(self, stream):
        self.stream = stream
        self.failure: Exception | None = None

    def write(self, text: str) -> int:
        return self._guarded(self.stream.write, text)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def _guarded(self, call, *args):
        if self.failure is not None:
            raise self.failure
        try:
            if getattr(self.stream, "closed", False):    # a stand-in stdout may not say
                raise BrokenPipeError
            return call(*args)
        except BrokenPipeError:
            self.failure = OutputClosed()
        except OSError as exc:
            self.failure = OutputFailed(exc.strerror or one_line(exc))
        raise self.failure


def point_at_devnull(fd: int) -> None:
    """Point file descriptor ``fd`` at /dev/null: the interpreter's last flush of a stream
    that failed cannot fail again (what Python's documentation advises after a
    BrokenPipeError), and a closed descriptor 1 or 2 cannot be taken by a file opened later."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        if devnull != fd:
            os.dup2(devnull, fd)
            os.close(devnull)
    except OSError:
        pass


class Diagnostics:
    """Standard error that never fails: each write is flushed at once; the first write that
    cannot be done (closed, ``/dev/full``, an I/O error) turns the stream off for good, and
    the rest is dropped.  ``owns_fd`` (the program's own process): then descriptor 2 is
    pointed at /dev/null, so that nothing buffered fails again when the process exits."""

    def __init__(self, stream, owns_fd: bool = False):
        self.stream = stream
        self.owns_fd = owns_fd
        self.broken = stream is None

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):      # ValueError: written after close
                self._break()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self._break()

    def _break(self) -> None:
        self.broken = True
        if self.owns_fd:
            point_at_devnull(2)
            try:                 # what the stream still buffers now goes to /dev/null
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def isatty(self) -> bool:
        if self.broken:
            return False
        try:
            return self.stream.isatty()
        except (OSError, ValueError, AttributeError):
            return False

    def fileno(self) -> int:
        if self.broken:
            raise OSError("standard error is not available")
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"

    @property
    def closed(self) -> bool:
        return False

    def writable(self) -> bool:
        return True
