"""Elementwise kernels: the embedding gather and SwiGLU's ``silu(gate) * up``.

Both use grid-stride loops (``for i in range(start, n, stride)``) so any grid covers any size:
the GPU launches one thread per element, the simulator a couple of blocks (``launch.py``).
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32

from paged_tutorial.backends.numba_cuda.device.grid_dependency import allow_next_grid, wait_for_previous_grid
from paged_tutorial.backends.numba_cuda.runtime.launch import overlapping
from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS, rnd_bf16
from paged_tutorial.backends.numba_cuda.device.vector_io import CHUNK_WORDS, load_u32x4, load_u32x4_nc, pack2, store_u32x4, unpack2
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel


@cached_kernel
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

    @cached_kernel
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


# --- bf16, 16 bytes per access (see vector_io.py) ------------------------------------------

@cached_kernel
def embed_vec_kernel(weight, w_row_words, token_ids, out, row_words, n_chunks):
    """``embed_kernel`` moving 16-byte chunks: weight and out as int32 words, rows of
    ``row_words`` words (a multiple of 4), 16-byte aligned."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    chunks_per_row = row_words // CHUNK_WORDS
    for i in range(start, n_chunks, stride):
        t = i // chunks_per_row
        j = (i - t * chunks_per_row) * CHUNK_WORDS
        w0, w1, w2, w3 = load_u32x4_nc(weight, token_ids[t] * w_row_words + j)
        store_u32x4(out, t * row_words + j, w0, w1, w2, w3)


@cached_kernel
@overlapping
def silu_mul_vec_kernel(gate_up, gu_row_words, out, inter_words, n_chunks):
    """``silu_mul`` for bf16 moving 16-byte chunks (same rounding as the scalar kernel):
    gate_up rows of 2 * inter elements as int32 words, out rows of ``inter_words`` words."""
    wait_for_previous_grid()                      # gate_up is the previous kernel's output
    allow_next_grid()
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    chunks_per_row = inter_words // CHUNK_WORDS
    for i in range(start, n_chunks, stride):
        t = i // chunks_per_row
        j = (i - t * chunks_per_row) * CHUNK_WORDS
        g0, g1, g2, g3 = load_u32x4(gate_up, t * gu_row_words + j)
        u0, u1, u2, u3 = load_u32x4(gate_up, t * gu_row_words + inter_words + j)
        gs = (g0, g1, g2, g3)
        us = (u0, u1, u2, u3)
        o = cuda.local.array(CHUNK_WORDS, int32)
        for k in range(CHUNK_WORDS):
            ga, gb = unpack2(gs[k])
            ua, ub = unpack2(us[k])
            sa = rnd_bf16(ga / (float32(1.0) + math.exp(-ga)))
            sb = rnd_bf16(gb / (float32(1.0) + math.exp(-gb)))
            o[k] = pack2(sa * ua, sb * ub)
        store_u32x4(out, t * inter_words + j, o[0], o[1], o[2], o[3])
