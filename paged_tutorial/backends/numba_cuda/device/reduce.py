"""Warp and block reductions shared by the row kernels (norms, sampling).

A warp reduces with butterfly shuffles (``shfl_xor_sync`` 16, 8, 4, 2, 1), after which every
lane holds the result; warp leaders then publish one value each in shared memory and every
thread combines those few values itself.  All threads of the block must call these helpers
(the shuffles and the two barriers are block-uniform), which is also what the simulator's
shuffle emulation requires (see ``sim_shim.py``).

The block size must be a multiple of 32 and at most 1024 (32 warps), so a ``scratch`` shared
array of 32 entries, allocated by the *kernel* and passed in, is enough.  (The simulator keys a
shared array by the source line that allocates it, so allocating inside a helper called twice
would alias both calls.)
"""

from __future__ import annotations

import math

from numba import cuda, float32

from paged_tutorial.backends.warp import FULL_MASK, WARP_SIZE

MAX_WARPS = 32


@cuda.jit(device=True)
def warp_sum(v):
    v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
    v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
    return v


@cuda.jit(device=True)
def warp_max(v):
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 16))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 8))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 4))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 2))
    v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, 1))
    return v


@cuda.jit(device=True)
def block_sum(v, scratch):
    """Sum of float32 ``v`` over the block, returned to every thread (same value everywhere)."""
    tid = cuda.threadIdx.x
    v = warp_sum(float32(v))
    if tid % WARP_SIZE == 0:
        scratch[tid // WARP_SIZE] = v
    cuda.syncthreads()
    total = float32(0.0)
    for w in range((cuda.blockDim.x + WARP_SIZE - 1) // WARP_SIZE):
        total += scratch[w]
    cuda.syncthreads()                      # the scratch may be reused right after
    return total


@cuda.jit(device=True)
def block_max(v, scratch):
    """Max of float32 ``v`` over the block, returned to every thread."""
    tid = cuda.threadIdx.x
    v = warp_max(float32(v))
    if tid % WARP_SIZE == 0:
        scratch[tid // WARP_SIZE] = v
    cuda.syncthreads()
    best = float32(-math.inf)
    for w in range((cuda.blockDim.x + WARP_SIZE - 1) // WARP_SIZE):
        best = max(best, scratch[w])
    cuda.syncthreads()
    return best


@cuda.jit(device=True)
def beats(x, ix, y, iy):
    """Does (value x, index ix) win an argmax against (y, iy)?  Like torch.argmax: NaN counts
    as the largest value, and ties go to the smaller index."""
    x_nan = x != x
    y_nan = y != y
    if x_nan or y_nan:
        if x_nan and y_nan:
            return ix < iy
        return x_nan
    if x > y:
        return True
    return x == y and ix < iy


@cuda.jit(device=True)
def block_argmax(v, i, scratch_v, scratch_i):
    """First index of the largest value over the block; every thread gets the index."""
    tid = cuda.threadIdx.x
    v = float32(v)
    for offset in (16, 8, 4, 2, 1):
        ov = cuda.shfl_xor_sync(FULL_MASK, v, offset)
        oi = cuda.shfl_xor_sync(FULL_MASK, i, offset)
        if beats(ov, oi, v, i):
            v = ov
            i = oi
    if tid % WARP_SIZE == 0:
        scratch_v[tid // WARP_SIZE] = v
        scratch_i[tid // WARP_SIZE] = i
    cuda.syncthreads()
    best_v = scratch_v[0]
    best_i = scratch_i[0]
    for w in range(1, (cuda.blockDim.x + WARP_SIZE - 1) // WARP_SIZE):
        if beats(scratch_v[w], scratch_i[w], best_v, best_i):
            best_v = scratch_v[w]
            best_i = scratch_i[w]
    cuda.syncthreads()
    return best_i
