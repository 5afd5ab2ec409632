"""Matrix-vector products for decode at small batch: ``y = x @ W.T`` with W [N, K] in bf16.

At batch 1 a decode step is almost all weight reads: 2.47 GB of Llama-3.2-1B weights per
token, against a few kilobytes of activations.  The step can be no faster than those bytes
over the memory bandwidth (the "floor" in ``benchmarks/decode.py``), so a GEMV is good exactly
when it streams W at the copy bandwidth.  cuBLAS's kernels for a 1-row GEMM are tuned for
many shapes at once; this one does one thing:

- **one warp per output row** n (several for long rows: ``k_split``): lane l reads the
  16-byte chunks l, l + 32, l + 64, ... of W's row n (8 bf16 each, ``load_u32x4_nc``), all of
  them (at most ``UNROLL``) at once so that enough bytes are in flight, and the same chunks
  of each of the T activation rows (tiny, served by L1);
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

from paged_tutorial.backends.numba_cuda.device.reduce import FULL_MASK, WARP_SIZE
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING
from paged_tutorial.backends.numba_cuda.device.dtypes import float_to_bf16_bits, rnd_bf16
from paged_tutorial.backends.numba_cuda.device.vector_io import CHUNK_ELEMS, CHUNK_WORDS, load_u32x4_nc, unpack2
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel

#: rows of x (tokens) up to which the GEMV replaces cuBLAS.  Measured on an H200
#: (benchmarks/results/kernels-*.json, table "gemv"): at one row the GEMV and cuBLAS are
#: even over a layer's matrices (45.3 vs 45.7 us; faster for o, down and the LM head, slower
#: for gate_up) and the GEMV alone fuses with RoPE; from two rows on cuBLAS is faster
#: (each extra row costs this kernel a full pass of FMAs per weight chunk).
MAX_ROWS = 1
#: warps per block (the simulator runs two: every thread is a Python thread)
WARPS = 2 if SIMULATING else 8
#: 16-byte chunks a lane loads at once
UNROLL = 8


def k_split(K: int, warps: int = WARPS) -> int:
    """Warps that share one row: enough that each lane loads at most ``UNROLL`` chunks (one
    round of loads in flight), at most the block's warps."""
    chunks = K // CHUNK_ELEMS
    return max(1, min(warps, -(-chunks // (WARP_SIZE * UNROLL))))


def rows_per_block(K: int, warps: int = WARPS) -> int:
    return max(1, warps // k_split(K, warps))


@functools.lru_cache(maxsize=None)
def gemv_kernel(T: int, K: int, warps: int = WARPS):
    """Kernel for T activation rows of length K (K % 8 == 0): x and w as int32 words (rows
    16-byte aligned), out as bf16 bits (int16) [T, out_row].
    Launch: ``grid = ceil(N / rows_per_block(K))``, ``block = 32 * warps``.

    Each output row is split over ``KSPLIT = k_split(K)`` warps (long rows, e.g. the down
    projection's K = 8192): warp s of a row takes the s-th segment of its chunks, so every
    lane issues its loads in one round; the KSPLIT partial sums meet in shared memory."""
    if K % CHUNK_ELEMS:
        raise ValueError(f"gemv: K = {K} is not a multiple of {CHUNK_ELEMS}")
    CHUNKS = K // CHUNK_ELEMS                     # 16-byte chunks per row
    KSPLIT = k_split(K, warps)
    ROWS = max(1, warps // KSPLIT)                # rows per block
    SEG = -(-CHUNKS // KSPLIT)                    # chunks per warp
    PER_LANE = -(-SEG // WARP_SIZE)
    UN = min(PER_LANE, UNROLL)
    ROUNDS = -(-PER_LANE // UN)
    ROW_WORDS = K // 2

    @cached_kernel
    def gemv(x, x_row_words, w, out, out_row, n_rows):
        wib = cuda.threadIdx.x // WARP_SIZE       # warp in block
        lane = cuda.threadIdx.x % WARP_SIZE
        row = cuda.blockIdx.x * ROWS + wib // KSPLIT
        seg = wib % KSPLIT
        valid = row < n_rows and wib < ROWS * KSPLIT
        c_lo = seg * SEG
        c_hi = min(c_lo + SEG, CHUNKS)
        partial = cuda.shared.array((32, T), float32)
        acc = cuda.local.array(T, float32)
        for t in range(T):
            acc[t] = float32(0.0)
        wv = cuda.local.array((UN, CHUNK_WORDS), int32)
        w_base = row * ROW_WORDS
        for round_ in range(ROUNDS):
            for u in range(UN):                   # issue every load of the round first
                c = c_lo + lane + (round_ * UN + u) * WARP_SIZE
                if valid and c < c_hi:
                    w0, w1, w2, w3 = load_u32x4_nc(w, w_base + c * CHUNK_WORDS)
                else:
                    w0 = w1 = w2 = w3 = int32(0)
                wv[u, 0] = w0
                wv[u, 1] = w1
                wv[u, 2] = w2
                wv[u, 3] = w3
            for u in range(UN):
                c = c_lo + lane + (round_ * UN + u) * WARP_SIZE
                if valid and c < c_hi:
                    for t in range(T):
                        x0, x1, x2, x3 = load_u32x4_nc(x, t * x_row_words + c * CHUNK_WORDS)
                        xs = (x0, x1, x2, x3)
                        s = float32(0.0)
                        for k in range(CHUNK_WORDS):
                            wa, wb = unpack2(wv[u, k])
                            xa, xb = unpack2(xs[k])
                            s += wa * xa + wb * xb
                        acc[t] += s
        for t in range(T):                        # every lane of every warp: whole warps
            v = acc[t]
            v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
            v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
            v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
            v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
            v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
            acc[t] = v
        if KSPLIT == 1:
            if lane == 0 and valid:
                for t in range(T):
                    out[t * out_row + row] = float_to_bf16_bits(acc[t])
            return
        if lane == 0:
            for t in range(T):
                partial[wib, t] = acc[t]
        cuda.syncthreads()
        if lane == 0 and seg == 0 and valid:      # the row's first warp adds the segments
            for t in range(T):
                v = partial[wib, t]
                for j in range(1, KSPLIT):
                    v += partial[wib + j, t]
                out[t * out_row + row] = float_to_bf16_bits(v)

    return gemv


def grid(n_out: int, K: int, warps: int = WARPS) -> int:
    """Blocks for N = n_out output rows."""
    return -(-n_out // rows_per_block(K, warps))


# --- the QKV projection fused with RoPE and the cache write ----------------------------------

def fused_qkv_supported(K: int, head_dim: int) -> bool:
    """One warp per (row, row + D/2) pair, each lane one round of loads: K up to 2048."""
    return K % CHUNK_ELEMS == 0 and head_dim % 2 == 0 and k_split(K) == 1


@functools.lru_cache(maxsize=None)
def qkv_rope_write_kv_kernel(T: int, K: int):
    """``linear(x, w_qkv)`` + ``rope_write_kv`` in one kernel, for bf16 decode.

    A warp computes the rows n and n + D/2 of one head (the pair RoPE rotates together), as
    ``gemv_kernel`` computes a row (same loads, same sums, one bf16 rounding), then lane 0
    applies ``rope.rotate_pair``'s arithmetic to the rounded pair and writes it: q heads into
    the q part of ``out``; k heads into ``out`` and the token's cache row; v heads as they are
    into ``out`` and the cache.  ``out`` is what ``linear`` returns ([T, N] bf16 bits), with q
    and k already rotated.  Launch: ``grid = ceil(N / 2 / WARPS)``, ``block = 32 * WARPS``."""
    if not fused_qkv_supported(K, 2):
        raise ValueError(f"fused QKV: K = {K} needs one round of loads per lane")
    CHUNKS = K // CHUNK_ELEMS
    PER_LANE = -(-CHUNKS // WARP_SIZE)
    ROW_WORDS = K // 2

    @cached_kernel
    def qkv_rope_write_kv(x, x_row_words, w, out, n_out, positions, cos, sin, n_q_heads,
                          n_kv_heads, head_dim, kv_cache, block_table, layer, slots, KV_DIM,
                          BLOCK_SIZE, BLOCK_ELEMS, V_OFFSET_ELEMS):
        pair = cuda.blockIdx.x * (cuda.blockDim.x // WARP_SIZE) + cuda.threadIdx.x // WARP_SIZE
        lane = cuda.threadIdx.x % WARP_SIZE
        half = head_dim // 2
        valid = pair < n_out // 2
        h = pair // half
        i = pair - h * half
        n0 = h * head_dim + i
        n1 = n0 + half
        acc0 = cuda.local.array(T, float32)
        acc1 = cuda.local.array(T, float32)
        for t in range(T):
            acc0[t] = float32(0.0)
            acc1[t] = float32(0.0)
        w0v = cuda.local.array((PER_LANE, CHUNK_WORDS), int32)
        w1v = cuda.local.array((PER_LANE, CHUNK_WORDS), int32)
        for u in range(PER_LANE):                 # both rows' loads in flight at once
            c = lane + u * WARP_SIZE
            if valid and c < CHUNKS:
                a0, a1, a2, a3 = load_u32x4_nc(w, n0 * ROW_WORDS + c * CHUNK_WORDS)
                b0, b1, b2, b3 = load_u32x4_nc(w, n1 * ROW_WORDS + c * CHUNK_WORDS)
            else:
                a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = int32(0)
            w0v[u, 0] = a0
            w0v[u, 1] = a1
            w0v[u, 2] = a2
            w0v[u, 3] = a3
            w1v[u, 0] = b0
            w1v[u, 1] = b1
            w1v[u, 2] = b2
            w1v[u, 3] = b3
        for u in range(PER_LANE):
            c = lane + u * WARP_SIZE
            if valid and c < CHUNKS:
                for t in range(T):
                    x0, x1, x2, x3 = load_u32x4_nc(x, t * x_row_words + c * CHUNK_WORDS)
                    xs = (x0, x1, x2, x3)
                    s0 = float32(0.0)
                    s1 = float32(0.0)
                    for k in range(CHUNK_WORDS):
                        xa, xb = unpack2(xs[k])
                        wa, wb = unpack2(w0v[u, k])
                        s0 += wa * xa + wb * xb
                        wa, wb = unpack2(w1v[u, k])
                        s1 += wa * xa + wb * xb
                    acc0[t] += s0
                    acc1[t] += s1
        for t in range(T):
            v0 = acc0[t]
            v1 = acc1[t]
            for off in (16, 8, 4, 2, 1):
                v0 += cuda.shfl_xor_sync(FULL_MASK, v0, off)
                v1 += cuda.shfl_xor_sync(FULL_MASK, v1, off)
            acc0[t] = v0
            acc1[t] = v1
        if lane != 0 or not valid:
            return
        for t in range(T):
            a = rnd_bf16(acc0[t])                  # what linear would have stored
            b = rnd_bf16(acc1[t])
            pos = positions[t]
            if h < n_q_heads + n_kv_heads:         # q or k: rotate (rope.rotate_pair)
                cs = rnd_bf16(cos[pos * half + i])
                sn = rnd_bf16(sin[pos * half + i])
                lo = float_to_bf16_bits(rnd_bf16(a * cs) - rnd_bf16(b * sn))
                hi = float_to_bf16_bits(rnd_bf16(b * cs) + rnd_bf16(a * sn))
            else:
                lo = float_to_bf16_bits(a)
                hi = float_to_bf16_bits(b)
            out[t * n_out + n0] = lo
            out[t * n_out + n1] = hi
            if h >= n_q_heads:                     # k or v: the token's cache row too
                kh = h - n_q_heads
                offset = 0
                if kh >= n_kv_heads:
                    kh -= n_kv_heads
                    offset = V_OFFSET_ELEMS
                phys = block_table[slots[t], layer, pos // BLOCK_SIZE]
                if phys >= 0:
                    dst = phys * BLOCK_ELEMS + (pos % BLOCK_SIZE) * KV_DIM + kh * head_dim + i
                    kv_cache[dst + offset] = lo
                    kv_cache[dst + offset + half] = hi

    return qkv_rope_write_kv


def qkv_grid(n_out: int, warps: int = WARPS) -> int:
    return -(-(n_out // 2) // warps)
