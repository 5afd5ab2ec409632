"""Matrix-vector products for decode at small batch: ``y = x @ W.T`` with W [N, K] in bf16.

At batch 1 a decode step is almost all weight reads: 2.47 GB of Llama-3.2-1B weights per
token, against a few kilobytes of activations.  The step can be no faster than those bytes
over the memory bandwidth (the "floor" in ``benchmarks/decode.py``), so a GEMV is good exactly
when it streams W at the copy bandwidth.  cuBLAS's kernels for a 1-row GEMM are tuned for
many shapes at once; this one does one thing:

- **one warp per output row** n: lane l reads the 16-byte chunks l, l + 32, l + 64, ... of
  W's row n (8 bf16 each, ``load_u32x4_nc``), ``UNROLL`` chunks at once so that enough bytes
  are in flight, and the same chunks of each of the T activation rows (tiny, served by L1);
- float32 products summed per lane, then across the warp with butterfly shuffles;
- lane 0 rounds the T results to bf16 once, as cuBLAS does (float32 accumulation, one
  rounding), so results differ from torch's only by the order of the sums.

Used by ``NumbaBackend.linear`` for bf16 with at most ``MAX_ROWS`` rows and K a multiple of 8
(``benchmarks/decode.py`` measures it against cuBLAS in the same run); larger batches are
GEMMs, where cuBLAS's tensor cores win, and stay with torch.
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int32

from .reduce import FULL_MASK, WARP_SIZE
from .sim_shim import SIMULATING
from .dtypes import float_to_bf16_bits
from .vector_io import CHUNK_ELEMS, CHUNK_WORDS, load_u32x4_nc, unpack2

#: rows of x (tokens) up to which the GEMV replaces cuBLAS
MAX_ROWS = 4
#: warps per block: one output row each
WARPS = 1 if SIMULATING else 8


@functools.lru_cache(maxsize=None)
def gemv_kernel(T: int, K: int):
    """Kernel for T activation rows of length K (K % 8 == 0): x and w as int32 words (rows
    16-byte aligned), out as bf16 bits (int16) [T, out_row].
    Launch: ``grid = ceil(N / WARPS)``, ``block = 32 * WARPS``."""
    if K % CHUNK_ELEMS:
        raise ValueError(f"gemv: K = {K} is not a multiple of {CHUNK_ELEMS}")
    CHUNKS = K // CHUNK_ELEMS                     # 16-byte chunks per row
    PER_LANE = -(-CHUNKS // WARP_SIZE)
    UNROLL = min(PER_LANE, 8)
    ROUNDS = -(-PER_LANE // UNROLL)
    ROW_WORDS = K // 2

    @cuda.jit
    def gemv(x, x_row_words, w, out, out_row, n_rows):
        warp = cuda.blockIdx.x * (cuda.blockDim.x // WARP_SIZE) + cuda.threadIdx.x // WARP_SIZE
        lane = cuda.threadIdx.x % WARP_SIZE
        if warp >= n_rows:                        # warp-uniform: the shuffles below stay whole
            return
        acc = cuda.local.array(T, float32)
        for t in range(T):
            acc[t] = float32(0.0)
        wv = cuda.local.array((UNROLL, CHUNK_WORDS), int32)
        w_base = warp * ROW_WORDS
        for round_ in range(ROUNDS):
            for u in range(UNROLL):               # issue every load of the round first
                c = lane + (round_ * UNROLL + u) * WARP_SIZE
                if c < CHUNKS:
                    w0, w1, w2, w3 = load_u32x4_nc(w, w_base + c * CHUNK_WORDS)
                else:
                    w0 = w1 = w2 = w3 = int32(0)
                wv[u, 0] = w0
                wv[u, 1] = w1
                wv[u, 2] = w2
                wv[u, 3] = w3
            for u in range(UNROLL):
                c = lane + (round_ * UNROLL + u) * WARP_SIZE
                if c < CHUNKS:
                    for t in range(T):
                        x0, x1, x2, x3 = load_u32x4_nc(x, t * x_row_words + c * CHUNK_WORDS)
                        xs = (x0, x1, x2, x3)
                        s = float32(0.0)
                        for k in range(CHUNK_WORDS):
                            wa, wb = unpack2(wv[u, k])
                            xa, xb = unpack2(xs[k])
                            s += wa * xa + wb * xb
                        acc[t] += s
        for t in range(T):
            v = acc[t]
            v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
            v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
            v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
            v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
            v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
            acc[t] = v
        if lane == 0:
            for t in range(T):
                out[t * out_row + warp] = float_to_bf16_bits(acc[t])

    return gemv
