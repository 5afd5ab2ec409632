"""Record which elements a simulated kernel reads and writes: ``record_kernel_accesses``.

    with record_kernel_accesses(kv_cache=cache.buffer, block_table=table) as logs:
        attention.decode(q, cache, table, ...)
    logs["kv_cache"].by_block("R")     # {(blockIdx.x, blockIdx.y): element indices read}

While the context is active, every kernel this package launches receives, in place of each
named tensor, an ``AccessLog``: a stand-in over the *same* memory that forwards every element
read and write and notes it (operation, element index, thread block, thread).  The kernel runs
unchanged and its results land in the tensor as usual.  ``launch.as_kernel_array`` (the one
door through which the backend hands tensors to kernels) asks ``stand_in`` for each argument;
nothing is patched.

A tensor is recognised by its memory (same first element and element count), so a flat view of
it (``launch.flat``, ``launch.rows``) is recognised too.  The records of several launches made
inside one context accumulate, in one global order (``seq``).

Numba's CUDA simulator only: on a GPU the kernel reads memory directly and nothing in Python
sees it, so ``record_kernel_accesses`` raises (``AVAILABLE`` says which case holds).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import NamedTuple

import numpy as np

from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

#: True when kernel accesses can be recorded in this process (Numba's CUDA simulator).
AVAILABLE: bool = SIMULATING


class Access(NamedTuple):
    """One element access: ``seq`` orders all accesses of a recording; ``op`` is "R" or "W";
    ``block`` is (blockIdx.x, blockIdx.y); ``thread`` is threadIdx.x."""

    seq: int
    op: str
    index: int
    block: tuple
    thread: int


class AccessLog:
    """Stands in for one kernel array argument and records every element access in
    ``records`` (a list of ``Access``).  Reads and writes go to ``array`` (the tensor's own
    memory, as NumPy)."""

    _order = itertools.count()

    def __init__(self, name: str, array: np.ndarray | None = None):
        self.name = name
        self.array = array
        self.records: list[Access] = []

    # --- what the kernel sees: an array ----------------------------------------------------
    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    def __len__(self):
        return len(self.array)

    def _note(self, op: str, index) -> None:
        t = threading.current_thread()
        block = (int(t.blockIdx.x), int(t.blockIdx.y)) if hasattr(t, "blockIdx") else (-1, -1)
        thread = int(t.threadIdx.x) if hasattr(t, "threadIdx") else -1
        self.records.append(Access(next(AccessLog._order), op, int(index), block, thread))

    def __getitem__(self, index):
        self._note("R", index)
        return self.array[index]

    def __setitem__(self, index, value):
        self._note("W", index)
        self.array[index] = value

    # --- summaries -------------------------------------------------------------------------
    def reads(self) -> np.ndarray:
        """Element indices read, in order (repeats kept)."""
        return np.array([r.index for r in self.records if r.op == "R"], dtype=np.int64)

    def writes(self) -> np.ndarray:
        """Element indices written, in order (repeats kept)."""
        return np.array([r.index for r in self.records if r.op == "W"], dtype=np.int64)

    def read_counts(self) -> np.ndarray:
        """How many times each element was read: one count per element of the array."""
        return np.bincount(self.reads(), minlength=len(self.array))

    def by_block(self, op: str | None = None) -> dict:
        """{(block x, block y): sorted unique indices} for reads ("R"), writes ("W") or both."""
        out: dict = {}
        for r in self.records:
            if op is None or r.op == op:
                out.setdefault(r.block, set()).add(r.index)
        return {b: np.array(sorted(s), dtype=np.int64) for b, s in sorted(out.items())}

    def by_thread(self, block: tuple, op: str | None = None) -> dict:
        """{thread: indices in access order} within one thread block."""
        out: dict = {}
        for r in self.records:
            if r.block == tuple(block) and (op is None or r.op == op):
                out.setdefault(r.thread, []).append(r.index)
        return {t: np.array(ix, dtype=np.int64) for t, ix in sorted(out.items())}

    def outside(self, size: int | None = None) -> list[Access]:
        """Accesses whose index is not in [0, size) (default: the array's length).  NumPy
        would wrap a negative index silently; on a GPU it is a read outside the buffer."""
        n = len(self.array) if size is None else size
        return [r for r in self.records if not 0 <= r.index < n]

    def __repr__(self) -> str:
        return (f"AccessLog({self.name!r}: {len(self.reads())} reads, {len(self.writes())} "
                "writes)")


class _Recording:
    def __init__(self, tensors: dict):
        self.targets = {}
        for name, t in tensors.items():
            if not hasattr(t, "data_ptr") or not hasattr(t, "numel"):
                raise TypeError(f"record_kernel_accesses: {name} must be a torch tensor, got "
                                f"{type(t).__name__}")
            self.targets[name] = (t.data_ptr(), t.numel())
        self.logs = {name: AccessLog(name) for name in tensors}

    def match(self, t, host: np.ndarray):
        key = (t.data_ptr(), t.numel())
        for name, target in self.targets.items():
            if target == key:
                log = self.logs[name]
                log.array = host
                return log
        return None


_active: list[_Recording] = []


@contextlib.contextmanager
def record_kernel_accesses(**tensors):
    """Record every element access the package's kernels make to the named torch tensors while
    the context is active; yields {name: AccessLog}.  Simulator only (see ``AVAILABLE``)."""
    if not AVAILABLE:
        raise RuntimeError(
            "record_kernel_accesses needs Numba's CUDA simulator: on a GPU a kernel's memory "
            "accesses cannot be seen from Python.  Run in a process with "
            "NUMBA_ENABLE_CUDASIM=1 (set before numba.cuda is imported), or check "
            "access_log.AVAILABLE and skip the recording on a GPU.")
    recording = _Recording(tensors)
    _active.append(recording)
    try:
        yield recording.logs
    finally:
        _active.remove(recording)


def stand_in(tensor, kernel_array):
    """What a kernel receives for ``tensor``: its ``AccessLog`` while a recording names it,
    else ``kernel_array`` unchanged.  Called by ``launch.as_kernel_array``."""
    if not _active:
        return kernel_array
    host = getattr(kernel_array, "_ary", None)
    if host is None:
        host = np.asarray(kernel_array)
    for recording in reversed(_active):
        log = recording.match(tensor, host)
        if log is not None:
            return log
    return kernel_array
