"""Elementwise kernels: the embedding gather and SwiGLU's ``silu(gate) * up``.

Both use grid-stride loops (``for i in range(start, n, stride)``) so any grid covers any size:
the GPU launches one thread per element, the simulator a couple of blocks (``launch.py``).
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

from .dtypes import DTYPE_OPS


@cuda.jit
def embed_kernel(weight, w_row_stride, token_ids, out, hidden, n):
    """out[t, j] = weight[token_ids[t], j] (the article's embeddingGatherKernel,
    ``kernels.cu:347``).  A pure copy: bf16 travels as int16 bits, no conversion needed."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, n, stride):
        t = i // hidden
        j = i - t * hidden
        out[i] = weight[token_ids[t] * w_row_stride + j]


@functools.lru_cache(maxsize=None)
def silu_mul_kernel(dtype_name: str):
    """Kernel for one storage dtype: out[t, j] = silu(gate[t, j]) * up[t, j], gate_up = [gate | up].

    Rounding follows torch on bf16 tensors: ``F.silu(gate)`` is rounded to the storage dtype
    before the multiplication, whose product is rounded again on store."""
    ops = DTYPE_OPS[dtype_name]
    load, store, rnd = ops.load, ops.store, ops.rnd

    @cuda.jit
    def silu_mul(gate_up, gu_row_stride, out, inter, n):
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for i in range(start, n, stride):
            t = i // inter
            j = i - t * inter
            g = load(gate_up, t * gu_row_stride + j)
            u = load(gate_up, t * gu_row_stride + inter + j)
            s = rnd(g / (float32(1.0) + math.exp(-g)))
            store(out, i, s * u)

    return silu_mul
