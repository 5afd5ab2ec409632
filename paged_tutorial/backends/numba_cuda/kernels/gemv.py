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

At batch 1 a decoder layer's GEMVs carry the work around them in their prologues and
epilogues: RoPE and the cache write in the QKV GEMV's epilogue, the SwiGLU in the gate/up
GEMV's (``KernelOptions.fuse_epilogues``, the default).  With ``KernelOptions.fuse_norms`` the
layer is five kernels: the RMSNorms move into the QKV and gate/up GEMVs' prologues, and the
residual adds into the output and down projections' epilogues (``add_into_out``); every block
first issues its weight loads, then waits for the previous kernel
(``device/grid_dependency.py``), and only then reads activations, so the norm's block
reduction runs while the weights are on their way.  That variant is not the default: on the
H200 it measured slower than a separate ``add_rms_norm`` kernel (``docs/measured.md``).

Two launches (``KernelOptions.gemv_wave``, ``wave_grid``): a capped grid of ``WARPS``-warp
blocks, at most ``BLOCKS_PER_SM`` per SM, each looping over row blocks (only the first row
block's weights are in flight during the wait); or one wave: a block of ``WAVE_WARPS`` warps
per row block and no loop, each block letting the next kernel in at its entry
(``early``), issuing all of its weight loads, holding them in registers and only then
waiting.  The blocks that do not fit at once start as earlier ones finish, and the next
kernel's blocks take the slots the last ones leave.  With the norms in the prologues, a
one-wave block normalises in each warp (``PairDot.normalize_own_chunks``): every block pays
the norm, so it must cost no barrier.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32

from paged_tutorial.backends.numba_cuda.device.reduce import FULL_MASK, MAX_WARPS, WARP_SIZE, block_sum
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING
from paged_tutorial.backends.numba_cuda.device.dtypes import bf16_bits_to_float, float_to_bf16_bits, rnd_bf16
from paged_tutorial.backends.numba_cuda.device.vector_io import CHUNK_ELEMS, CHUNK_WORDS, load_u32x4, load_u32x4_nc, pack2, unpack2
from paged_tutorial.backends.numba_cuda.device.grid_dependency import allow_next_grid, wait_for_previous_grid
from paged_tutorial.backends.numba_cuda.runtime.launch import overlapping
from paged_tutorial.backends.numba_cuda.kernels.rope import rotate_values
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel

#: rows of x (tokens) up to which the GEMV replaces cuBLAS: from two rows on cuBLAS is faster
#: (each extra row costs this kernel a full pass of FMAs per weight chunk; the comparison is
#: ``benchmarks/kernel_speeds.py``'s "gemv" table, figures in ``docs/measured.md``)
MAX_ROWS = 1
#: warps per block (the simulator runs two: every thread is a Python thread)
WARPS = 2 if SIMULATING else 8
#: 16-byte chunks a lane loads at once
UNROLL = 8
#: warps per block of the one-wave GEMVs (``KernelOptions.gemv_wave``): small blocks, so that
#: many of them are resident per SM, each holding its few rows' weights in registers
WAVE_WARPS = 2 if SIMULATING else 4


#: blocks of ``WARPS`` warps per SM a GEMV launches at most (``resident_blocks``), each
#: looping over row blocks: room is left on every SM for the next kernel's blocks to start and
#: load their weights while this one finishes (``device/grid_dependency.py``)
BLOCKS_PER_SM = 2


@functools.lru_cache(maxsize=None)
def resident_blocks() -> int:
    """The GEMVs' grid cap on this device (in the simulator, which runs blocks one after
    another, the few blocks of ``launch.SIM_MAX_BLOCKS``)."""
    if SIMULATING:
        from paged_tutorial.backends.numba_cuda.runtime.launch import SIM_MAX_BLOCKS

        return SIM_MAX_BLOCKS
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
def gemv_kernel(T: int, K: int, warps: int = WARPS, add_into_out: bool = False,
                early: bool = False):
    """Kernel for T activation rows of length K (K % 8 == 0): x and w as int32 words (rows
    16-byte aligned), out as bf16 bits (int16) [T, out_row].
    Launch: ``grid = ceil(N / rows_per_block(K))``, ``block = 32 * warps``.

    ``add_into_out``: ``out += x @ W.T`` (the residual add of a layer's output and down
    projections): each row's result is rounded to bf16, as ``linear`` would store it, then
    added to ``out``'s element and rounded again, as the residual add rounds.  The warp that
    computes a row is the only reader and writer of its element, so in place is safe.

    Each output row is split over ``KSPLIT = k_split(K)`` warps (long rows, e.g. the down
    projection's K = 8192): warp s of a row takes the s-th segment of its chunks, so every
    lane issues its loads in one round; the KSPLIT partial sums meet in shared memory.

    ``early`` (the one-wave launch, ``wave_grid``): every block lets the next kernel be
    scheduled as its first instruction, before its weight loads, instead of after its wait."""
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
    EARLY = early

    @cuda.jit(device=True)
    def store_row(out, i, v):
        if add_into_out:
            out[i] = float_to_bf16_bits(bf16_bits_to_float(out[i]) + rnd_bf16(v))
        else:
            out[i] = float_to_bf16_bits(v)

    @cached_kernel
    @overlapping
    def gemv(x, x_row_words, w, out, out_row, n_rows):
        if EARLY:                                 # the next kernel may start loading now
            allow_next_grid()
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
                    if not EARLY:
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
                        store_row(out, t * out_row + row, acc[t])
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
                        store_row(out, t * out_row + row, v)
                cuda.syncthreads()                # partial is reused by the next row block
        if not waited:                            # no rows here: still ordered after the last
            wait_for_previous_grid()
            if not EARLY:
                allow_next_grid()

    return gemv


def grid(n_out: int, K: int, warps: int = WARPS, wave: bool = False) -> int:
    """Blocks for N = n_out output rows: one row block each, at most ``resident_blocks()``
    (the kernels loop over row blocks); ``wave``: every row block its own block
    (``wave_grid``)."""
    return wave_grid(-(-n_out // rows_per_block(K, warps)), wave)


def wave_grid(row_blocks: int, wave: bool) -> int:
    """The grid for ``row_blocks`` row blocks.  Capped (``wave`` False): at most
    ``resident_blocks()``, each block looping over row blocks, so only its first row block's
    weights are in flight while it waits for the previous kernel.  One wave (``wave``, on a
    GPU): one block per row block, no loop: every block issues all of its weight loads, holds
    them in registers and only then waits; the blocks that do not fit on the SMs at once start
    as earlier ones finish, and the next kernel's blocks (let in at each block's entry,
    ``early``) take the slots the last ones give back.  The simulator runs blocks one after
    another: there the grid stays capped and the kernels' loop covers the rest."""
    if wave and not SIMULATING:
        return max(1, row_blocks)
    return min(row_blocks, resident_blocks())


# --- two rows per warp, the RMSNorm in the prologue: QKV with RoPE, gate/up with SwiGLU -------

def pair_supported(K: int) -> bool:
    """One warp per pair of rows, each lane one round of loads: K up to 2048."""
    return K % CHUNK_ELEMS == 0 and k_split(K) == 1


def fused_qkv_supported(K: int, head_dim: int) -> bool:
    return pair_supported(K) and head_dim % 2 == 0


class PairDot:
    """The device functions of a warp's two dot products (rows n0 and n1 of W) with T rows
    of activations of length K: the QKV kernels (the pair RoPE rotates together) and the
    gate/up kernels (the gate and up rows of one SwiGLU output).  A kernel calls, on every
    thread of the block:

    - ``load_two_rows(w, n0, n1, valid, lane, w0v, w1v)``: both rows' chunks of this lane
      into the local arrays ``w0v`` / ``w1v`` (``PER_LANE`` x 4 words), all loads issued at
      once;
    - on the block's first pair only, ``wait_for_previous_grid()``: the activations are an
      earlier kernel's output, the weights are not, so their loads are already in flight;
    - either ``dot_rows(x, x_row_words, w0v, w1v, valid, lane, acc0, acc1)``: the dot
      products with x's rows (16-byte loads, float32 sums) into ``acc0[t]`` / ``acc1[t]`` of
      every lane;
    - or, with the RMSNorm in the prologue: on the first pair after the wait
      ``normalize_rows(r, r_row_words, norm_weight, eps, scratch, x_sh)`` (each row's sum of
      squares by a block reduction, then ``rms_norm(r[t]) * norm_weight`` rounded as
      ``norms.py`` rounds it into the shared array ``x_sh`` [T, 4, CHUNKS], word k of chunk
      c at ``x_sh[t, k, c]``), and ``dot_staged_rows(x_sh, w0v, w1v, valid, lane, acc0,
      acc1)`` for every pair;
    - or, in the one-wave kernels (one pair per warp, no loop), on every warp
      ``normalize_own_chunks(r, r_row_words, norm_weight, eps, lane, x_w)``: the warp computes
      the norm of the rows itself (a warp reduction: its lanes' chunks cover the whole row)
      and each lane writes the normalised words of its own chunks into ``x_w`` (the warp's
      [T, 4, CHUNKS] slice of shared memory, read back by the same lane only, so no barrier),
      then ``dot_staged_rows(x_w, ...)``.

    The wait stays in the kernels: a device function is compiled once and linked into every
    kernel that calls it, whatever compute capability that kernel is compiled for."""

    def __init__(self, T: int, K: int):
        if not pair_supported(K):
            raise ValueError(f"paired GEMV: K = {K} needs one round of loads per lane")
        CHUNKS = K // CHUNK_ELEMS
        PER_LANE = -(-CHUNKS // WARP_SIZE)
        ROW_WORDS = K // 2
        self.PER_LANE, self.CHUNKS = PER_LANE, CHUNKS

        @cuda.jit(device=True)
        def load_two_rows(w, n0, n1, valid, lane, w0v, w1v):
            for u in range(PER_LANE):
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

        @cuda.jit(device=True)
        def warp_sums(acc0, acc1):
            for t in range(T):
                v0 = acc0[t]
                v1 = acc1[t]
                for off in (16, 8, 4, 2, 1):
                    v0 += cuda.shfl_xor_sync(FULL_MASK, v0, off)
                    v1 += cuda.shfl_xor_sync(FULL_MASK, v1, off)
                acc0[t] = v0
                acc1[t] = v1

        @cuda.jit(device=True)
        def dot_rows(x, x_row_words, w0v, w1v, valid, lane, acc0, acc1):
            for t in range(T):
                acc0[t] = float32(0.0)
                acc1[t] = float32(0.0)
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
            warp_sums(acc0, acc1)

        @cuda.jit(device=True)
        def normalize_rows(r, r_row_words, norm_weight, eps, scratch, x_sh):
            for t in range(T):
                sum_sq = float32(0.0)
                for c in range(cuda.threadIdx.x, CHUNKS, cuda.blockDim.x):
                    x0, x1, x2, x3 = load_u32x4(r, t * r_row_words + c * CHUNK_WORDS)
                    xs = (x0, x1, x2, x3)
                    for k in range(CHUNK_WORDS):
                        a, b = unpack2(xs[k])
                        sum_sq += a * a + b * b
                sum_sq = block_sum(sum_sq, scratch)
                inv_rms = float32(1.0) / math.sqrt(sum_sq / float32(K) + float32(eps))
                for c in range(cuda.threadIdx.x, CHUNKS, cuda.blockDim.x):
                    x0, x1, x2, x3 = load_u32x4(r, t * r_row_words + c * CHUNK_WORDS)
                    xs = (x0, x1, x2, x3)
                    g0, g1, g2, g3 = load_u32x4_nc(norm_weight, c * CHUNK_WORDS)
                    gs = (g0, g1, g2, g3)
                    for k in range(CHUNK_WORDS):
                        a, b = unpack2(xs[k])
                        ga, gb = unpack2(gs[k])
                        # rms_norm's roundings: the normalised value, then the product
                        x_sh[t, k, c] = pack2(ga * rnd_bf16(a * inv_rms),
                                              gb * rnd_bf16(b * inv_rms))
            cuda.syncthreads()

        @cuda.jit(device=True)
        def dot_staged_rows(x_sh, w0v, w1v, valid, lane, acc0, acc1):
            for t in range(T):
                acc0[t] = float32(0.0)
                acc1[t] = float32(0.0)
            for u in range(PER_LANE):
                c = lane + u * WARP_SIZE
                if valid and c < CHUNKS:
                    for t in range(T):
                        s0 = float32(0.0)
                        s1 = float32(0.0)
                        for k in range(CHUNK_WORDS):
                            xa, xb = unpack2(x_sh[t, k, c])
                            wa, wb = unpack2(w0v[u, k])
                            s0 += wa * xa + wb * xb
                            wa, wb = unpack2(w1v[u, k])
                            s1 += wa * xa + wb * xb
                        acc0[t] += s0
                        acc1[t] += s1
            warp_sums(acc0, acc1)

        @cuda.jit(device=True)
        def normalize_own_chunks(r, r_row_words, norm_weight, eps, lane, x_w):
            # the warp alone normalises: its lanes' chunks cover the whole row, so a warp
            # reduction gives the sum of squares (no block barrier).  Each lane stages the
            # chunks it will multiply (c = lane + 32 u) in its warp's slice of shared memory,
            # which a run-time index may address without moving the weights out of registers
            for t in range(T):
                sum_sq = float32(0.0)
                for c in range(lane, CHUNKS, WARP_SIZE):
                    x0, x1, x2, x3 = load_u32x4(r, t * r_row_words + c * CHUNK_WORDS)
                    xs = (x0, x1, x2, x3)
                    for k in range(CHUNK_WORDS):
                        a, b = unpack2(xs[k])
                        sum_sq += a * a + b * b
                for off in (16, 8, 4, 2, 1):
                    sum_sq += cuda.shfl_xor_sync(FULL_MASK, sum_sq, off)
                inv_rms = float32(1.0) / math.sqrt(sum_sq / float32(K) + float32(eps))
                for c in range(lane, CHUNKS, WARP_SIZE):
                    x0, x1, x2, x3 = load_u32x4(r, t * r_row_words + c * CHUNK_WORDS)
                    xs = (x0, x1, x2, x3)
                    g0, g1, g2, g3 = load_u32x4_nc(norm_weight, c * CHUNK_WORDS)
                    gs = (g0, g1, g2, g3)
                    for k in range(CHUNK_WORDS):
                        a, b = unpack2(xs[k])
                        ga, gb = unpack2(gs[k])
                        # rms_norm's roundings: the normalised value, then the product
                        x_w[t, k, c] = pack2(ga * rnd_bf16(a * inv_rms),
                                             gb * rnd_bf16(b * inv_rms))

        self.load_two_rows = load_two_rows
        self.dot_rows = dot_rows
        self.normalize_own_chunks = normalize_own_chunks
        self.normalize_rows = normalize_rows
        self.dot_staged_rows = dot_staged_rows


@functools.lru_cache(maxsize=None)
def pair_dot(T: int, K: int) -> PairDot:
    return PairDot(T, K)


@functools.lru_cache(maxsize=None)
def rotated_pair_store(T: int):
    """Device function ``store_rotated_pair(acc0, acc1, h, i, n0, n1, out, n_out, positions,
    cos, sin, n_q_heads, n_kv_heads, head_dim, kv_cache, block_table, layer, slots, KV_DIM,
    BLOCK_SIZE, BLOCK_ELEMS, V_OFFSET_ELEMS)``: the QKV kernels' epilogue for the rows n and
    n + D/2 of head h.  The pair is rounded as ``linear`` would store it; q and k heads are
    rotated (``rope.rotate_values``); the result goes to ``out`` and, for k and v heads, to
    the token's cache row."""

    @cuda.jit(device=True)
    def store_rotated_pair(acc0, acc1, h, i, n0, n1, out, n_out, positions, cos, sin,
                           n_q_heads, n_kv_heads, head_dim, kv_cache, block_table, layer, slots,
                           KV_DIM, BLOCK_SIZE, BLOCK_ELEMS, V_OFFSET_ELEMS):
        half = head_dim // 2
        for t in range(T):
            a = rnd_bf16(acc0[t])                  # what linear would have stored
            b = rnd_bf16(acc1[t])
            pos = positions[t]
            if h < n_q_heads + n_kv_heads:         # q or k: rotate
                a, b = rotate_values(a, b, rnd_bf16(cos[pos * half + i]),
                                     rnd_bf16(sin[pos * half + i]))
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

    return store_rotated_pair


def shared_rows_shape(T: int, K: int, normalize: bool, early: bool = False) -> tuple:
    """The shape of the shared array the norm variants stage their normalised rows in:
    [1, T, 4, CHUNKS] for the block's row (``PairDot.normalize_rows``), [WAVE_WARPS, T, 4,
    CHUNKS] for one row per warp in the one-wave kernels (``normalize_own_chunks``, launched
    with ``WAVE_WARPS`` warps); a single word for the plain variants."""
    if not normalize:
        return (1, 1, 1, 1)
    return (WAVE_WARPS if early else 1, T, CHUNK_WORDS, K // CHUNK_ELEMS)


def _qkv_kernel(T: int, K: int, normalize: bool, early: bool):
    """The QKV GEMV with RoPE and the cache write in its epilogue, the RMSNorm of x in its
    prologue when ``normalize``: ``qkv_rope_write_kv_kernel`` /
    ``norm_qkv_rope_write_kv_kernel``.  ``early``: the one-wave variant (``wave_grid``)."""
    pd = pair_dot(T, K)
    load_two_rows, dot_rows = pd.load_two_rows, pd.dot_rows
    normalize_rows, dot_staged_rows = pd.normalize_rows, pd.dot_staged_rows
    normalize_own_chunks = pd.normalize_own_chunks
    store_rotated_pair = rotated_pair_store(T)
    PER_LANE = pd.PER_LANE
    X_SH = shared_rows_shape(T, K, normalize, early)
    NORMALIZE = normalize
    EARLY = early

    def qkv_rope_write_kv(x, x_row_words, norm_weight, eps, w, out, n_out, positions, cos, sin,
                          n_q_heads, n_kv_heads, head_dim, kv_cache, block_table, layer, slots,
                          KV_DIM, BLOCK_SIZE, BLOCK_ELEMS, V_OFFSET_ELEMS):
        if EARLY:                                 # the next kernel may start loading now
            allow_next_grid()
        warps = cuda.blockDim.x // WARP_SIZE
        lane = cuda.threadIdx.x % WARP_SIZE
        half = head_dim // 2
        scratch = cuda.shared.array(MAX_WARPS, float32)
        x_sh = cuda.shared.array(X_SH, int32)   # the normalised rows (norm variant)
        acc0 = cuda.local.array(T, float32)
        acc1 = cuda.local.array(T, float32)
        w0v = cuda.local.array((PER_LANE, CHUNK_WORDS), int32)
        w1v = cuda.local.array((PER_LANE, CHUNK_WORDS), int32)
        n_pair_blocks = (n_out // 2 + warps - 1) // warps
        first = True
        for pair_block in range(cuda.blockIdx.x, n_pair_blocks, cuda.gridDim.x):
            pair = pair_block * warps + cuda.threadIdx.x // WARP_SIZE
            valid = pair < n_out // 2
            h = pair // half
            i = pair - h * half
            n0 = h * head_dim + i
            n1 = n0 + half
            load_two_rows(w, n0, n1, valid, lane, w0v, w1v)
            if first:                             # weights in flight; x is an earlier kernel's
                wait_for_previous_grid()
                if not EARLY:
                    allow_next_grid()
                if NORMALIZE and EARLY:           # each warp its own copy of the row
                    normalize_own_chunks(x, x_row_words, norm_weight, eps, lane,
                                         x_sh[cuda.threadIdx.x // WARP_SIZE])
                elif NORMALIZE:
                    normalize_rows(x, x_row_words, norm_weight, eps, scratch, x_sh[0])
                first = False
            if NORMALIZE:
                dot_staged_rows(x_sh[cuda.threadIdx.x // WARP_SIZE if EARLY else 0], w0v, w1v,
                                valid, lane, acc0, acc1)
            else:
                dot_rows(x, x_row_words, w0v, w1v, valid, lane, acc0, acc1)
            if lane == 0 and valid:
                store_rotated_pair(acc0, acc1, h, i, n0, n1, out, n_out, positions, cos, sin,
                                   n_q_heads, n_kv_heads, head_dim, kv_cache, block_table,
                                   layer, slots, KV_DIM, BLOCK_SIZE, BLOCK_ELEMS,
                                   V_OFFSET_ELEMS)
        if first:                                 # no pairs here: still ordered after the last
            wait_for_previous_grid()
            if not EARLY:
                allow_next_grid()

    # the variants go by their own names (in profiles, and in the tests that look for them)
    qkv_rope_write_kv.__name__ = qkv_rope_write_kv.__qualname__ = \
        ("norm_" if normalize else "") + "qkv_rope_write_kv"
    return cached_kernel(overlapping(qkv_rope_write_kv))


@functools.lru_cache(maxsize=None)
def qkv_rope_write_kv_kernel(T: int, K: int, early: bool = False):
    """``linear(x, w_qkv)`` + ``rope_write_kv`` in one kernel, for bf16 decode: a warp
    computes the rows n and n + D/2 of one head with ``PairDot.dot_rows``, and lane 0 stores
    them (``rotated_pair_store``).  ``out`` is what ``linear`` returns ([T, N] bf16 bits),
    with q and k already rotated.  Arguments as ``norm_qkv_rope_write_kv_kernel``'s, where
    this kernel reads neither ``norm_weight`` nor ``eps`` (launch it with x's words and 0.0
    there).  Launch: ``grid = qkv_grid(N)``, ``block = 32 * WARPS``; ``early``: the one-wave
    variant, ``grid = qkv_grid(N, WAVE_WARPS, wave=True)``, ``block = 32 * WAVE_WARPS``."""
    return _qkv_kernel(T, K, False, early)


@functools.lru_cache(maxsize=None)
def norm_qkv_rope_write_kv_kernel(T: int, K: int, early: bool = False):
    """``rms_norm`` + ``linear(x, w_qkv)`` + ``rope_write_kv`` in one kernel, for bf16 decode:
    ``qkv_rope_write_kv_kernel`` with the norm of x (the residual) in its prologue
    (``PairDot.normalize_rows``, after the first weight loads are issued and the block has
    waited; ``early``: by each warp, ``PairDot.normalize_own_chunks``).  Launch as
    ``qkv_rope_write_kv_kernel``."""
    return _qkv_kernel(T, K, True, early)


def qkv_grid(n_out: int, warps: int = WARPS, wave: bool = False) -> int:
    return pair_grid(n_out // 2, warps, wave)


@cuda.jit(device=True)
def silu_mul_bits(g_acc, u_acc):
    """SwiGLU of a gate and an up dot product, with the unfused ops' roundings (each rounded
    to bf16 as ``linear`` stores it, then ``elementwise.silu_mul``'s arithmetic): bf16 bits."""
    g = rnd_bf16(g_acc)
    u = rnd_bf16(u_acc)
    silu = rnd_bf16(g / (float32(1.0) + math.exp(-g)))
    return float_to_bf16_bits(silu * u)


def _silu_mul_kernel(T: int, K: int, normalize: bool, early: bool):
    """The gate/up GEMV with the SwiGLU in its epilogue, the RMSNorm of x in its prologue
    when ``normalize``: ``linear_silu_mul_kernel`` / ``norm_linear_silu_mul_kernel``.
    ``early``: the one-wave variant (``wave_grid``)."""
    pd = pair_dot(T, K)
    load_two_rows, dot_rows = pd.load_two_rows, pd.dot_rows
    normalize_rows, dot_staged_rows = pd.normalize_rows, pd.dot_staged_rows
    normalize_own_chunks = pd.normalize_own_chunks
    PER_LANE = pd.PER_LANE
    X_SH = shared_rows_shape(T, K, normalize, early)
    NORMALIZE = normalize
    EARLY = early

    def linear_silu_mul(x, x_row_words, norm_weight, eps, w, out, inter):
        if EARLY:                                 # the next kernel may start loading now
            allow_next_grid()
        warps = cuda.blockDim.x // WARP_SIZE
        lane = cuda.threadIdx.x % WARP_SIZE
        scratch = cuda.shared.array(MAX_WARPS, float32)
        x_sh = cuda.shared.array(X_SH, int32)   # the normalised rows (norm variant)
        acc0 = cuda.local.array(T, float32)
        acc1 = cuda.local.array(T, float32)
        w0v = cuda.local.array((PER_LANE, CHUNK_WORDS), int32)
        w1v = cuda.local.array((PER_LANE, CHUNK_WORDS), int32)
        first = True
        for pair_block in range(cuda.blockIdx.x, (inter + warps - 1) // warps, cuda.gridDim.x):
            n = pair_block * warps + cuda.threadIdx.x // WARP_SIZE
            valid = n < inter
            load_two_rows(w, n, n + inter, valid, lane, w0v, w1v)
            if first:                             # weights in flight; x is an earlier kernel's
                wait_for_previous_grid()
                if not EARLY:
                    allow_next_grid()
                if NORMALIZE and EARLY:           # each warp its own copy of the row
                    normalize_own_chunks(x, x_row_words, norm_weight, eps, lane,
                                         x_sh[cuda.threadIdx.x // WARP_SIZE])
                elif NORMALIZE:
                    normalize_rows(x, x_row_words, norm_weight, eps, scratch, x_sh[0])
                first = False
            if NORMALIZE:
                dot_staged_rows(x_sh[cuda.threadIdx.x // WARP_SIZE if EARLY else 0], w0v, w1v,
                                valid, lane, acc0, acc1)
            else:
                dot_rows(x, x_row_words, w0v, w1v, valid, lane, acc0, acc1)
            if lane == 0 and valid:
                for t in range(T):
                    out[t * inter + n] = silu_mul_bits(acc0[t], acc1[t])
        if first:                                 # no rows here: still ordered after the last
            wait_for_previous_grid()
            if not EARLY:
                allow_next_grid()

    # the variants go by their own names (in profiles, and in the tests that look for them)
    linear_silu_mul.__name__ = linear_silu_mul.__qualname__ = \
        ("norm_" if normalize else "") + "linear_silu_mul"
    return cached_kernel(overlapping(linear_silu_mul))


@functools.lru_cache(maxsize=None)
def linear_silu_mul_kernel(T: int, K: int, early: bool = False):
    """``silu_mul(linear(x, w_gate_up))`` in one kernel, for bf16 decode: a warp computes gate
    row n and up row n + I (``PairDot.dot_rows``), and lane 0 stores ``silu_mul_bits``.
    out is [T, I] bf16 bits.  Arguments ``(x, x_row_words, norm_weight, eps, w, out,
    inter)``, where this kernel reads neither ``norm_weight`` nor ``eps`` (launch it with x's
    words and 0.0 there).  Launch: ``grid = pair_grid(I)``, ``block = 32 * WARPS``; ``early``:
    the one-wave variant, ``grid = pair_grid(I, WAVE_WARPS, wave=True)``,
    ``block = 32 * WAVE_WARPS``."""
    return _silu_mul_kernel(T, K, False, early)


@functools.lru_cache(maxsize=None)
def norm_linear_silu_mul_kernel(T: int, K: int, early: bool = False):
    """``linear_silu_mul_kernel`` with the RMSNorm of x (the residual) in its prologue
    (``PairDot.normalize_rows``, after the first weight loads are issued and the block has
    waited; ``early``: by each warp, ``PairDot.normalize_own_chunks``).  Launch as
    ``linear_silu_mul_kernel``."""
    return _silu_mul_kernel(T, K, True, early)


def pair_grid(n_pairs: int, warps: int = WARPS, wave: bool = False) -> int:
    """Blocks for ``n_pairs`` warp pairs, at most ``resident_blocks()`` (the kernels loop);
    ``wave``: one block per ``warps`` pairs (``wave_grid``)."""
    return wave_grid(-(-n_pairs // warps), wave)
