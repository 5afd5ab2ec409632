"""A simulated thread block that runs one thread at a time: the simulator's block runner,
replaced (``sim_shim.install`` puts ``LockstepBlock`` in place of Numba's ``BlockManager``).

Why: Numba's simulator starts every CUDA thread of a block as a Python thread, lets them all
compete for the GIL, and a manager thread polls them in a loop to find the moment when each one
waits at ``syncthreads``.  Most of a barrier-heavy kernel's time then goes to threads being
woken only to find they cannot run yet, and to the polling thread itself
(``benchmarks/sim_speed.py`` measures it: tens of microseconds of CPU per thread per barrier,
and every emulated shuffle was such a barrier).

How: one thread of the block holds the *turn* at any moment.  It runs until it has to wait --
at a block barrier (``syncthreads``), at a shuffle whose value is not there yet, at
``syncwarp``, or because it returned -- and then hands the turn to the next thread that can
run, which was asleep on its own lock.  Nothing polls and nothing spins: each hand-over is one
lock release, so a barrier of n threads costs n hand-overs.

Shuffles wait for the one lane they read, not for the warp: every lane leaves the value of each
of its shuffles in order, and a lane's n-th shuffle takes the n-th value its source lane left,
waiting only while that lane has not got there.  *Order*: threads take their turns from the
highest thread id down, so in a ``shfl_down_sync`` tree (the article's reduction: every lane
reads a higher lane) every value is already there and the five shuffles cost no hand-over at
all; a butterfly (``shfl_xor_sync``) waits for about half its lanes.  The values are the
hardware's whatever the order, and a simulated kernel is deterministic.

The waits, and the errors a GPU would turn into a hang or garbage:

- **block barrier** -- released when every live thread of the block (one that has not
  returned) waits at one.  They must all wait at the *same* ``syncthreads`` (the same line,
  reached through the same calls): threads waiting at different ones mean a barrier inside a
  divergent branch, and the launch raises ``BarrierDivergence`` naming the lines and threads.
  The lanes of a warp must also have made the same number of shuffles by then (a lane that
  shuffled without a lane now at the barrier would wait for it forever on hardware).  A thread
  that has returned no longer counts, as in the stock simulator.
- **shuffle** -- a lane's n-th shuffle must be the same call (same line) as its source lane's
  n-th, else ``BarrierDivergence``; reading a lane that returned before it got there is an
  error too (undefined on hardware).
- **syncwarp** -- released when every live lane of the warp waits at the same one.
- **warp-wide instruction** (``collective``: the emulated ``mma.sync`` of ``device/mma.py``)
  -- every lane leaves its operands like a shuffle value and waits for all 32 lanes' values at
  the same call; the result is computed once per warp.  Same order and divergence checks as a
  shuffle, and the warp must be whole.
- **deadlock** -- no thread can run and no wait can be released (e.g. a lane waits at a shuffle
  for a lane that waits at ``syncthreads``): ``SimulatorDeadlock`` says who waits where.

``LockstepBlock.barrier_rounds`` counts the block barriers released so far, and each thread's
``barriers_passed`` how many it has passed: a shared-memory access can be placed between two
barriers by reading the latter.

*Starting*: the block's threads are started one at a time, each reaching its ``run`` before the
next starts.  A Python thread installs the process's trace function (``threading.settrace``:
coverage.py, a debugger) as it starts, and while a Python audit hook is installed (the
graders' ``answer_guard``) two threads installing at once can make CPython refuse one
("Cannot install a trace function while another trace function is being installed"): that
thread would end before it ran, and the turn handed to it would be lost.  One that ends before
its ``run`` anyway fails the launch with ``SimulatedThreadNotStarted``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import sys
import threading

import numpy as np
from numba.cuda.simulator import kernel as _sim_kernel
from numba.cuda.simulator import kernelapi as _sim_kernelapi

from paged_tutorial.backends.warp import WARP_SIZE  # noqa: E402


class BarrierDivergence(RuntimeError):
    """Threads of one block (or lanes of one warp) wait at different barriers or exchanges."""


class SimulatorDeadlock(RuntimeError):
    """No thread of a simulated block can run, and none of their waits can be released."""


class SimulatedThreadNotStarted(RuntimeError):
    """A simulated thread ended before it could run the kernel (see "Starting" above)."""


#: how often (seconds) the launching thread looks whether a starting thread is still alive
START_POLL_S = 0.05


class _Aborted(BaseException):
    """Raised in the block's other threads when one failed: they leave quietly."""


# --- where a thread waits: the kernel lines, innermost first ---------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))
_SKIPPED = {os.path.abspath(_sim_kernel.__file__), os.path.abspath(_sim_kernelapi.__file__),
            os.path.abspath(__file__), os.path.join(_HERE, "sim_shim.py")}


def _thread_entry(fn, args):
    """The bottom frame of every simulated thread: the kernel called with its arguments."""
    fn(*args)


_ENTRY_CODE = _thread_entry.__code__


def call_site(frame) -> tuple:
    """The chain of (code, line) of the kernel and device-function frames above ``frame``,
    innermost first, leaving out the simulator's and the shim's own frames."""
    site = []
    while frame is not None and frame.f_code is not _ENTRY_CODE:
        code = frame.f_code
        if code.co_filename not in _SKIPPED:
            site.append((code, frame.f_lineno))
        frame = frame.f_back
    return tuple(site)


def describe_site(site: tuple) -> str:
    if not site:
        return "the kernel"
    code, line = site[0]
    return f"{os.path.basename(code.co_filename)}:{line} ({code.co_name})"


def describe_sites_apart(sites) -> list[str]:
    """``describe_site`` of each site, each followed by as many of its callers ("called from
    ...") as it takes for no two of them to read the same (one helper called from two
    branches is two sites)."""
    def chain(site, depth):
        return ", called from ".join(describe_site(site[i:]) for i in range(min(depth,
                                                                               len(site))))
    depth, deepest = 1, max((len(s) for s in sites), default=1)
    while depth < deepest and len({chain(s, depth) for s in sites}) < len(sites):
        depth += 1
    return [chain(s, depth) for s in sites]


def _ranges(ids) -> str:
    """Thread ids as short ranges: [0, 1, 2, 5] -> "0-2, 5"."""
    ids = sorted(ids)
    out, start, prev = [], None, None
    for i in ids:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


# --- stopping a stuck launch --------------------------------------------------------------------

#: files whose code keeps a block's bookkeeping (and Python's threads'): an exception raised
#: into a thread while it runs one of them could leave a turn handed to no one
_BOOKKEEPING = _SKIPPED | {os.path.abspath(threading.__file__),
                           os.path.abspath(contextlib.__file__)}


def interrupt_running_threads(exception: type[BaseException]) -> int:
    """Raise ``exception`` (asynchronously) in each simulated thread that holds its block's
    turn and is running kernel code at this moment; returns how many it reached.  Only that
    thread runs (the others sleep on their turns and leave through ``_abort`` once the launch
    fails), and never inside the simulator's, the shim's or ``threading``'s own code: a caller
    that finds none there yet calls again a moment later."""
    frames = sys._current_frames()
    reached = 0
    for t in threading.enumerate():
        if not isinstance(t, LaneThread) or t.exited or \
                getattr(t._manager, "running", None) is not t:
            continue
        frame = frames.get(t.ident)
        if frame is None or os.path.abspath(frame.f_code.co_filename) in _BOOKKEEPING:
            continue
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident),
                                                   ctypes.py_object(exception))
        reached += 1
    return reached


# --- the threads -------------------------------------------------------------------------------

class LaneThread(_sim_kernel.BlockThread):
    """One CUDA thread of a ``LockstepBlock``: sleeps on ``turn`` while another thread runs."""

    def __init__(self, fn, block, block_idx, thread_idx, debug, args):
        super().__init__(lambda: _thread_entry(fn, args), block, block_idx, thread_idx, debug)
        self.turn = threading.Lock()
        self.turn.acquire()                          # held: not this thread's turn
        self.warp, self.lane = divmod(self.thread_id, WARP_SIZE)
        self.waits_at = None                         # ("barrier" | op name, call site)
        self.sent: list = []                         # (op, site, value) of each shuffle, in order
        self.exited = False
        self.barriers_passed = 0
        self.entered = threading.Event()             # set first thing in run()

    def run(self):
        self.entered.set()
        block = self._manager
        self.turn.acquire()                          # the first turn
        if block.aborted:
            return
        try:
            threading.Thread.run(self)
        except _Aborted:
            return
        except Exception as exc:                     # the kernel failed in this thread
            message = (f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
                       + (f": {exc}" if str(exc) else ""))
            try:
                wrapped = type(exc)(message)
            except Exception:                        # an exception type with other arguments
                wrapped = RuntimeError(f"{type(exc).__name__}: {message}")
            self.exception = (wrapped, exc.__traceback__)
        block.thread_exited(self)

    def syncthreads(self):
        self._manager.block_barrier(self, call_site(sys._getframe(1)))


# --- the block -------------------------------------------------------------------------------

class LockstepBlock:
    """Runs one thread block of a simulated launch, one thread at a time (see the module
    docstring).  Same constructor and ``run`` as the simulator's ``BlockManager``."""

    def __init__(self, f, grid_dim, block_dim, debug):
        self._grid_dim = grid_dim
        self._block_dim = block_dim
        self._f = f
        self._debug = debug
        self.block_state = np.zeros(block_dim, dtype=np.bool_)   # syncthreads_count & co.
        self.barrier_rounds = 0
        self.aborted = False
        self.running: LaneThread | None = None      # the thread that holds the turn

    # --- the launch of one block ---------------------------------------------------------
    def run(self, grid_point, *args):
        threads = sorted((LaneThread(self._f, self, grid_point, point, self._debug, args)
                          for point in np.ndindex(*self._block_dim)),
                         key=lambda t: t.thread_id)
        self.threads = threads
        self.n_live = len(threads)
        self.ready = collections.deque(reversed(threads))     # see "Order" in the docstring
        self.at_barrier: list = []
        self.warp_live = collections.Counter(t.warp for t in threads)
        self.warp_waiting: dict = collections.defaultdict(list)
        self.shuffle_waiters: dict = collections.defaultdict(list)   # source tid -> readers
        self.collective_results: dict = {}  # (warp, n) -> [results, lanes that took theirs]
        self.error: BaseException | None = None
        self.error_tb = None
        self.finished = threading.Event()
        for t in threads:                            # one at a time: "Starting" above
            t.start()
            while not t.entered.wait(START_POLL_S):
                if not t.is_alive():
                    self._abort()
                    raise SimulatedThreadNotStarted(
                        f"simulated thread tid={list(t.threadIdx)} ctaid={list(t.blockIdx)} "
                        "ended before it ran the kernel (Python refused to start it; see "
                        "this process's stderr): run the cell again")
        try:
            self._give_turn(None)
            self.finished.wait()
        except BaseException:
            self._abort()
            raise
        if self.error is not None:
            self._abort()
            raise self.error.with_traceback(self.error_tb)
        for t in threads:
            t.join()

    def _abort(self) -> None:
        self.aborted = True
        for t in self.threads:
            if not t.exited and t.turn.locked():
                t.turn.release()
        for t in self.threads:
            if t.ident is not None:                  # started (a failed start stops the rest)
                t.join(timeout=1.0)

    # --- handing the turn over (only the thread holding the turn calls these) -------------
    def _next_thread(self):
        """The next thread to run, releasing the block barrier when every live thread waits
        there; None when the block is done or stuck (then ``error`` says why)."""
        if self.ready:
            return self.ready.popleft()
        if self.n_live == 0 or self.error is not None:
            return None
        if len(self.at_barrier) == self.n_live:
            self._release_barrier()
            return self.ready.popleft() if self.error is None else None
        self._fail(SimulatorDeadlock(self._deadlock_message()))
        return None

    def _give_turn(self, me):
        """Hand the turn to the next thread; ``me`` (None from the launching thread) then
        sleeps until it gets the turn back."""
        nxt = self._next_thread()
        if nxt is me:
            return
        self.running = nxt
        if nxt is None:
            self.finished.set()
        else:
            nxt.turn.release()
        if me is not None:
            me.turn.acquire()
            if self.aborted:
                raise _Aborted()

    def _fail(self, error: BaseException, tb=None) -> None:
        if self.error is None:
            self.error, self.error_tb = error, tb

    # --- block barrier ---------------------------------------------------------------------
    def block_barrier(self, me, site) -> None:
        if self.aborted:
            raise _Aborted()
        me.waits_at = ("barrier", site)
        self.at_barrier.append(me)
        self._give_turn(me)

    def _release_barrier(self) -> None:
        sites = collections.defaultdict(list)
        for t in self.at_barrier:
            sites[t.waits_at[1]].append(t.thread_id)
        if len(sites) > 1:
            ordered = sorted(sites.items(), key=lambda s: min(s[1]))
            where = "; ".join(f"threads {_ranges(ids)} at {text}" for (_, ids), text in
                              zip(ordered, describe_sites_apart([s for s, _ in ordered])))
            self._fail(BarrierDivergence(
                f"sim_shim: block {self._block_label()}: the threads wait at different "
                f"syncthreads calls ({where}): a barrier inside a branch that not every thread "
                "of the block takes (on a GPU the block hangs or runs on with a broken "
                "barrier).  Every thread that has not returned must reach the same "
                "syncthreads"))
            return
        if not self._shuffle_counts_agree():
            return
        self.barrier_rounds += 1
        waiting, self.at_barrier = self.at_barrier, []
        waiting.sort(key=lambda t: -t.thread_id)
        for t in waiting:
            t.waits_at = None
            t.barriers_passed += 1
        self.ready.extend(waiting)

    # --- shuffles -------------------------------------------------------------------------------
    def _leave(self, me, op: str, site, value) -> int:
        """``me`` leaves ``value`` as its next warp operation (and wakes the lanes waiting for
        it); the operation's index."""
        if self.aborted:
            raise _Aborted()
        n = len(me.sent)
        me.sent.append((op, site, value))
        readers = self.shuffle_waiters.pop(me.thread_id, None)
        if readers:                                  # lanes waiting for one of my values
            self.ready.extend(readers)
        return n

    def _wait_for(self, me, src, n: int, op: str, site, exited_error) -> None:
        """Give up ``me``'s turn until lane ``src`` has left its operation ``n``; raise
        ``exited_error()`` if it returned first."""
        while len(src.sent) <= n:
            if src.exited:
                raise exited_error()
            me.waits_at = (op, site)
            self.shuffle_waiters[src.thread_id].append(me)
            self._give_turn(me)
            me.waits_at = None

    def shuffle(self, me, op: str, site, value, source_lane):
        """``me``'s next shuffle: leave ``value``, return what lane ``source_lane`` left at
        the same shuffle (``value`` itself when ``source_lane`` is None or past the end of a
        partial warp), waiting only if that lane has not got there yet."""
        n = self._leave(me, op, site, value)
        size = min(WARP_SIZE, len(self.threads) - me.warp * WARP_SIZE)
        if source_lane is None or source_lane >= size:
            return value
        src = self.threads[me.warp * WARP_SIZE + source_lane]
        self._wait_for(me, src, n, op, site, lambda: RuntimeError(
            f"sim_shim: thread {me.thread_id} (shuffle #{n + 1}, {op}) reads lane "
            f"{source_lane} (thread {src.thread_id}), which returned after "
            f"{len(src.sent)} shuffle(s): every live lane of a warp must execute the "
            "same shuffles, and reading a lane that has exited is undefined on hardware"))
        src_op, src_site, src_value = src.sent[n]
        if (src_op, src_site) != (op, site):
            raise BarrierDivergence(
                f"sim_shim: thread {me.thread_id}'s shuffle #{n + 1} is {op} at "
                f"{describe_site(site)}, but lane {source_lane} (thread {src.thread_id}) made "
                f"its shuffle #{n + 1} with {src_op} at {describe_site(src_site)}: every live "
                "lane of a warp must execute the same shuffles, in the same order (a shuffle "
                "inside a branch that only some lanes take)")
        return src_value

    def collective(self, me, op: str, site, value, combine):
        """``me``'s next warp-wide operation (an emulated ``mma.sync``): leave ``value``, wait
        until every lane of the warp has left its value at the same call, and return this
        lane's entry of ``combine(values)`` (``values``: the 32 lanes' values in lane order;
        computed once per warp and call, by the first lane that finds them all there).  It
        counts as one shuffle of every lane: the same order and divergence checks apply, and
        the warp must be whole (32 live lanes)."""
        n = self._leave(me, op, site, value)
        first = me.warp * WARP_SIZE
        if len(self.threads) - first < WARP_SIZE:
            raise RuntimeError(
                f"sim_shim: {op} needs all 32 lanes of a warp, but warp {me.warp} of this "
                f"block has {len(self.threads) - first} threads: launch whole warps")
        lanes = self.threads[first:first + WARP_SIZE]
        for src in lanes:                            # lowest lanes first: they arrive last
            self._wait_for(me, src, n, op, site, lambda: RuntimeError(
                f"sim_shim: thread {me.thread_id} ({op} #{n + 1}) needs lane "
                f"{src.lane} (thread {src.thread_id}), which returned after "
                f"{len(src.sent)} warp operation(s): every lane of the warp must "
                "execute the same warp-wide instructions"))
            src_op, src_site, _ = src.sent[n]
            if (src_op, src_site) != (op, site):
                raise BarrierDivergence(
                    f"sim_shim: thread {me.thread_id}'s warp operation #{n + 1} is {op} at "
                    f"{describe_site(site)}, but lane {src.lane} (thread {src.thread_id}) "
                    f"made its #{n + 1} with {src_op} at {describe_site(src_site)}: every "
                    "lane of a warp must execute the same warp-wide instructions, in the same "
                    "order")
        key = (me.warp, n)
        entry = self.collective_results.get(key)
        if entry is None:
            entry = self.collective_results[key] = [
                combine([src.sent[n][2] for src in lanes]), 0]
        entry[1] += 1
        if entry[1] == WARP_SIZE:                    # every lane has its entry: forget it
            del self.collective_results[key]
        return entry[0][me.lane]

    def _shuffle_counts_agree(self) -> bool:
        """At a block barrier every lane of a warp has made the same shuffles: a lane that did
        more (even one that has returned since) shuffled without a lane now at the barrier,
        which on hardware waits for it (a hang)."""
        warps = collections.defaultdict(list)
        for t in self.threads:
            warps[t.warp].append(t)
        for warp, lanes in warps.items():
            here = {len(t.sent) for t in lanes if not t.exited}
            most = max(len(t.sent) for t in lanes)
            if len(here) > 1 or (here and most != next(iter(here))):
                counts = collections.defaultdict(list)
                for t in lanes:
                    counts[len(t.sent)].append(t.thread_id)
                where = "; ".join(f"threads {_ranges(ids)} made {n} shuffle(s)"
                                  for n, ids in sorted(counts.items()))
                self._fail(BarrierDivergence(
                    f"sim_shim: block {self._block_label()}, warp {warp}: at the syncthreads of "
                    f"{describe_site(self.at_barrier[0].waits_at[1])} the lanes have not made "
                    f"the same shuffles ({where}): a shuffle inside a branch that only some "
                    "lanes of the warp take (on hardware the others never reach it and the "
                    "warp hangs)"))
                return False
        return True

    # --- warp barrier (syncwarp) -------------------------------------------------------------
    def warp_barrier(self, me, site) -> None:
        """Wait for every live lane of ``me``'s warp to reach this ``syncwarp``."""
        if self.aborted:
            raise _Aborted()
        me.waits_at = ("syncwarp", site)
        waiting = self.warp_waiting[me.warp]
        waiting.append(me)
        if len(waiting) == self.warp_live[me.warp]:
            self._release_warp(me.warp)
        self._give_turn(me)

    def _release_warp(self, warp: int) -> None:
        waiting = sorted(self.warp_waiting.pop(warp), key=lambda t: -t.lane)
        sites = collections.defaultdict(list)
        for t in waiting:
            sites[t.waits_at[1]].append(t.thread_id)
        if len(sites) > 1:
            ordered = sorted(sites.items(), key=lambda s: min(s[1]))
            where = "; ".join(f"threads {_ranges(ids)} at {text}" for (_, ids), text in
                              zip(ordered, describe_sites_apart([s for s, _ in ordered])))
            self._fail(BarrierDivergence(
                f"sim_shim: block {self._block_label()}, warp {warp}: the lanes wait at "
                f"different syncwarp calls ({where}): every live lane of the warp must reach "
                "the same one"))
            return
        for t in waiting:
            t.waits_at = None
        self.ready.extend(waiting)

    # --- threads returning --------------------------------------------------------------------
    def thread_exited(self, me) -> None:
        me.exited = True
        self.n_live -= 1
        self.warp_live[me.warp] -= 1
        if me.exception is not None:
            self._fail(*me.exception)
            self.running = None
            self.finished.set()
            return
        waiting = self.warp_waiting.get(me.warp)
        if waiting and len(waiting) == self.warp_live[me.warp]:
            self._release_warp(me.warp)
        readers = self.shuffle_waiters.pop(me.thread_id, None)
        if readers:                                  # they find it gone and say so
            self.ready.extend(readers)
        nxt = self._next_thread()
        self.running = nxt
        if nxt is None:
            self.finished.set()
        else:
            nxt.turn.release()

    # --- messages -----------------------------------------------------------------------------
    def _block_label(self) -> str:
        t = self.threads[0]
        return f"({', '.join(str(int(v)) for v in t.blockIdx)})"

    def _deadlock_message(self) -> str:
        groups = collections.defaultdict(list)
        for t in self.threads:
            if not t.exited and t.waits_at is not None:
                op, site = t.waits_at
                groups[(op, site)].append(t.thread_id)
        where = "; ".join(
            f"threads {_ranges(ids)} at {'syncthreads' if op == 'barrier' else op} "
            f"{describe_site(site)}"
            for (op, site), ids in sorted(groups.items(), key=lambda g: min(g[1])))
        return (f"sim_shim: block {self._block_label()} cannot go on: {where}.  A warp-level "
                "call waits for every live lane of its warp and syncthreads for every live "
                "thread of the block; here each waits for threads that wait elsewhere (on a GPU "
                "the kernel hangs)")
