"""The simulator shim against warp-shuffle hardware semantics (PTX shfl.sync, width 32).

Runs in Numba's CUDA simulator only.  The expected values come from a NumPy model of the
hardware: lane i of a warp reads lane src(i) of the same warp, or keeps its own value when
src(i) is not a lane of the warp.
"""

import sys
import threading

import numpy as np
import pytest
from numba import cuda

from paged_tutorial.backends.numba_cuda.device import sim_shim

if sim_shim.SIMULATING:
    from paged_tutorial.backends.numba_cuda.device import sim_block

pytestmark = pytest.mark.skipif(not sim_shim.SIMULATING,
                                reason="shim tests need NUMBA_ENABLE_CUDASIM=1")

FULL = 0xFFFFFFFF


def hw_model(values, src_of_lane):
    """NumPy model of one shfl.sync over a block: values [n_threads] -> result [n_threads]."""
    n = len(values)
    out = values.copy()
    for tid in range(n):
        lane = tid % 32
        src = src_of_lane(lane)
        if src is not None and 0 <= src < 32 and tid - lane + src < n:
            out[tid] = values[tid - lane + src]
    return out


def down(delta):
    return lambda lane: lane + delta if lane + delta < 32 else None


def up(delta):
    return lambda lane: lane - delta if lane - delta >= 0 else None


def xor(m):
    return lambda lane: lane ^ (m & 31)


def idx(src):
    return lambda lane: src & 31


@cuda.jit
def chain_kernel(values, out, modes, args):
    """Apply shuffles one after another; record every intermediate result."""
    tid = cuda.threadIdx.x
    v = values[tid]
    for s in range(modes.shape[0]):
        if modes[s] == 0:
            v = cuda.shfl_down_sync(FULL, v, args[s])
        elif modes[s] == 1:
            v = cuda.shfl_up_sync(FULL, v, args[s])
        elif modes[s] == 2:
            v = cuda.shfl_xor_sync(FULL, v, args[s])
        else:
            v = cuda.shfl_sync(FULL, v, args[s])
        out[s, tid] = v


MODELS = (down, up, xor, idx)


def run_chain(values, modes, args):
    out = np.full((len(modes), len(values)), np.nan if values.dtype.kind == "f" else -1,
                  dtype=values.dtype)
    with sim_shim.fast_thread_switching():
        chain_kernel[1, len(values)](values, out, np.asarray(modes, np.int64),
                                     np.asarray(args, np.int64))
    expected = values.copy()
    for s, (mode, arg) in enumerate(zip(modes, args)):
        expected = hw_model(expected, MODELS[mode](arg))
        np.testing.assert_array_equal(out[s], expected, err_msg=f"step {s}: mode {mode} arg {arg}")


def test_shfl_down_reduction_offsets_16_to_1():
    """The article's five shuffles: lanes whose source is >= 32 keep their own value, and
    lane 0 of every warp ends with the warp's sum."""
    rng = np.random.default_rng(1)
    values = rng.standard_normal(64).astype(np.float32)
    out = np.zeros(64, np.float32)

    @cuda.jit
    def reduce_kernel(values, out):
        tid = cuda.threadIdx.x
        v = values[tid]
        v += cuda.shfl_down_sync(FULL, v, 16)
        v += cuda.shfl_down_sync(FULL, v, 8)
        v += cuda.shfl_down_sync(FULL, v, 4)
        v += cuda.shfl_down_sync(FULL, v, 2)
        v += cuda.shfl_down_sync(FULL, v, 1)
        out[tid] = v

    with sim_shim.fast_thread_switching():
        reduce_kernel[1, 64](values, out)
    expected = values.copy()
    for offset in (16, 8, 4, 2, 1):
        expected = expected + hw_model(expected, down(offset))
    np.testing.assert_array_equal(out, expected)
    for warp in range(2):
        np.testing.assert_allclose(out[32 * warp], values[32 * warp:32 * warp + 32].sum(),
                                   rtol=1e-5)


def test_shfl_down_all_offsets_random_floats():
    rng = np.random.default_rng(2)
    values = rng.standard_normal(64).astype(np.float32)
    offsets = [16, 8, 4, 2, 1, 0, 31, 32, 5, 40]
    run_chain(values, [0] * len(offsets), offsets)


def test_shfl_xor_up_idx_mixed_ints():
    """Other modes and int values; consecutive shuffles reuse the double-buffered scratch."""
    rng = np.random.default_rng(3)
    values = rng.integers(-1000, 1000, 64).astype(np.int32)
    modes = [2, 2, 1, 0, 3, 2, 1, 3, 0, 2]
    args = [16, 1, 3, 7, 5, 31, 33, 37, 1, 8]
    run_chain(values, modes, args)


def test_partial_last_warp():
    """48 threads: the second warp has 16 lanes; sources past them keep the reader's value."""
    rng = np.random.default_rng(4)
    values = rng.standard_normal(48).astype(np.float32)
    run_chain(values, [0, 0, 2, 1], [8, 16, 4, 2])


def test_divergent_shuffle_is_reported():
    """Only even threads shuffle a second time: reading a lane that skipped it is an error."""

    @cuda.jit
    def divergent(out):
        tid = cuda.threadIdx.x
        v = cuda.shfl_xor_sync(FULL, tid, 1)
        if tid % 2 == 0:
            v = cuda.shfl_xor_sync(FULL, v, 1)
        out[tid] = v

    out = np.zeros(32, np.int64)
    with pytest.raises(RuntimeError, match="same shuffles"):
        with sim_shim.fast_thread_switching():
            divergent[1, 32](out)


def test_partial_mask_is_rejected():
    @cuda.jit
    def half_mask(out):
        out[cuda.threadIdx.x] = cuda.shfl_down_sync(0x0000FFFF, 1.0, 1)

    with pytest.raises(NotImplementedError, match="full-warp"):
        half_mask[1, 32](np.zeros(32, np.float32))


def test_switch_interval_restored():
    before = sys.getswitchinterval()
    with sim_shim.fast_thread_switching():
        assert sys.getswitchinterval() == pytest.approx(sim_shim.SIM_SWITCH_INTERVAL)
    assert sys.getswitchinterval() == before


def test_libdevice_bit_casts():
    rng = np.random.default_rng(5)
    floats = np.concatenate([rng.standard_normal(200).astype(np.float32) * 1e3,
                             np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -3.4e38],
                                      np.float32)])
    for x in floats:
        i = sim_shim.libdevice.float_as_int(x)
        assert i.dtype == np.int32 and i == np.array(x).view(np.int32)
        y = sim_shim.libdevice.int_as_float(i)
        assert y.dtype == np.float32 and np.array(y).view(np.int32) == i
    nan = sim_shim.libdevice.int_as_float(0x7FC00000)
    assert np.isnan(nan)
    # negative ints (sign bit set) map to negative floats
    assert sim_shim.libdevice.int_as_float(np.int32(-1073741824)) == np.float32(-2.0)


@cuda.jit
def _shared_neighbour_kernel(out):
    buf = cuda.shared.array(64, np.float32)
    tid = cuda.threadIdx.x
    buf[tid] = tid + 1000 * cuda.blockIdx.x
    cuda.syncthreads()
    out[cuda.blockIdx.x, tid] = buf[(tid + 1) % 64]


def test_shared_array_is_shared_under_fast_switching():
    """Every thread of a block gets the same shared array.  numba-cuda's simulator allocates
    it with an unlocked check-then-insert; under the 1e-5 s switch interval two threads could
    each keep a private array (seen as rare wrong results); the shim locks the allocation."""
    blocks = 40
    expected = (np.arange(64)[None, :] + 1) % 64 + 1000 * np.arange(blocks)[:, None]
    for _ in range(3):
        out = np.full((blocks, 64), -1.0, np.float32)
        with sim_shim.fast_thread_switching():
            _shared_neighbour_kernel[blocks, 64](out)
        assert (out == expected).all()


# --- the lockstep block runner (sim_block.py): warp-level waits, divergence, deadlock --------

def test_warps_shuffle_independently():
    """Only a warp waits at a shuffle, as on hardware: warp 0 shuffles three times, warp 1 once,
    and both then meet at one syncthreads."""

    @cuda.jit
    def uneven(out):
        tid = cuda.threadIdx.x
        v = tid
        if tid < 32:
            v = cuda.shfl_xor_sync(FULL, v, 1)
            v = cuda.shfl_xor_sync(FULL, v, 2)
            v = cuda.shfl_xor_sync(FULL, v, 4)
        else:
            v = cuda.shfl_down_sync(FULL, v, 8)
        cuda.syncthreads()
        out[tid] = v

    out = np.zeros(64, np.int64)
    uneven[1, 64](out)
    lanes = np.arange(32)
    np.testing.assert_array_equal(out[:32], lanes ^ 7)
    np.testing.assert_array_equal(out[32:], 32 + np.where(lanes + 8 < 32, lanes + 8, lanes))


def test_syncwarp_orders_a_warp():
    @cuda.jit
    def neighbours(out):
        buf = cuda.shared.array(32, np.int64)
        lane = cuda.threadIdx.x
        buf[lane] = 10 * lane
        cuda.syncwarp(FULL)
        out[lane] = buf[(lane + 1) % 32]

    out = np.zeros(32, np.int64)
    neighbours[1, 32](out)
    np.testing.assert_array_equal(out, 10 * ((np.arange(32) + 1) % 32))


def test_barrier_in_a_divergent_branch_is_reported():
    """Warp 0 waits at a barrier inside its branch, warp 1 at the one after it: on a GPU the
    block hangs or runs on with a broken barrier; here the launch says which lines."""

    @cuda.jit
    def divergent(out):
        tid = cuda.threadIdx.x
        if tid < 32:
            cuda.syncthreads()
        cuda.syncthreads()
        out[tid] = 1

    with pytest.raises(sim_block.BarrierDivergence,
                       match=r"threads 0-31 at test_sim_shim.py:\d+ .*threads 32-63"):
        divergent[1, 64](np.zeros(64, np.int64))


def test_shuffle_in_a_divergent_branch_is_reported():
    @cuda.jit
    def two_sites(out):
        tid = cuda.threadIdx.x
        if tid % 2 == 0:
            v = cuda.shfl_xor_sync(FULL, tid, 2)
        else:
            v = cuda.shfl_xor_sync(FULL, tid, 1)
        out[tid] = v

    with pytest.raises(sim_block.BarrierDivergence,
                       match=r"shuffle #1 is shfl_xor_sync at test_sim_shim.py:\d+ .* made its "
                             r"shuffle #1 with shfl_xor_sync at test_sim_shim.py:\d+"):
        two_sites[1, 32](np.zeros(32, np.int64))


def test_deadlock_is_reported_not_hung():
    """Lanes 0-15 wait at a shuffle for lanes 16-31, which wait at syncthreads for them."""

    @cuda.jit
    def stuck(out):
        tid = cuda.threadIdx.x
        v = tid
        if tid < 16:
            v = cuda.shfl_xor_sync(FULL, v, 16)
        else:
            cuda.syncthreads()
        out[tid] = v

    with pytest.raises(sim_block.SimulatorDeadlock,
                       match=r"threads 0-15 at shfl_xor_sync .*threads 16-31 at syncthreads"):
        stuck[1, 32](np.zeros(32, np.int64))


def test_a_shuffle_some_lanes_skip_is_reported_at_the_next_barrier():
    """Lanes 0-15 shuffle among themselves and return; lanes 16-31, alive, never take part:
    on hardware the shuffle waits for them and they wait at syncthreads."""

    @cuda.jit
    def half(out):
        tid = cuda.threadIdx.x
        if tid < 16:
            out[tid] = cuda.shfl_xor_sync(FULL, tid, 1)
            return
        cuda.syncthreads()
        out[tid] = tid

    with pytest.raises(sim_block.BarrierDivergence,
                       match=r"threads 16-31 made 0 shuffle\(s\); threads 0-15 made 1"):
        half[1, 32](np.zeros(32, np.int64))


def test_a_lane_may_run_ahead_to_values_already_left():
    """A shuffle waits only for the lane it reads: in the five-step shfl_down tree every lane
    reads a higher lane, which (threads take turns from the highest id down) has always left
    its value already, so the tree runs without a single hand-over; the sums are the
    hardware's."""
    handovers = []

    class Count(sim_block.LockstepBlock):
        def _give_turn(self, me):
            handovers.append(me)
            return super()._give_turn(me)

    @cuda.jit
    def tree(values, out):
        tid = cuda.threadIdx.x
        v = values[tid]
        for offset in (16, 8, 4, 2, 1):
            v += cuda.shfl_down_sync(FULL, v, offset)
        out[tid] = v

    from numba.cuda.simulator import kernel as sim_kernel

    values = np.arange(64, dtype=np.float64)
    out = np.zeros(64)
    sim_kernel.BlockManager = Count
    try:
        tree[1, 64](values, out)
    finally:
        sim_kernel.BlockManager = sim_block.LockstepBlock
    assert out[0] == values[:32].sum() and out[32] == values[32:].sum()
    assert len([t for t in handovers if t is not None]) == 0


def test_a_failing_thread_ends_the_launch_and_the_next_launch_runs():
    @cuda.jit
    def fails(out):
        tid = cuda.threadIdx.x
        cuda.syncthreads()
        if tid == 5:
            out[1000] = 1                      # out of range
        cuda.syncthreads()
        out[tid] = 1

    before = threading.active_count()
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\]"):
        fails[1, 64](np.zeros(64, np.int64))
    assert threading.active_count() <= before + 1      # the block's threads have left
    out = np.zeros((1, 64), np.float32)
    _shared_neighbour_kernel[1, 64](out)
    assert (out[0] == (np.arange(64) + 1) % 64).all()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_that_ends_before_it_runs_fails_the_launch_instead_of_hanging_it():
    """A thread the interpreter refuses to start (here a trace function refuses its run(), as
    CPython refuses one of two threads installing a trace function at once) never takes the
    turn handed to it: the launch fails and names it, the next launch runs."""
    def refuse(frame, event, arg):
        if isinstance(threading.current_thread(), sim_block.LaneThread) and \
                threading.current_thread().thread_id == 3 and frame.f_code.co_name == "run":
            raise RuntimeError("refused for the test")
        return None

    traced_before = threading.gettrace()
    threading.settrace(refuse)
    try:
        with pytest.raises(sim_block.SimulatedThreadNotStarted, match=r"tid=\[3, 0, 0\]"):
            _shared_neighbour_kernel[1, 64](np.zeros((1, 64), np.float32))
    finally:
        threading.settrace(traced_before)
    out = np.zeros((1, 64), np.float32)
    _shared_neighbour_kernel[1, 64](out)
    assert (out[0] == (np.arange(64) + 1) % 64).all()


def test_barrier_rounds_are_counted_per_thread():
    @cuda.jit
    def rounds(out):
        for _ in range(3):
            cuda.syncthreads()
        out[cuda.threadIdx.x] = 1

    seen = []

    class Watch(sim_block.LockstepBlock):
        def run(self, grid_point, *args):
            super().run(grid_point, *args)
            seen.append((self.barrier_rounds, {t.barriers_passed for t in self.threads}))

    from numba.cuda.simulator import kernel as sim_kernel

    sim_kernel.BlockManager = Watch
    try:
        rounds[2, 40](np.zeros(40, np.int64))
    finally:
        sim_kernel.BlockManager = sim_block.LockstepBlock
    assert seen == [(3, {3}), (3, {3})]
