"""Decode attention over the paged cache, optimised: the same function as the article's
``paged_attention_kernel`` (``attention.py``, kept as the readable reference), organised the
way memory-bound GPU code has to be.

What the article's kernel does per cached token: one block per (sequence, *query* head) reads
K and V with 2-byte loads, sums 64 products through a shuffle tree, and spends two block
barriers.  With GQA four query heads read the same K/V, so the cache is read four times, and
the barriers leave the memory system idle most of the time (its share of the copy bandwidth is
in ``docs/measured.md``).

This kernel
1. **shares each K/V read among the query heads of a KV group**: one thread block per
   (sequence, KV head, split); the ``GQA_GROUP`` query heads of the group live in registers,
   so every K/V element is read once per step instead of ``GQA_GROUP`` times.
2. **loads 16 bytes per lane**: a bf16 K/V row of 64 dims is 128 bytes = 8 lanes x 16 bytes
   (``vector_io.load_u32x4``, PTX ``ld.global.v4.u32``; Numba alone emits at most
   8-byte loads), unpacked with shifts (``vector_io.unpack2``).  (float16 / float32 caches
   and head dims not a multiple of 8 take a 4-element path.)
3. **gives each warp whole blocks of tokens, with its own online softmax and no barrier**: a
   warp takes one logical block (``BLOCK_SIZE`` tokens) per iteration, its block-table entry
   read one iteration ahead; ``LANES_PER_TOKEN`` lanes share a token (``TOKENS_PER_PASS``
   tokens per pass) and sum their partial dot products with butterfly shuffles.
   ``PASSES_PER_LOAD`` passes of K and V are loaded at once (all in flight before the first
   use), and every ``PASSES_PER_UPDATE`` passes the warp updates its running max /
   denominator / accumulator (flash-attention's recurrence); ``KernelShape`` holds the
   choices behind these numbers.  Warps meet once, at the end, in shared memory.
4. **splits long sequences across blocks (flash-decoding)** when the batch is too small to fill
   the GPU: each split reads an equal share of its sequence's logical blocks and the last
   split block to finish merges the partials, in the same launch (``split_kv.py`` holds the
   scheme, its policy ``choose_splits`` and its scratch buffers).
5. **overlaps the kernels around it** (``@overlapping``, ``device/grid_dependency.py``): a
   block reads its sequence's length, slot and first block-table entry (step inputs, written
   before the step's first kernel), then waits for the previous kernel before it reads q or
   the cache (that kernel has just written this token's K and V), and at once lets the next
   kernel, the output projection, start and issue its weight loads.  K and V are therefore
   read with coherent loads.

Launch: ``grid = (B, n_kv_heads, n_splits)``, ``block = 32 * NUM_WARPS``, with
``split_kv.scratch``'s partials and tickets.

The simulator runs the same source (``vector_io`` gives it Python loads); all
shuffles sit in block-uniform loops, as ``sim_shim`` requires.

Limits: ``head_dim % 4 == 0`` (the backend falls back to the article's kernel otherwise).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
from numba import cuda, float32, int32, int64

from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING, libdevice
from paged_tutorial.backends.numba_cuda.device.vector_io import (CHUNK_ELEMS, CHUNK_WORDS,
                                                                  load_u32x4, unpack2)
from paged_tutorial.backends.numba_cuda.device.grid_dependency import (allow_next_grid,
                                                                        wait_for_previous_grid)
from paged_tutorial.backends.numba_cuda.runtime.launch import (as_kernel_array, flat, launch,
                                                                overlapping,
                                                                rows, words)
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel
from paged_tutorial.backends.numba_cuda.kernels.split_kv import (choose_splits,
                                                                  last_split_to_finish,
                                                                  normalized, scratch,
                                                                  split_max, split_range,
                                                                  split_sum, table_entry)

from paged_tutorial.backends.warp import FULL_MASK, WARP_SIZE  # noqa: E402

NARROW_LOAD_ELEMS = 4        # head dims per load on the 8-byte path (an int64 word of bf16)
NEG_INF = float32(-math.inf)


def supports(head_dim: int) -> bool:
    return head_dim % NARROW_LOAD_ELEMS == 0 and head_dim <= 1024


def lanes_per_token(head_dim: int, max_lanes: int = 8,
                    elems_per_load: int = NARROW_LOAD_ELEMS) -> int:
    """Lanes that share one token's row: a power of two dividing head_dim / elems_per_load,
    at most ``max_lanes``."""
    loads = head_dim // elems_per_load
    lanes = 1
    while lanes * 2 <= max_lanes and loads % (lanes * 2) == 0:
        lanes *= 2
    return lanes


@dataclasses.dataclass(frozen=True)
class KernelShape:
    """How the kernel spreads a logical block over a warp.  The defaults are the package's
    choice, made by ``benchmarks/attention.py --sweep`` on an H200; the benchmark builds the
    other shapes it times.

    - ``wide``: 16-byte loads (bf16 caches whose head_dim is a multiple of 8), else 8-byte;
    - ``max_lanes``: at most this many lanes share one token's row;
    - ``load_passes``: passes (``32 // lanes`` tokens each) whose K and V are loaded at once
      (0: the whole block);
    - ``update_passes``: passes per online-softmax update (0: all loaded passes)."""

    wide: bool = True
    max_lanes: int = 8
    load_passes: int = 2
    update_passes: int = 2


#: the shape the package launches
CHOSEN_SHAPE = KernelShape()


# --- what a lane loads: K/V words and how they unpack to float32 ----------------------------

@cuda.jit(device=True)
def _bf16_hi(bits32):
    """bf16 stored in the *upper* half of a 32-bit pattern -> float32 (bits below ignored)."""
    return libdevice.int_as_float(int32(bits32 & 0xFFFF0000))


@cuda.jit(device=True)
def unpack4_bf16(w):
    """Four bf16 packed in an int64 word (little-endian) -> four float32."""
    return (_bf16_hi(w << 16), _bf16_hi(w), _bf16_hi(w >> 16), _bf16_hi(w >> 32))


@cuda.jit(device=True)
def _word_bf16(kv64, e):
    """The int64 word holding bf16 elements e..e+3 (e % 4 == 0)."""
    return kv64[e >> 2]


@cuda.jit(device=True)
def unpack4_bf16_kv(kv64, w):
    return unpack4_bf16(w)


@cuda.jit(device=True)
def unpack2_bf16_kv(kv32, w):
    return unpack2(w)


@cuda.jit(device=True)
def _index_word(a, e):
    """float16 / float32 caches: the 'word' is just the element index (loaded on use)."""
    return e


def _make_unpack4_scalar(load):
    @cuda.jit(device=True)
    def unpack4(a, e):
        if e < 0:                                 # a masked token: zeros
            return (float32(0.0), float32(0.0), float32(0.0), float32(0.0))
        return (load(a, e), load(a, e + 1), load(a, e + 2), load(a, e + 3))
    return unpack4


def wide_loads(dtype_name: str, head_dim: int, wide: bool = True) -> bool:
    """16-byte loads: bf16 caches whose head_dim is a multiple of 8."""
    return wide and dtype_name == "bfloat16" and head_dim % CHUNK_ELEMS == 0


def kv_view(buffer, wide: bool):
    """The cache buffer as the kernel reads it: bf16 as int32 pairs (16-byte loads) or int64
    words, others as they are."""
    if buffer.dtype == torch.bfloat16:
        return buffer.view(torch.int32 if wide else torch.int64)
    return buffer


@functools.lru_cache(maxsize=None)
def make_fast_decode_kernel(dtype_name: str, HEAD_DIM: int, GQA_GROUP: int, BLOCK_SIZE: int,
                            N_LAYERS: int, MAX_BLOCKS_PER_SEQ: int, KV_DIM: int,
                            BLOCK_ELEMS: int, V_OFFSET_ELEMS: int, NUM_WARPS: int = 4,
                            shape: KernelShape = CHOSEN_SHAPE):
    """Compile (once per cache layout, warps and shape) the fast decode kernel; see the
    module docstring.  ``GQA_GROUP``: query heads per KV head."""
    if not supports(HEAD_DIM):
        raise ValueError(f"fast decode attention needs head_dim % {NARROW_LOAD_ELEMS} == 0, "
                         f"got {HEAD_DIM}")
    if not isinstance(shape, KernelShape):
        raise TypeError(f"shape must be a KernelShape, got {type(shape).__name__}")
    ops = DTYPE_OPS[dtype_name]
    load, store = ops.load, ops.store
    WIDE = wide_loads(dtype_name, HEAD_DIM, shape.wide)
    # elements one load brings to a lane: 8 bf16 (16 bytes) or 4 elements
    ELEMS_PER_LOAD = CHUNK_ELEMS if WIDE else NARROW_LOAD_ELEMS
    # lanes that share one token's row (their partial dot products meet in a butterfly)
    LANES_PER_TOKEN = lanes_per_token(HEAD_DIM, shape.max_lanes, ELEMS_PER_LOAD)
    # tokens a warp covers in one pass
    TOKENS_PER_PASS = WARP_SIZE // LANES_PER_TOKEN
    # loads per lane per token row (adjacent in memory)
    LOADS_PER_ROW = HEAD_DIM // ELEMS_PER_LOAD // LANES_PER_TOKEN
    # head dims a lane owns, of q, of each token's K and V, and of the accumulator
    DIMS_PER_LANE = LOADS_PER_ROW * ELEMS_PER_LOAD
    # registers one load fills: four int32 (wide), one int64 word or one element index
    WORDS_PER_LOAD = CHUNK_WORDS if WIDE else 1
    # elements each of those registers unpacks to
    ELEMS_PER_WORD = ELEMS_PER_LOAD // WORDS_PER_LOAD
    # passes that cover one logical block
    PASSES_PER_BLOCK = -(-BLOCK_SIZE // TOKENS_PER_PASS)
    # passes whose K and V are loaded at once (all in flight before the first use)
    PASSES_PER_LOAD = PASSES_PER_BLOCK if shape.load_passes <= 0 \
        else min(shape.load_passes, PASSES_PER_BLOCK)
    while PASSES_PER_BLOCK % PASSES_PER_LOAD:
        PASSES_PER_LOAD -= 1
    # loads per logical block
    LOADS_PER_BLOCK = PASSES_PER_BLOCK // PASSES_PER_LOAD
    # passes per online-softmax update
    PASSES_PER_UPDATE = PASSES_PER_LOAD if shape.update_passes <= 0 \
        else min(shape.update_passes, PASSES_PER_LOAD)
    while PASSES_PER_LOAD % PASSES_PER_UPDATE:
        PASSES_PER_UPDATE -= 1
    # softmax updates per load
    UPDATES_PER_LOAD = PASSES_PER_LOAD // PASSES_PER_UPDATE
    # registers per lane holding one load's K (and as many holding its V)
    WORDS_PER_LANE = PASSES_PER_LOAD * LOADS_PER_ROW * WORDS_PER_LOAD
    WORD_TYPE = int32 if WIDE else int64
    if WIDE:                                      # 16-byte loads: four int32, two bf16 each
        word, unpack, MASKED = _word_bf16, unpack2_bf16_kv, 0
    elif dtype_name == "bfloat16":                # 8-byte words, four bf16 each
        word, unpack, MASKED = _word_bf16, unpack4_bf16_kv, 0
    else:                                         # element indices, loaded on use
        word, unpack, MASKED = _index_word, _make_unpack4_scalar(load), -1
    THREADS = NUM_WARPS * WARP_SIZE
    OUT_ELEMS = GQA_GROUP * HEAD_DIM

    @cuda.jit(device=True)
    def load_block(kv, kw, vw, phys, lb, lb_end, seq_len, kv_head, token_in_pass, row_part,
                   load_index):
        """This lane's K and V words of passes load_index * PASSES_PER_LOAD .. of logical
        block lb (masked tokens: zeros)."""
        base = phys * BLOCK_ELEMS + kv_head * HEAD_DIM
        for pp in range(PASSES_PER_LOAD):
            p = load_index * PASSES_PER_LOAD + pp
            t_in = p * TOKENS_PER_PASS + token_in_pass
            ok = lb < lb_end and t_in < BLOCK_SIZE and lb * BLOCK_SIZE + t_in < seq_len
            for c in range(LOADS_PER_ROW):
                e = base + t_in * KV_DIM + (row_part * LOADS_PER_ROW + c) * ELEMS_PER_LOAD
                w0 = (pp * LOADS_PER_ROW + c) * WORDS_PER_LOAD
                if WIDE:
                    if ok:
                        x0, x1, x2, x3 = load_u32x4(kv, e >> 1)
                        y0, y1, y2, y3 = load_u32x4(kv, (e + V_OFFSET_ELEMS) >> 1)
                    else:
                        x0 = x1 = x2 = x3 = y0 = y1 = y2 = y3 = int32(0)
                    kw[w0] = x0
                    kw[w0 + 1] = x1
                    kw[w0 + 2] = x2
                    kw[w0 + 3] = x3
                    vw[w0] = y0
                    vw[w0 + 1] = y1
                    vw[w0 + 2] = y2
                    vw[w0 + 3] = y3
                elif ok:
                    kw[w0] = word(kv, e)
                    vw[w0] = word(kv, e + V_OFFSET_ELEMS)
                else:
                    kw[w0] = MASKED
                    vw[w0] = MASKED

    @cuda.jit(device=True, fastmath=True)         # the kernel's own math flags
    def load_queries(q, q_base, row_part, scale, qr, acc, m, l):
        """This lane's dims of the KV group's ``GQA_GROUP`` query heads into ``qr``, scaled;
        the running max, denominator and accumulator started."""
        for h in range(GQA_GROUP):
            m[h] = NEG_INF
            l[h] = float32(0.0)
            for c in range(LOADS_PER_ROW):
                d0 = (row_part * LOADS_PER_ROW + c) * ELEMS_PER_LOAD
                for j in range(ELEMS_PER_LOAD):
                    qr[h, c * ELEMS_PER_LOAD + j] = \
                        load(q, q_base + h * HEAD_DIM + d0 + j) * float32(scale)
                    acc[h, c * ELEMS_PER_LOAD + j] = float32(0.0)

    @cuda.jit(device=True, fastmath=True)
    def token_scores(kv, kc, qr, s, update, load_index, lb, block_ok, seq_len, token_in_pass):
        """``s[u, h]``: q.k of this lane's token in each pass u of one update, summed over
        the token's lanes (masked tokens: -inf)."""
        for u in range(PASSES_PER_UPDATE):
            pl = update * PASSES_PER_UPDATE + u       # pass within the load
            t_in = (load_index * PASSES_PER_LOAD + pl) * TOKENS_PER_PASS + token_in_pass
            ok = block_ok and t_in < BLOCK_SIZE and lb * BLOCK_SIZE + t_in < seq_len
            for h in range(GQA_GROUP):
                s[u, h] = float32(0.0)
            for c in range(LOADS_PER_ROW):
                for w in range(WORDS_PER_LOAD):
                    kx = unpack(kv, kc[(pl * LOADS_PER_ROW + c) * WORDS_PER_LOAD + w])
                    for x in range(ELEMS_PER_WORD):
                        d = c * ELEMS_PER_LOAD + w * ELEMS_PER_WORD + x
                        for h in range(GQA_GROUP):
                            s[u, h] += qr[h, d] * kx[x]
            off = LANES_PER_TOKEN // 2
            while off > 0:                            # sum over the lanes of the token
                for h in range(GQA_GROUP):
                    s[u, h] += cuda.shfl_xor_sync(FULL_MASK, s[u, h], off)
                off //= 2
            if not ok:
                for h in range(GQA_GROUP):
                    s[u, h] = NEG_INF

    @cuda.jit(device=True, fastmath=True)
    def online_softmax(s, m, l, acc):
        """Flash-attention's update over one update's scores (the max is warp-uniform):
        rescale the denominator and accumulator to the new max; ``s`` becomes the
        probabilities."""
        for h in range(GQA_GROUP):
            mx = s[0, h]
            for u in range(1, PASSES_PER_UPDATE):
                mx = max(mx, s[u, h])
            off = LANES_PER_TOKEN
            while off < WARP_SIZE:                    # max over the warp's tokens
                mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, off))
                off *= 2
            m_new = max(m[h], mx)
            corr = float32(1.0)
            if m_new > NEG_INF:
                corr = math.exp(m[h] - m_new)
            m[h] = m_new
            l[h] *= corr
            for i in range(DIMS_PER_LANE):
                acc[h, i] *= corr
            for u in range(PASSES_PER_UPDATE):
                e = float32(0.0)
                if s[u, h] > NEG_INF:
                    e = math.exp(s[u, h] - m_new)
                s[u, h] = e
                l[h] += e

    @cuda.jit(device=True, fastmath=True)
    def accumulate_values(kv, vc, s, acc, update):
        """acc += p * V for this lane's tokens of one update and its dims (p = 0 where
        masked)."""
        for u in range(PASSES_PER_UPDATE):
            pl = update * PASSES_PER_UPDATE + u
            for c in range(LOADS_PER_ROW):
                for w in range(WORDS_PER_LOAD):
                    vx = unpack(kv, vc[(pl * LOADS_PER_ROW + c) * WORDS_PER_LOAD + w])
                    for x in range(ELEMS_PER_WORD):
                        d = c * ELEMS_PER_LOAD + w * ELEMS_PER_WORD + x
                        for h in range(GQA_GROUP):
                            acc[h, d] += s[u, h] * vx[x]

    @cuda.jit(device=True, fastmath=True)
    def warp_to_shared(m, l, acc, warp, lane, token_in_pass, row_part, sm_m, sm_l, sm_acc):
        """The warp's tokens were spread over lane groups: sum the groups, and leave the
        warp's max, denominator and accumulator in shared memory."""
        off = LANES_PER_TOKEN
        while off < WARP_SIZE:
            for h in range(GQA_GROUP):
                l[h] += cuda.shfl_xor_sync(FULL_MASK, l[h], off)
                for i in range(DIMS_PER_LANE):
                    acc[h, i] += cuda.shfl_xor_sync(FULL_MASK, acc[h, i], off)
            off *= 2
        if lane == 0:
            for h in range(GQA_GROUP):
                sm_m[warp, h] = m[h]
                sm_l[warp, h] = l[h]
        if token_in_pass == 0:
            for h in range(GQA_GROUP):
                for c in range(LOADS_PER_ROW):
                    d0 = (row_part * LOADS_PER_ROW + c) * ELEMS_PER_LOAD
                    for j in range(ELEMS_PER_LOAD):
                        sm_acc[warp, h, d0 + j] = acc[h, c * ELEMS_PER_LOAD + j]

    @cuda.jit(device=True, fastmath=True)
    def merge_warps(sm_m, sm_l, sm_acc, q, q_row_stride, b, kv_head, split, n_splits,
                    n_q_heads, part_acc, part_ml):
        """Each thread finishes some (head, dim) outputs from the warps' partials: the
        output itself (one split) or the split's partial (``part_acc``, ``part_ml``)."""
        for idx in range(cuda.threadIdx.x, OUT_ELEMS, THREADS):
            h = idx // HEAD_DIM
            d = idx - h * HEAD_DIM
            mm = sm_m[0, h]
            for w in range(1, NUM_WARPS):
                mm = max(mm, sm_m[w, h])
            ll = float32(0.0)
            oo = float32(0.0)
            if mm > NEG_INF:
                for w in range(NUM_WARPS):
                    f = math.exp(sm_m[w, h] - mm)
                    ll += f * sm_l[w, h]
                    oo += f * sm_acc[w, h, d]
            head = kv_head * GQA_GROUP + h
            row = (b * n_q_heads + head) * n_splits + split
            if n_splits == 1:
                store(q, b * q_row_stride + head * HEAD_DIM + d, normalized(oo, ll))
            else:
                part_acc[row * HEAD_DIM + d] = oo
                if d == 0:
                    part_ml[row * 2] = mm
                    part_ml[row * 2 + 1] = ll

    @cuda.jit(device=True, fastmath=True)
    def merge_splits(q, q_row_stride, b, kv_head, n_splits, n_q_heads, part_acc, part_ml):
        """The last split block of (sequence, KV head): every split's partial into q."""
        for idx in range(cuda.threadIdx.x, OUT_ELEMS, THREADS):
            h = idx // HEAD_DIM
            d = idx - h * HEAD_DIM
            head = kv_head * GQA_GROUP + h
            row0 = (b * n_q_heads + head) * n_splits
            ll, oo = split_sum(part_ml, part_acc, row0, n_splits,
                               split_max(part_ml, row0, n_splits), d, HEAD_DIM)
            store(q, b * q_row_stride + head * HEAD_DIM + d, normalized(oo, ll))

    @cached_kernel(fastmath=True)
    @overlapping
    def paged_attention_fast_kernel(layer, q, q_row_stride, kv, block_table, seq_lens,
                                    active_slots, scale, part_acc, part_ml, tickets):
        b = cuda.blockIdx.x                       # row of q / seq_lens (compact index)
        kv_head = cuda.blockIdx.y
        split = cuda.blockIdx.z
        n_splits = cuda.gridDim.z
        n_q_heads = cuda.gridDim.y * GQA_GROUP
        tid = cuda.threadIdx.x
        warp = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        token_in_pass = lane // LANES_PER_TOKEN   # which token of a pass
        row_part = lane % LANES_PER_TOKEN         # which dims of that token's row

        sm_m = cuda.shared.array((NUM_WARPS, GQA_GROUP), float32)
        sm_l = cuda.shared.array((NUM_WARPS, GQA_GROUP), float32)
        sm_acc = cuda.shared.array((NUM_WARPS, GQA_GROUP, HEAD_DIM), float32)
        sm_last = cuda.shared.array(1, int32)

        seq_len = seq_lens[b]
        slot = active_slots[b]
        lb_start, lb_end = split_range(seq_len, split, n_splits, BLOCK_SIZE)
        table_base = slot * N_LAYERS * MAX_BLOCKS_PER_SEQ + layer * MAX_BLOCKS_PER_SEQ
        # the step's inputs (lengths, slots, block table) were written before the step's first
        # kernel: read while the previous kernel (the QKV projection) still writes q and this
        # token's K/V, which are read only after the wait
        phys_next = table_entry(block_table, table_base, lb_start + warp, lb_end)
        wait_for_previous_grid()
        allow_next_grid()

        qr = cuda.local.array((GQA_GROUP, DIMS_PER_LANE), float32)
        acc = cuda.local.array((GQA_GROUP, DIMS_PER_LANE), float32)
        m = cuda.local.array(GQA_GROUP, float32)  # running max (the same in every lane)
        l = cuda.local.array(GQA_GROUP, float32)  # this lane's share of the denominator
        s = cuda.local.array((PASSES_PER_UPDATE, GQA_GROUP), float32)
        load_queries(q, b * q_row_stride + kv_head * GQA_GROUP * HEAD_DIM, row_part, scale,
                     qr, acc, m, l)

        # Each warp walks its logical blocks lb_start + warp, + NUM_WARPS, ...  Memory is the
        # bottleneck, so loads are issued as early as possible: the block-table entry one
        # iteration ahead, and PASSES_PER_LOAD passes of K and V words at once.
        n_iters = (lb_end - lb_start + NUM_WARPS - 1) // NUM_WARPS   # block-uniform
        kc = cuda.local.array(WORDS_PER_LANE, WORD_TYPE)   # raw K / V words of one load
        vc = cuda.local.array(WORDS_PER_LANE, WORD_TYPE)
        for it in range(n_iters):
            lb = lb_start + it * NUM_WARPS + warp
            block_ok = lb < lb_end
            phys = phys_next
            phys_next = table_entry(block_table, table_base, lb + NUM_WARPS, lb_end)
            for load_index in range(LOADS_PER_BLOCK):
                load_block(kv, kc, vc, phys, lb, lb_end, seq_len, kv_head, token_in_pass,
                           row_part, load_index)
                for update in range(UPDATES_PER_LOAD):    # PASSES_PER_UPDATE passes each
                    token_scores(kv, kc, qr, s, update, load_index, lb, block_ok, seq_len,
                                 token_in_pass)
                    online_softmax(s, m, l, acc)
                    accumulate_values(kv, vc, s, acc, update)

        warp_to_shared(m, l, acc, warp, lane, token_in_pass, row_part, sm_m, sm_l, sm_acc)
        cuda.syncthreads()
        merge_warps(sm_m, sm_l, sm_acc, q, q_row_stride, b, kv_head, split, n_splits,
                    n_q_heads, part_acc, part_ml)
        if n_splits == 1:
            return

        # --- split-KV: the last split block of this (sequence, KV head) merges ------------
        ticket = b * cuda.gridDim.y + kv_head
        if not last_split_to_finish(tickets, ticket, n_splits, sm_last):
            return
        merge_splits(q, q_row_stride, b, kv_head, n_splits, n_q_heads, part_acc, part_ml)
        if tid == 0:
            tickets[ticket] = 0

    return paged_attention_fast_kernel


# --- launch policy ------------------------------------------------------------------------

#: warps per thread block (the simulator runs one: every thread is a Python thread)
NUM_WARPS = 1 if SIMULATING else 8
#: ... and from this many (sequence, KV head) blocks on, 4 warps per block: below it 8 warps
#: keep twice the loads in flight, from it on 4 are as fast or faster (the sweep's figures
#: are in ``docs/measured.md``)
FEW_WARPS_FROM_BLOCKS = 512


def num_warps_for(batch: int, n_kv_heads: int) -> int:
    """Warps per block for a launch: depends only on the batch (a CUDA graph fixes it)."""
    if SIMULATING or batch * n_kv_heads < FEW_WARPS_FROM_BLOCKS:
        return NUM_WARPS
    return min(NUM_WARPS, 4)


def decode_attention_fast(q, cache, block_table, layer, seq_lens, active_slots, scale,
                          num_warps: int | None = None, n_splits: int | None = None,
                          shape: KernelShape | None = None, overlap: bool = True):
    """Launch the fast kernel: output written over q (as the article's kernel does).
    ``seq_lens`` / ``active_slots``: int32 on q's device; ``block_table`` as in base.py.
    ``num_warps``, ``n_splits`` and ``shape`` (default ``CHOSEN_SHAPE``) override the
    package's launch policy, for the benchmarks that time the alternatives; ``overlap``: the
    launch may start under the previous kernel's tail (``launch.launch``)."""
    c = cache.config
    n_seqs, n_q_heads, head_dim = q.shape
    n_kv = c.num_kv_heads
    nw = num_warps_for(n_seqs, n_kv) if num_warps is None else num_warps
    shape = CHOSEN_SHAPE if shape is None else shape
    kernel = make_fast_decode_kernel(c.dtype, head_dim, n_q_heads // n_kv, c.BLOCK_SIZE,
                                     c.num_layers, c.MAX_BLOCKS_PER_SEQ, c.KV_DIM,
                                     c.BLOCK_ELEMS, c.V_OFFSET_ELEMS, nw, shape)
    if n_seqs == 0:
        return q
    splits = n_splits or choose_splits(n_seqs, n_kv, c.MAX_BLOCKS_PER_SEQ, nw)
    part_acc, part_ml, tickets = scratch(q.device, n_seqs, n_q_heads, n_kv, splits, head_dim)
    qa, q_rs = rows(q, "q")
    launch(kernel, (n_seqs, n_kv, splits), nw * WARP_SIZE, int(layer), qa, q_rs,
           words(cache.buffer) if wide_loads(c.dtype, head_dim, shape.wide)
           else as_kernel_array(kv_view(cache.buffer, False)),
           flat(block_table), flat(seq_lens),
           flat(active_slots), float(scale), as_kernel_array(part_acc),
           as_kernel_array(part_ml), as_kernel_array(tickets), overlap=overlap)
    return q
