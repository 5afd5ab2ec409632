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
import math
import os

from numba import cuda, float32, int32

from paged_tutorial.backends.numba_cuda.device.reduce import FULL_MASK, WARP_SIZE
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING
from paged_tutorial.backends.numba_cuda.device.dtypes import float_to_bf16_bits, rnd_bf16
from paged_tutorial.backends.numba_cuda.device.vector_io import CHUNK_ELEMS, CHUNK_WORDS, load_u32x4, load_u32x4_nc, unpack2
from paged_tutorial.backends.numba_cuda.device.grid_dependency import allow_next_grid, wait_for_previous_grid
from paged_tutorial.backends.numba_cuda.runtime.launch import overlapping
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


#: blocks of ``WARPS`` warps per SM a GEMV launches at most (``resident_blocks``), each
#: looping over row blocks: room is left on every SM for the next kernel's blocks to start and
#: load their weights while this one finishes (``device/grid_dependency.py``).  Measured on an
#: H200 (Llama-3.2-1B shapes, batch 1, graph replay): 2 -> 1.034 ms per step, 4 -> 1.043,
#: 8 -> 1.045, no cap -> 1.041: within the noise of one another, so the cap buys little.
#: ``PAGED_TUTORIAL_GEMV_BLOCKS_PER_SM`` overrides it (0: no cap, one block per row block).
BLOCKS_PER_SM = int(os.environ.get("PAGED_TUTORIAL_GEMV_BLOCKS_PER_SM", "2"))


@functools.lru_cache(maxsize=None)
def resident_blocks() -> int:
    """The GEMVs' grid cap on this device (no cap with BLOCKS_PER_SM 0; in the simulator,
    which runs blocks one after another, the few blocks of ``launch.SIM_MAX_BLOCKS``)."""
    if SIMULATING:
        from paged_tutorial.backends.numba_cuda.runtime.launch import SIM_MAX_BLOCKS

        return SIM_MAX_BLOCKS
    if BLOCKS_PER_SM <= 0:
        return 1 << 30
    import torch

    return BLOCKS_PER_SM * torch.cuda.get_device_properties(torch.cuda.current_device()) \
        .multi_processor_count


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
    @overlapping
    def gemv(x, x_row_words, w, out, out_row, n_rows):
        wib = cuda.threadIdx.x // WARP_SIZE       # warp in block
        lane = cuda.threadIdx.x % WARP_SIZE
        seg = wib % KSPLIT
        c_lo = seg * SEG
        c_hi = min(c_lo + SEG, CHUNKS)
        partial = cuda.shared.array((32, T), float32)
        acc = cuda.local.array(T, float32)
        wv = cuda.local.array((UN, CHUNK_WORDS), int32)
        waited = False
        n_row_blocks = (n_rows + ROWS - 1) // ROWS
        for row_block in range(cuda.blockIdx.x, n_row_blocks, cuda.gridDim.x):
            row = row_block * ROWS + wib // KSPLIT
            valid = row < n_rows and wib < ROWS * KSPLIT
            for t in range(T):
                acc[t] = float32(0.0)
            w_base = row * ROW_WORDS
            for round_ in range(ROUNDS):
                for u in range(UN):               # issue every load of the round first
                    c = c_lo + lane + (round_ * UN + u) * WARP_SIZE
                    if valid and c < c_hi:
                        w0, w1, w2, w3 = load_u32x4_nc(w, w_base + c * CHUNK_WORDS)
                    else:
                        w0 = w1 = w2 = w3 = int32(0)
                    wv[u, 0] = w0
                    wv[u, 1] = w1
                    wv[u, 2] = w2
                    wv[u, 3] = w3
                if not waited:                    # weights in flight; x is the last kernel's
                    wait_for_previous_grid()
                    allow_next_grid()
                    waited = True
                for u in range(UN):
                    c = c_lo + lane + (round_ * UN + u) * WARP_SIZE
                    if valid and c < c_hi:
                        for t in range(T):
                            x0, x1, x2, x3 = load_u32x4(x, t * x_row_words + c * CHUNK_WORDS)
                            xs = (x0, x1, x2, x3)
                            s = float32(0.0)
                            for k in range(CHUNK_WORDS):
                                wa, wb = unpack2(wv[u, k])
                                xa, xb = unpack2(xs[k])
                                s += wa * xa + wb * xb
                            acc[t] += s
            for t in range(T):                    # every lane of every warp: whole warps
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
            else:
                if lane == 0:
                    for t in range(T):
                        partial[wib, t] = acc[t]
                cuda.syncthreads()
                if lane == 0 and seg == 0 and valid:  # the row's first warp adds the segments
                    for t in range(T):
                        v = partial[wib, t]
                        for j in range(1, KSPLIT):
                            v += partial[wib + j, t]
                        out[t * out_row + row] = float_to_bf16_bits(v)
                cuda.syncthreads()                # partial is reused by the next row block
        if not waited:                            # no rows here: still ordered after the last
            wait_for_previous_grid()
            allow_next_grid()

    return gemv


def grid(n_out: int, K: int, warps: int = WARPS) -> int:
    """Blocks for N = n_out output rows: one row block each, at most ``resident_blocks()``
    (the kernels loop over row blocks)."""
    return min(-(-n_out // rows_per_block(K, warps)), resident_blocks())


# --- two rows per warp: the QKV projection with RoPE, the gate/up projection with SwiGLU -------

def pair_supported(K: int) -> bool:
    """One warp per pair of rows, each lane one round of loads: K up to 2048."""
    return K % CHUNK_ELEMS == 0 and k_split(K) == 1


def fused_qkv_supported(K: int, head_dim: int) -> bool:
    return pair_supported(K) and head_dim % 2 == 0


@functools.lru_cache(maxsize=None)
def pair_dot(T: int, K: int):
    """Device function ``pair_dot(x, x_row_words, w, n0, n1, valid, lane, acc0, acc1,
    first)``: the warp's dot products of rows n0 and n1 of W with the T rows of x, as
    ``gemv_kernel`` computes a row (same loads, same float32 sums), into ``acc0[t]`` /
    ``acc1[t]`` of every lane.  On the block's ``first`` pair both rows' weight loads are
    issued before ``wait_for_previous_grid`` (x is the previous kernel's output; the weights
    are not)."""
    if not pair_supported(K):
        raise ValueError(f"paired GEMV: K = {K} needs one round of loads per lane")
    CHUNKS = K // CHUNK_ELEMS
    PER_LANE = -(-CHUNKS // WARP_SIZE)
    ROW_WORDS = K // 2

    @cuda.jit(device=True)
    def dot_two_rows(x, x_row_words, w, n0, n1, valid, lane, acc0, acc1, first):
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
        if first:                                 # weights in flight; x is the last kernel's
            wait_for_previous_grid()
            allow_next_grid()
        for u in range(PER_LANE):
            c = lane + u * WARP_SIZE
            if valid and c < CHUNKS:
                for t in range(T):
                    x0, x1, x2, x3 = load_u32x4(x, t * x_row_words + c * CHUNK_WORDS)
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

    return dot_two_rows


@functools.lru_cache(maxsize=None)
def qkv_rope_write_kv_kernel(T: int, K: int):
    """``linear(x, w_qkv)`` + ``rope_write_kv`` in one kernel, for bf16 decode.

    A warp computes the rows n and n + D/2 of one head (the pair RoPE rotates together) with
    ``pair_dot``, then lane 0 applies ``rope.rotate_pair``'s arithmetic to the rounded pair and
    writes it: q heads into the q part of ``out``; k heads into ``out`` and the token's cache
    row; v heads as they are into ``out`` and the cache.  ``out`` is what ``linear`` returns
    ([T, N] bf16 bits), with q and k already rotated.
    Launch: ``grid = qkv_grid(N)``, ``block = 32 * WARPS``."""
    dot_two_rows = pair_dot(T, K)

    @cuda.jit(device=True)
    def store_rotated_pair(acc0, acc1, h, i, n0, n1, out, n_out, positions, cos, sin,
                           n_q_heads, n_kv_heads, head_dim, kv_cache, block_table, layer, slots,
                           KV_DIM, BLOCK_SIZE, BLOCK_ELEMS, V_OFFSET_ELEMS):
        half = head_dim // 2
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

    @cached_kernel
    @overlapping
    def qkv_rope_write_kv(x, x_row_words, w, out, n_out, positions, cos, sin, n_q_heads,
                          n_kv_heads, head_dim, kv_cache, block_table, layer, slots, KV_DIM,
                          BLOCK_SIZE, BLOCK_ELEMS, V_OFFSET_ELEMS):
        warps = cuda.blockDim.x // WARP_SIZE
        lane = cuda.threadIdx.x % WARP_SIZE
        half = head_dim // 2
        acc0 = cuda.local.array(T, float32)
        acc1 = cuda.local.array(T, float32)
        n_pair_blocks = (n_out // 2 + warps - 1) // warps
        first = True
        for pair_block in range(cuda.blockIdx.x, n_pair_blocks, cuda.gridDim.x):
            pair = pair_block * warps + cuda.threadIdx.x // WARP_SIZE
            valid = pair < n_out // 2
            h = pair // half
            i = pair - h * half
            n0 = h * head_dim + i
            n1 = n0 + half
            dot_two_rows(x, x_row_words, w, n0, n1, valid, lane, acc0, acc1, first)
            first = False
            if lane == 0 and valid:
                store_rotated_pair(acc0, acc1, h, i, n0, n1, out, n_out, positions, cos, sin,
                                   n_q_heads, n_kv_heads, head_dim, kv_cache, block_table,
                                   layer, slots, KV_DIM, BLOCK_SIZE, BLOCK_ELEMS,
                                   V_OFFSET_ELEMS)
        if first:                                 # no pairs here: still ordered after the last
            wait_for_previous_grid()
            allow_next_grid()

    return qkv_rope_write_kv


def qkv_grid(n_out: int, warps: int = WARPS) -> int:
    return pair_grid(n_out // 2, warps)


@functools.lru_cache(maxsize=None)
def linear_silu_mul_kernel(T: int, K: int):
    """``silu_mul(linear(x, w_gate_up))`` in one kernel, for bf16 decode: a warp computes gate
    row n and up row n + I with ``pair_dot``, and lane 0 stores ``silu(gate) * up`` with the
    unfused ops' roundings (the projection rounded to bf16, then ``elementwise.silu_mul``'s
    arithmetic), so the bits are the same.  out is [T, I] bf16 bits.
    Launch: ``grid = pair_grid(I)``, ``block = 32 * WARPS``."""
    dot_two_rows = pair_dot(T, K)

    @cached_kernel
    @overlapping
    def linear_silu_mul(x, x_row_words, w, out, inter):
        warps = cuda.blockDim.x // WARP_SIZE
        lane = cuda.threadIdx.x % WARP_SIZE
        acc0 = cuda.local.array(T, float32)
        acc1 = cuda.local.array(T, float32)
        first = True
        for pair_block in range(cuda.blockIdx.x, (inter + warps - 1) // warps, cuda.gridDim.x):
            n = pair_block * warps + cuda.threadIdx.x // WARP_SIZE
            valid = n < inter
            dot_two_rows(x, x_row_words, w, n, n + inter, valid, lane, acc0, acc1, first)
            first = False
            if lane == 0 and valid:
                for t in range(T):
                    g = rnd_bf16(acc0[t])          # what linear would have stored
                    u = rnd_bf16(acc1[t])
                    silu = rnd_bf16(g / (float32(1.0) + math.exp(-g)))
                    out[t * inter + n] = float_to_bf16_bits(silu * u)
        if first:                                 # no rows here: still ordered after the last
            wait_for_previous_grid()
            allow_next_grid()

    return linear_silu_mul


def pair_grid(n_pairs: int, warps: int = WARPS) -> int:
    """Blocks for ``n_pairs`` warp pairs, at most ``resident_blocks()`` (the kernels loop)."""
    return min(-(-n_pairs // warps), resident_blocks())
