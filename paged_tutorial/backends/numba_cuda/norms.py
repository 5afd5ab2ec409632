"""RMSNorm, and RMSNorm fused with the residual add: one thread block per token row.

Each thread walks the row with a stride of ``blockDim.x``, accumulating x^2 in float32; a block
reduction (``reduce.block_sum``) gives every thread the sum of squares; each thread then writes
the elements it read.  Rounding matches HF / ``TorchBackend``:
``weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)``: the normalised value is rounded to the
storage dtype, then multiplied by the weight and rounded again.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

from .dtypes import DTYPE_OPS
from .reduce import MAX_WARPS, block_sum


@functools.lru_cache(maxsize=None)
def rms_norm_kernels(dtype_name: str):
    """(rms_norm, add_rms_norm) kernels for one storage dtype."""
    ops = DTYPE_OPS[dtype_name]
    load, store, rnd = ops.load, ops.store, ops.rnd

    @cuda.jit
    def rms_norm(x, x_row_stride, weight, out, hidden, eps):
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(MAX_WARPS, float32)
        base = row * x_row_stride
        sum_sq = float32(0.0)
        for j in range(tid, hidden, cuda.blockDim.x):
            v = load(x, base + j)
            sum_sq += v * v
        sum_sq = block_sum(sum_sq, scratch)
        inv_rms = float32(1.0) / math.sqrt(sum_sq / float32(hidden) + float32(eps))
        for j in range(tid, hidden, cuda.blockDim.x):
            normed = rnd(load(x, base + j) * inv_rms)
            store(out, row * hidden + j, load(weight, j) * normed)

    @cuda.jit
    def add_rms_norm(x, x_row_stride, residual, res_row_stride, weight, out, hidden, eps):
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(MAX_WARPS, float32)
        xb = row * x_row_stride
        rb = row * res_row_stride
        sum_sq = float32(0.0)
        for j in range(tid, hidden, cuda.blockDim.x):
            r = rnd(load(residual, rb + j) + load(x, xb + j))     # residual += x, rounded
            store(residual, rb + j, r)
            sum_sq += r * r
        sum_sq = block_sum(sum_sq, scratch)
        inv_rms = float32(1.0) / math.sqrt(sum_sq / float32(hidden) + float32(eps))
        for j in range(tid, hidden, cuda.blockDim.x):
            # this thread wrote exactly these residual elements above: no barrier needed
            normed = rnd(load(residual, rb + j) * inv_rms)
            store(out, row * hidden + j, load(weight, j) * normed)

    return rms_norm, add_rms_norm
