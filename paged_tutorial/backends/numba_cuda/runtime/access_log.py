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

``record_shared_accesses`` does the same for shared memory: every read and write of a shared
array by every thread, with the number of barriers the thread had passed (its epoch), and every
barrier with its source line; ``SharedLog.races()`` and ``SharedLog.divergence()`` read them.

Numba's CUDA simulator only: on a GPU the kernel reads memory directly and nothing in Python
sees it, so ``record_kernel_accesses`` raises (``AVAILABLE`` says which case holds).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
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


# =========================================================================================
# Shared memory: every read and write of a shared array, with the barrier epoch
# =========================================================================================

class Site(NamedTuple):
    """A line of kernel code: file, line number, function name."""

    file: str
    line: int
    function: str

    def code(self) -> str:
        import linecache

        return linecache.getline(self.file, self.line).strip()


class SharedAccess(NamedTuple):
    """One access to a shared cell: ``epoch`` is how many ``cuda.syncthreads()`` the thread
    had passed (two accesses of one block with the same epoch have no barrier between them)."""

    seq: int
    op: str                  # "R" or "W"
    array: str               # the shared array's variable name ("dot_products")
    index: int
    block: tuple
    thread: int
    epoch: int
    site: Site
    value: float             # the value written, or the value the read returned


class Barrier(NamedTuple):
    """One thread reaching one ``cuda.syncthreads()``: its ``round`` (0 for its first)."""

    block: tuple
    thread: int
    round: int
    site: Site


class Race(NamedTuple):
    """A write and another thread's access to the same shared cell in the same epoch."""

    write: SharedAccess
    other: SharedAccess

    @property
    def cell(self) -> str:
        return f"{self.write.array}[{self.write.index}]"


class Divergence(NamedTuple):
    """Threads of one block that disagree at barrier round ``round``: ``at`` maps each
    barrier site (or None: no barrier any more, the thread finished) to its threads."""

    block: tuple
    round: int
    at: dict


def _site(frame) -> Site:
    return Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _array_name(caller: tuple) -> str:
    """``dot_products`` from the line ``dot_products = cuda.shared.array(...)``."""
    import linecache
    import re

    match = re.match(r"\s*(\w+)\s*=", linecache.getline(caller[0], caller[1]))
    return match.group(1) if match else f"shared@{caller[1]}"


def _here():
    t = threading.current_thread()
    block = (int(t.blockIdx.x), int(t.blockIdx.y)) if hasattr(t, "blockIdx") else (-1, -1)
    thread = int(t.threadIdx.x) if hasattr(t, "threadIdx") else -1
    return t, block, thread


_EPOCH_ATTR = "_paged_tutorial_barriers"


class SharedCells:
    """What a kernel gets for one shared array while shared memory is recorded: the block's
    own NumPy array, every element access noted in the ``SharedLog``.  An index outside the
    array raises ``IndexError`` naming the array, its size and the thread (on a GPU such an
    access would silently touch other shared memory; NumPy would wrap a negative index)."""

    def __init__(self, log: "SharedLog", name: str, array: np.ndarray):
        self._log, self.name, self.array = log, name, array

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def size(self):
        return self.array.size

    def __len__(self):
        return len(self.array)

    def _note(self, op: str, index, frame, value=None):
        t, block, thread = _here()
        if isinstance(index, (float, np.floating)):
            raise IndexError(f"{self.name}[{index!r}] by thread {thread} of block {block}: a "
                             "float index (a GPU compiles no array access with one; use // "
                             "rather than /)")
        try:
            i = int(index)
        except TypeError:
            raise IndexError(f"{self.name}[{index!r}]: a shared array of this kernel takes one "
                             "integer index") from None
        if not 0 <= i < len(self.array):
            what = "read" if op == "R" else "written"
            raise IndexError(
                f"{self.name}[{i}] {what} by thread {thread} of block {block}, but "
                f"{self.name} has {len(self.array)} cell(s) (0..{len(self.array) - 1}): on a "
                "GPU that access lands outside the array")
        if op == "R":
            value = self.array[i]
        self._log.records.append(SharedAccess(next(AccessLog._order), op, self.name, i, block,
                                              thread, getattr(t, _EPOCH_ATTR, 0),
                                              _site(frame), float(value)))
        return i

    def __getitem__(self, index):
        i = self._note("R", index, sys._getframe(1))
        return self.array[i]

    def __setitem__(self, index, value):
        i = self._note("W", index, sys._getframe(1), value)
        self.array[i] = value

    def __repr__(self) -> str:
        return f"<shared {self.name}[{len(self.array)}]>"


class SharedLog:
    """Every shared-memory access and every barrier of the kernels launched while it records
    (``record_shared_accesses``)."""

    def __init__(self):
        self.records: list[SharedAccess] = []
        self.barriers: list[Barrier] = []
        self.block_threads: dict = {}         # block -> number of threads

    # --- called by sim_shim while recording -------------------------------------------
    def shared_array(self, array: np.ndarray, caller: tuple):
        return SharedCells(self, _array_name(caller), array)

    def barrier(self, frame) -> None:
        t, block, thread = _here()
        epoch = getattr(t, _EPOCH_ATTR, 0)
        if block not in self.block_threads and hasattr(t, "_manager"):
            n = 1
            for extent in t._manager._block_dim:
                n *= extent
            self.block_threads[block] = n
        self.barriers.append(Barrier(block, thread, epoch, _site(frame)))
        setattr(t, _EPOCH_ATTR, epoch + 1)

    # --- summaries ---------------------------------------------------------------------
    def blocks(self) -> list:
        return sorted({r.block for r in self.records} | {b.block for b in self.barriers})

    def accesses(self, block: tuple | None = None, array: str | None = None) -> list:
        return [r for r in self.records if (block is None or r.block == tuple(block))
                and (array is None or r.array == array)]

    def races(self, limit: int | None = None) -> list[Race]:
        """Every shared cell that one thread writes and another thread accesses in the same
        epoch of the same block: one Race per (block, cell, epoch), naming the lowest writing
        thread and the lowest other thread, ordered by block, epoch and cell (deterministic
        whatever order the simulator ran the threads in)."""
        groups: dict = {}
        for r in self.records:
            groups.setdefault((r.block, r.array, r.index, r.epoch), []).append(r)
        found = []
        for group in groups.values():
            writes = [r for r in group if r.op == "W"]
            if not writes:
                continue
            for w in sorted(writes, key=lambda r: r.thread):
                others = [r for r in group if r.thread != w.thread]
                if others:               # the lowest thread: the same answer in every run
                    found.append(Race(w, min(others, key=lambda r: (r.thread, r.op))))
                    break
        found.sort(key=lambda race: (race.write.block, race.write.epoch, race.write.array,
                                     race.write.index))
        return found if limit is None else found[:limit]

    def divergence(self) -> Divergence | None:
        """The first barrier round at which the threads of a block are not all at the same
        ``cuda.syncthreads()`` (a barrier in a divergent branch: on a GPU the block waits
        forever or pairs barriers wrongly), or None."""
        for block in sorted({b.block for b in self.barriers}):
            seqs: dict = {}
            for b in self.barriers:
                if b.block == block:
                    seqs.setdefault(b.thread, []).append(b.site)
            n = self.block_threads.get(block, max(seqs) + 1)
            rounds = max(len(s) for s in seqs.values())
            for k in range(rounds):
                at: dict = {}
                for t in range(n):
                    s = seqs.get(t, [])
                    at.setdefault(s[k] if k < len(s) else None, []).append(t)
                if len(at) > 1:
                    return Divergence(block, k, at)
        return None


@contextlib.contextmanager
def record_shared_accesses():
    """Record every shared-array access (with its barrier epoch) and every barrier of the
    kernels launched while the context is active; yields a ``SharedLog``.  Simulator only."""
    from paged_tutorial.backends.numba_cuda.device import sim_shim

    if not AVAILABLE:
        raise RuntimeError(
            "record_shared_accesses needs Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): on a "
            "GPU use compute-sanitizer --tool racecheck (benchmarks/racecheck.py)")
    log = SharedLog()
    sim_shim.SHARED_OBSERVERS.append(log)
    try:
        yield log
    finally:
        sim_shim.SHARED_OBSERVERS.remove(log)
