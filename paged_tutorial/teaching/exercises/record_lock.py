"""The lock around every change to the learner's records: ``held(path)`` holds ``<path>.lock``
(the ``filelock`` package: ``fcntl`` on Linux and macOS, ``msvcrt`` on Windows) for the whole
read, change and write, so notebooks writing at the same moment each see the others' writes.
Waiting longer than ``WAIT_S`` for it raises ``filelock.Timeout``, an ``OSError``, which the
callers treat as a record that cannot be written (grading goes on)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

#: how long a writer waits for another notebook's write before giving up on its own
WAIT_S = 30.0


def lock_file(path: Path) -> Path:
    """The lock file that guards ``path``."""
    return path.with_name(path.name + ".lock")


@contextmanager
def held(path: Path):
    """Hold the lock of ``path`` (its folder made first) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock_file(path), timeout=WAIT_S):
        yield
