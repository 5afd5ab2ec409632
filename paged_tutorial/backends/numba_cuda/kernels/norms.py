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

from numba import cuda, float32, int32

from paged_tutorial.backends.numba_cuda.device.grid_dependency import allow_next_grid, wait_for_previous_grid
from paged_tutorial.backends.numba_cuda.runtime.launch import overlapping
from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS
from paged_tutorial.backends.numba_cuda.device.reduce import MAX_WARPS, block_sum
from paged_tutorial.backends.numba_cuda.device.vector_io import (CHUNK_ELEMS, CHUNK_WORDS, load_u32x4,
                                                                  load_u32x4_nc, pack2, store_u32x4,
                                                                  unpack2)
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel


@cuda.jit(device=True)
def inverse_rms(sum_sq, scratch, hidden, eps):
    """1 / sqrt(mean(x^2) + eps) of the block's row, from this thread's partial sum of
    squares (every thread of the block gets it)."""
    sum_sq = block_sum(sum_sq, scratch)
    return float32(1.0) / math.sqrt(sum_sq / float32(hidden) + float32(eps))


@functools.lru_cache(maxsize=None)
def rms_norm_kernels(dtype_name: str):
    """(rms_norm, add_rms_norm) kernels for one storage dtype."""
    ops = DTYPE_OPS[dtype_name]
    load, store, rnd = ops.load, ops.store, ops.rnd

    @cached_kernel
    def rms_norm(x, x_row_stride, weight, out, hidden, eps):
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        scratch = cuda.shared.array(MAX_WARPS, float32)
        base = row * x_row_stride
        sum_sq = float32(0.0)
        for j in range(tid, hidden, cuda.blockDim.x):
            v = load(x, base + j)
            sum_sq += v * v
        inv_rms = inverse_rms(sum_sq, scratch, hidden, eps)
        for j in range(tid, hidden, cuda.blockDim.x):
            normed = rnd(load(x, base + j) * inv_rms)
            store(out, row * hidden + j, load(weight, j) * normed)

    @cached_kernel
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
        inv_rms = inverse_rms(sum_sq, scratch, hidden, eps)
        for j in range(tid, hidden, cuda.blockDim.x):
            # this thread wrote exactly these residual elements above: no barrier needed
            normed = rnd(load(residual, rb + j) * inv_rms)
            store(out, row * hidden + j, load(weight, j) * normed)

    return rms_norm, add_rms_norm


# --- bf16 rows, 16 bytes per access ---------------------------------------------------------
# The kernels above move 2 bytes per load, one element per thread per step: at decode (one
# row) that is latency-bound, at prefill about a fifth of the copy bandwidth.  For bf16 rows
# whose length is a multiple of 8 and whose rows start 16-byte aligned, the kernels below give
# each thread whole 16-byte chunks (8 elements), kept in registers between the sum of squares
# and the output, so a row is read once and written once with 16-byte accesses.  Rounding is
# the same as above, element for element, so the results are bit-identical.

def vec_row_threads(hidden: int, max_threads: int) -> tuple[int, int]:
    """(threads per block, chunks per thread) for a bf16 row of ``hidden`` elements: one
    16-byte chunk per thread when the row has at most ``max_threads`` chunks."""
    chunks = hidden // CHUNK_ELEMS
    threads = min(max_threads, -(-chunks // 32) * 32)
    return threads, -(-chunks // threads)


@functools.lru_cache(maxsize=None)
def rms_norm_vec_kernels(CPT: int):
    """(rms_norm, add_rms_norm) for bf16 rows as int32 words, ``CPT`` chunks per thread.
    Launch: ``grid = rows``, ``block = threads`` from ``vec_row_threads``."""
    rnd = DTYPE_OPS["bfloat16"].rnd

    @cuda.jit(device=True)
    def normalize_store(v, c, inv_rms, weight, out, ob, chunk):
        """out chunk = weight * rnd(v[c, :] * inv_rms), packed to bf16 words."""
        g0, g1, g2, g3 = load_u32x4_nc(weight, chunk * CHUNK_WORDS)
        gw = (g0, g1, g2, g3)
        o = cuda.local.array(CHUNK_WORDS, int32)
        for k in range(CHUNK_WORDS):
            wa, wb = unpack2(gw[k])
            o[k] = pack2(wa * rnd(v[c, 2 * k] * inv_rms), wb * rnd(v[c, 2 * k + 1] * inv_rms))
        store_u32x4(out, ob + chunk * CHUNK_WORDS, o[0], o[1], o[2], o[3])

    @cuda.jit(device=True)
    def normalize_row(v, sum_sq, scratch, weight, out, row, hidden, eps):
        """The block's row from this thread's partial sum of squares: every chunk of ``v``
        normalised, scaled by the weight and stored to ``out``."""
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        n_chunks = hidden // CHUNK_ELEMS
        inv_rms = inverse_rms(sum_sq, scratch, hidden, eps)
        ob = row * (hidden // 2)
        for c in range(CPT):
            chunk = tid + c * nt
            if chunk < n_chunks:
                normalize_store(v, c, inv_rms, weight, out, ob, chunk)

    @cached_kernel
    @overlapping
    def rms_norm_vec(x, x_row_words, weight, out, hidden, eps):
        wait_for_previous_grid()                  # x is the previous kernel's output
        allow_next_grid()
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        scratch = cuda.shared.array(MAX_WARPS, float32)
        n_chunks = hidden // CHUNK_ELEMS
        v = cuda.local.array((CPT, CHUNK_ELEMS), float32)
        sum_sq = float32(0.0)
        for c in range(CPT):
            chunk = tid + c * nt
            if chunk < n_chunks:
                w0, w1, w2, w3 = load_u32x4(x, row * x_row_words + chunk * CHUNK_WORDS)
                ws = (w0, w1, w2, w3)
                for k in range(CHUNK_WORDS):
                    a, b = unpack2(ws[k])
                    v[c, 2 * k] = a
                    v[c, 2 * k + 1] = b
                    sum_sq += a * a + b * b
        normalize_row(v, sum_sq, scratch, weight, out, row, hidden, eps)

    @cached_kernel
    @overlapping
    def add_rms_norm_vec(x, x_row_words, residual, res_row_words, weight, out, hidden, eps):
        wait_for_previous_grid()                  # x is the previous kernel's output
        allow_next_grid()
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        scratch = cuda.shared.array(MAX_WARPS, float32)
        n_chunks = hidden // CHUNK_ELEMS
        v = cuda.local.array((CPT, CHUNK_ELEMS), float32)
        r = cuda.local.array(CHUNK_WORDS, int32)
        sum_sq = float32(0.0)
        for c in range(CPT):
            chunk = tid + c * nt
            if chunk < n_chunks:
                xi = row * x_row_words + chunk * CHUNK_WORDS
                ri = row * res_row_words + chunk * CHUNK_WORDS
                x0, x1, x2, x3 = load_u32x4(x, xi)
                r0, r1, r2, r3 = load_u32x4(residual, ri)
                xs = (x0, x1, x2, x3)
                rs = (r0, r1, r2, r3)
                for k in range(CHUNK_WORDS):
                    xa, xb = unpack2(xs[k])
                    ra, rb = unpack2(rs[k])
                    a = rnd(ra + xa)                  # residual += x, rounded
                    b = rnd(rb + xb)
                    v[c, 2 * k] = a
                    v[c, 2 * k + 1] = b
                    r[k] = pack2(a, b)                # exact: a, b are bf16 values already
                    sum_sq += a * a + b * b
                store_u32x4(residual, ri, r[0], r[1], r[2], r[3])
        normalize_row(v, sum_sq, scratch, weight, out, row, hidden, eps)

    return rms_norm_vec, add_rms_norm_vec
