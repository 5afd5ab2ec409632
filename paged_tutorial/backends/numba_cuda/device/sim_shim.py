"""Fill the gaps of Numba's CUDA simulator so one kernel source runs on the GPU and on the CPU.

The simulator (``NUMBA_ENABLE_CUDASIM=1``) runs every CUDA thread of a block as a Python thread
and swaps the ``cuda`` global of a kernel for a fake module while it runs.  That fake module has
shared memory, ``syncthreads`` and atomics, but it lacks three things our kernels use (and
its shared-array allocation needs a lock, see ``_shared_array``).  ``install()`` also replaces
the way it runs a block: ``sim_block.LockstepBlock`` runs one thread at a time, hands the turn
over at each wait, and reports barriers in divergent branches and deadlocks.

1. **warp shuffles** (``cuda.shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``,
   ``shfl_xor_sync``).  ``install()`` adds them to the fake module's class, under the real
   names, so a kernel calls ``cuda.shfl_down_sync(mask, value, 16)`` in both worlds.
2. **libdevice** bit reinterpretation (``float_as_int`` / ``int_as_float``, and the float16
   conversions from / to bits ``half2float`` / ``float2half_rn``).  Kernels import
   ``libdevice`` from *this* module: on the GPU it is ``numba.cuda.libdevice`` itself, in the
   simulator a tiny NumPy stand-in.
3. **bfloat16**: there is no bf16 type in the simulator, so the backend never uses one.  bf16
   tensors travel as their 16-bit patterns (``t.view(torch.int16)``) and ``dtypes.py`` converts
   bits <-> float32 with the two functions of point 2, the same code on both sides.
4. **warp-wide instructions** other than shuffles (``warp_collective``): every lane hands its
   operands over and gets its share of a result computed from all 32 lanes' operands; the
   tensor-core ``mma.sync`` of ``mma.py`` is emulated this way.

How a shuffle is emulated (no barrier: each lane waits only for the lane it reads)
--------------------------------------------------------------------------------
On hardware the 32 lanes of a warp exchange registers in one instruction.  Here the block runs
one thread at a time (``sim_block.LockstepBlock``, which ``install()`` puts in place of the
simulator's own block runner): every lane leaves the value of each shuffle it makes, in order,
and a lane's n-th shuffle returns the n-th value of its source lane, waiting only until that
lane has made its n-th shuffle.  Threads take turns from the highest id down, so the article's
``shfl_down_sync`` tree (each lane reads a higher lane) never waits at all.  Lanes of one warp
whose n-th shuffles are different calls (a shuffle in a branch only some lanes take) are
reported (``sim_block.BarrierDivergence``), and so are reading a lane that has returned and
lanes of a warp that reach a barrier with different numbers of shuffles.  ``syncwarp`` waits
for the whole warp.

Hardware semantics reproduced (PTX ``shfl.sync`` with width 32; tested in
``tests/kernels/test_sim_shim.py``): all 32 lanes take part (``mask`` must be full);
``shfl_down``: lane i reads lane i+delta, and keeps its own value when i+delta >= 32;
``shfl_up``: lane i reads lane i-delta, keeps its own when i-delta < 0; ``shfl_xor``: lane i
reads lane i ^ (m & 31); ``shfl_sync``: lane i reads lane ``src & 31``.  Lanes past the end
of a partial last warp do not exist; reading from one returns the reader's own value.

Speed: see ``sim_block.py`` (one thread runs at a time; a barrier is one hand-over per
thread, a shuffle at most one) and ``benchmarks/sim_speed.py``.  ``fast_thread_switching()`` lowers
``sys.setswitchinterval`` while a simulated kernel runs (``runtime/launch.py`` wraps every
simulated launch in it), so that a woken thread takes the GIL at once, and restores it after.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import numpy as np
from numba import cuda

#: True when this process imported Numba's CUDA simulator instead of the real CUDA target.
#: (Numba picks one when ``numba.cuda`` is first imported; see ``ensure_simulator_decided``.)
SIMULATING: bool = bool(getattr(cuda, "config", None) and cuda.config.ENABLE_CUDASIM) or \
    cuda.jit.__module__.startswith("numba.cuda.simulator")

from paged_tutorial.backends.warp import FULL_MASK, WARP_SIZE  # noqa: E402


# --- libdevice stand-in ------------------------------------------------------------------

def _float_as_int(x):
    """The int32 whose bits are those of float32 ``x`` (libdevice ``__nv_float_as_int``)."""
    return np.float32(x).view(np.int32)


def _int_as_float(i):
    """The float32 whose bits are those of int32 ``i`` (libdevice ``__nv_int_as_float``)."""
    return np.array(int(i) & 0xFFFFFFFF, dtype=np.uint32).view(np.float32)[()]


def _float2half_rn(x):
    """The float16 bits (int16) of float32 ``x``, to nearest even (``__nv_float2half_rn``)."""
    with np.errstate(over="ignore"):             # a finite float past float16's range: inf
        return np.float32(x).astype(np.float16).view(np.int16)


def _half2float(h):
    """The float32 value of the float16 whose bits are int16 ``h`` (``__nv_half2float``)."""
    return np.array(int(h) & 0xFFFF, dtype=np.uint16).view(np.float16)[()].astype(np.float32)


class _SimLibdevice:
    """The libdevice functions the kernels use, done with NumPy bit views."""

    float_as_int = staticmethod(_float_as_int)
    int_as_float = staticmethod(_int_as_float)
    float2half_rn = staticmethod(_float2half_rn)
    half2float = staticmethod(_half2float)


if SIMULATING:
    libdevice = _SimLibdevice()
else:                                          # pragma: no cover - GPU process
    from numba.cuda import libdevice  # noqa: F401  (re-exported for the kernels)


# --- memory fence between blocks (the last-block merges of sampling and attention_fast) --------
if SIMULATING:
    def threadfence():
        """The simulator runs blocks one after another: nothing to order."""
else:                                          # pragma: no cover - GPU only
    @cuda.jit(device=True)
    def threadfence():
        cuda.threadfence()


# --- warp shuffles ---------------------------------------------------------------------

def _check_mask(mask) -> None:
    if (int(mask) & FULL_MASK) != FULL_MASK:
        raise NotImplementedError(
            f"sim_shim: only full-warp shuffles (mask 0xFFFFFFFF) are emulated, got "
            f"{int(mask) & FULL_MASK:#010x}")


def _lane_thread(op: str):
    from paged_tutorial.backends.numba_cuda.device.sim_block import LaneThread

    thread = threading.current_thread()
    if not isinstance(thread, LaneThread):
        raise RuntimeError(f"sim_shim: cuda.{op} called outside a simulated kernel (or the "
                           "simulator's block runner is not sim_block.LockstepBlock)")
    return thread


def _exchange(op: str, value, source_lane):
    """This thread's next shuffle: the value lane ``source_lane`` of its warp brings to the
    same shuffle (or ``value`` itself when that is None: no valid source lane)."""
    from paged_tutorial.backends.numba_cuda.device.sim_block import call_site

    thread = _lane_thread(op)
    return thread._manager.shuffle(thread, op, call_site(sys._getframe(1)), value, source_lane)


def warp_collective(op: str, value, combine):
    """This thread's next warp-wide instruction (``mma.py``'s emulated ``mma.sync``): leave
    ``value`` (this lane's operands), wait for the 32 lanes of the warp to reach the same call,
    and return this lane's entry of ``combine(values)``, ``values`` being the 32 lanes' values in
    lane order (``combine`` runs once per warp and call).  Counts as one shuffle of each lane
    (``sim_block.LockstepBlock.collective``)."""
    from paged_tutorial.backends.numba_cuda.device.sim_block import call_site

    thread = _lane_thread(op)
    return thread._manager.collective(thread, op, call_site(sys._getframe(1)), value, combine)


def shfl_sync(self, mask, value, src_lane):
    """Value of lane ``src_lane & 31`` (PTX shfl.sync.idx, width 32)."""
    _check_mask(mask)
    return _exchange("shfl_sync", value, int(src_lane) & 31)


def shfl_up_sync(self, mask, value, delta):
    """Value of lane ``lane - delta``; a lane with no such source keeps its own value."""
    _check_mask(mask)
    src = threading.current_thread().thread_id % WARP_SIZE - int(delta)
    return _exchange("shfl_up_sync", value, src if src >= 0 else None)


def shfl_down_sync(self, mask, value, delta):
    """Value of lane ``lane + delta``; a lane whose source is >= 32 keeps its own value."""
    _check_mask(mask)
    src = threading.current_thread().thread_id % WARP_SIZE + int(delta)
    return _exchange("shfl_down_sync", value, src if src < WARP_SIZE else None)


def shfl_xor_sync(self, mask, value, lane_mask):
    """Value of lane ``lane ^ (lane_mask & 31)`` (butterfly)."""
    _check_mask(mask)
    lane = threading.current_thread().thread_id % WARP_SIZE
    return _exchange("shfl_xor_sync", value, lane ^ (int(lane_mask) & 31))


def syncwarp(self, mask=FULL_MASK):
    """Wait for every live lane of this thread's warp (``__syncwarp``, full mask only)."""
    from paged_tutorial.backends.numba_cuda.device.sim_block import call_site

    _check_mask(mask)
    thread = _lane_thread("syncwarp")
    thread._manager.warp_barrier(thread, call_site(sys._getframe(1)))


def _activemask(self):
    return FULL_MASK


# --- shared memory: one array per (block, source line), also under thread switching -----

_SHARED_LOCK = threading.Lock()


def _shared_array(self, shape, dtype):
    """The simulator's ``cuda.shared.array`` with its check-then-insert made atomic.

    numba-cuda 0.30's ``FakeCUDAShared.array`` looks the caller's source line up in a dict and
    inserts a new ``np.empty`` array when it is missing, without a lock.  Two threads of a block
    that reach the allocation together can both miss and each keep a *private* array: the
    block's threads then no longer share memory, and a reduction reads an uninitialised
    partner.  With Python's default switch interval that is rare; with the 1e-5 s interval used
    here it shows up about once in a few dozen engine runs.  Same lookup, under a lock."""
    from numba.np import numpy_support
    from numba.core import types

    if shape == 0:                                   # dynamic shared memory: one buffer
        return _ORIGINAL_SHARED_ARRAY(self, shape, dtype)
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    frame = sys._getframe(1)                         # the kernel line that allocates
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _SHARED_LOCK:
        array = self._allocations.get(caller)
        if array is None:
            array = np.empty(shape, dtype)
            self._allocations[caller] = array
    if SHARED_OBSERVERS:                             # a shared-memory recording is active
        return SHARED_OBSERVERS[-1].shared_array(array, caller)
    return array


_ORIGINAL_SHARED_ARRAY = None
_INSTALLED = False


# --- watching shared memory and barriers (runtime/access_log.py records them) --------------

#: the active observers of shared arrays and barriers, innermost last (empty unless
#: ``access_log.record_shared_accesses`` is recording).  An observer has
#: ``shared_array(array, (file, line)) -> what the kernel gets`` and ``barrier(frame)``.
SHARED_OBSERVERS: list = []


def _observed_syncthreads(self):
    """The fake module's ``syncthreads``, telling the active observer which line of which
    function called it before waiting.  The shuffles' warp-level waits (``_exchange``) are not
    reported: on hardware a shuffle orders no shared memory."""
    if SHARED_OBSERVERS:
        SHARED_OBSERVERS[-1].barrier(sys._getframe(1))
    threading.current_thread().syncthreads()


# --- the cuda-module swap of older numba-cuda (macOS) --------------------------------------

_SWAP_LOCK = threading.Lock()
_SWAP_STATE: dict[int, list] = {}          # id(globals) -> [threads inside, saved globals]


@contextlib.contextmanager
def _counted_cuda_swap(fn, fake_cuda_module):
    """The simulator's ``swapped_cuda_module``, safe when many threads enter it at once.

    While a simulated kernel runs, every global named after the ``numba.cuda`` module in the
    module of each called (device) function is pointed at the fake module, and put back when
    the call returns.  numba-cuda 0.20.1 (the release macOS gets) does this per call without
    counting: when one thread of a block leaves a device function while another is still inside
    it, the module's ``cuda`` is restored under the second thread, which then fails with
    "module 'numba.cuda' has no attribute 'syncthreads'".  numba-cuda 0.30 counts the threads
    inside; this does the same: the first thread in swaps, the last one out restores."""
    from numba import cuda

    globs = fn.__globals__
    key = id(globs)
    with _SWAP_LOCK:
        state = _SWAP_STATE.get(key)
        if state is None:
            saved = {name: value for name, value in globs.items() if value is cuda}
            for name in saved:
                globs[name] = fake_cuda_module
            state = _SWAP_STATE[key] = [0, saved]
        state[0] += 1
    try:
        yield
    finally:
        with _SWAP_LOCK:
            state[0] -= 1
            if state[0] == 0:
                globs.update(state[1])
                del _SWAP_STATE[key]


def install() -> None:
    """Add the shuffles and ``syncwarp`` to the simulator's fake ``cuda`` module, run its
    blocks with ``sim_block.LockstepBlock``, make its shared-array allocation thread-safe, let
    ``SHARED_OBSERVERS`` see shared arrays and barriers, and on numba-cuda 0.20 make its module
    swap thread-safe too (idempotent; simulator only)."""
    global _INSTALLED, _ORIGINAL_SHARED_ARRAY
    if not SIMULATING or _INSTALLED:
        return
    from numba.cuda.simulator import kernelapi

    from numba.cuda.simulator import kernel
    from paged_tutorial.backends.numba_cuda.device.sim_block import LockstepBlock

    fake = kernelapi.FakeCUDAModule
    for name, fn in (("shfl_sync", shfl_sync), ("shfl_up_sync", shfl_up_sync),
                     ("shfl_down_sync", shfl_down_sync), ("shfl_xor_sync", shfl_xor_sync),
                     ("syncwarp", syncwarp), ("activemask", _activemask)):
        if not hasattr(fake, name):
            setattr(fake, name, fn)
    kernel.BlockManager = LockstepBlock
    _ORIGINAL_SHARED_ARRAY = kernelapi.FakeCUDAShared.array
    kernelapi.FakeCUDAShared.array = _shared_array
    fake.syncthreads = _observed_syncthreads
    if not hasattr(kernelapi, "_swap_refcount"):     # numba-cuda without the counted swap
        kernel.swapped_cuda_module = _counted_cuda_swap
    _INSTALLED = True


# --- speed -------------------------------------------------------------------------------

SIM_SWITCH_INTERVAL = 1e-5


@contextlib.contextmanager
def fast_thread_switching(interval: float = SIM_SWITCH_INTERVAL):
    """Lower Python's thread switch interval while a simulated kernel runs, then restore it."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


install()
