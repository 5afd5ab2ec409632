"""Decode attention over the paged cache, optimised: the same function as the article's
``paged_attention_kernel`` (``attention.py``, kept as the readable reference), organised the
way memory-bound GPU code has to be.

What the article's kernel does per cached token: one block per (sequence, *query* head) reads
K and V with 2-byte loads, sums 64 products through a shuffle tree, and spends two block
barriers.  With GQA four query heads read the same K/V, so the cache is read four times, and
the barriers leave the memory system idle most of the time (4 % of the copy bandwidth at
batch 64 / context 2048 on an H200: ``benchmarks/results/attention-2026-11-30.json``).

This kernel
1. **shares each K/V read among the query heads of a KV group**: one thread block per
   (sequence, KV head, split); the ``QPK`` query heads of the group live in registers, so every
   K/V element is read once per step instead of ``QPK`` times.
2. **loads 16 bytes per lane**: a bf16 K/V row of 64 dims is 128 bytes = 8 lanes x 16 bytes
   (PTX ``ld.global.nc.v4.u32`` through a tiny intrinsic, ``load_u32x4``; Numba alone emits at
   most 8-byte loads), unpacked with shifts.  Measured: 150 us -> 97 us at batch 64 / context
   2048 against 8-byte loads, whatever the other knobs.  (float16 / float32 caches and head
   dims not a multiple of 8 take a 4-element path.)
3. **gives each warp whole blocks of tokens, with its own online softmax and no barrier**: a
   warp takes one logical block (``BLOCK_SIZE`` tokens) per iteration, its block-table entry
   read one iteration ahead; ``G`` lanes share a token (``32 // G`` tokens per pass) and sum
   their partial dot products with ``log2(G)`` butterfly shuffles.  ``LOAD_PASSES`` passes of
   K and V are loaded at once (all in flight before the first use), and every
   ``UPDATE_PASSES`` passes the warp updates its running max / denominator / accumulator
   (flash-attention's recurrence).  Warps meet once, at the end, in shared memory.
4. **splits long sequences across blocks (flash-decoding)** when the batch is too small to fill
   the GPU: split ``s`` of ``n_splits`` takes an equal share of the sequence's logical blocks
   (computed on the device from ``seq_lens``, so a CUDA graph captured once serves every
   length); each split writes an unnormalised partial output with its max and denominator,
   and the *last split block to finish* (an atomic ticket per (sequence, KV head)) merges
   them: no second kernel launch.

Launch: ``grid = (B, n_kv_heads, n_splits)``, ``block = 32 * NUM_WARPS``.  Partials
``part_acc`` [B, nH, n_splits, D] and ``part_ml`` [B, nH, n_splits, 2] (float32) and the
``tickets`` int32 [B * n_kv_heads] (zero before the launch; the merging block resets its entry
to zero, so the buffer stays ready for the next launch or graph replay).

The simulator runs the same source (``load_u32x4`` becomes a Python function there); all
shuffles sit in block-uniform loops, as ``sim_shim`` requires.

Limits: ``head_dim % 4 == 0`` (the backend falls back to the article's kernel otherwise).
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32, int64

from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING, libdevice, threadfence

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
VEC = 4                      # head dims per load (an 8-byte word of bf16)
NEG_INF = float32(-math.inf)


def supports(head_dim: int) -> bool:
    return head_dim % VEC == 0 and head_dim <= 1024


def lanes_per_token(head_dim: int, max_lanes: int = 8, vec: int = VEC) -> int:
    """G: lanes that share one token's row (a power of two dividing head_dim / vec, at most
    ``max_lanes``)."""
    chunks = head_dim // vec
    g = 1
    while g * 2 <= max_lanes and chunks % (g * 2) == 0:
        g *= 2
    return g



# --- 16-byte loads ------------------------------------------------------------------------
# Numba emits at most 8-byte loads for array elements.  Hopper reaches its bandwidth with
# 16 bytes per lane (HOPPER.md), so the bf16 path reads K/V through a tiny intrinsic that
# emits PTX ``ld.global.nc.v4.u32`` (four int32 = eight bf16; ``.nc``: the cache is read-only
# while the kernel runs), the way numba-cuda's own cache-hint loads (``cuda.ldcs``) are made.
# The simulator gets a plain Python function with the same meaning.

if SIMULATING:
    def load_u32x4(a, i):
        """Four consecutive int32 a[i..i+3] (i % 4 == 0)."""
        return (a[i], a[i + 1], a[i + 2], a[i + 3])
else:                                            # pragma: no cover - GPU only
    from llvmlite import ir as _ir
    from numba import types as _types
    from numba.cuda import cgutils as _cgutils
    from numba.cuda.extending import intrinsic as _intrinsic

    @_intrinsic
    def load_u32x4(typingctx, array, index):
        """Four consecutive int32 a[i..i+3] (i % 4 == 0, 16-byte aligned) in one load."""
        sig = _types.UniTuple(_types.int32, 4)(array, index)

        def codegen(context, builder, sig, args):
            array_type, index_type = sig.args
            ary = context.make_array(array_type)(context, builder, value=args[0])
            idx = context.cast(builder, args[1], index_type, _types.intp)
            ptr = _cgutils.get_item_pointer(context, builder, array_type, ary, [idx])
            i32 = _ir.IntType(32)
            fnty = _ir.FunctionType(_ir.LiteralStructType([i32] * 4), [ptr.type])
            asm = _ir.InlineAsm(fnty, "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];",
                                "=r,=r,=r,=r,l")
            res = builder.call(asm, [ptr])
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_value(res, k) for k in range(4)])

        return sig, codegen


@cuda.jit(device=True)
def unpack2_bf16(x):
    """Two bf16 packed in an int32 (little-endian) -> two float32."""
    return (libdevice.int_as_float(int32(x << 16)),
            libdevice.int_as_float(int32((x >> 16) << 16)))


# --- loading four consecutive elements ---------------------------------------------------

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
    return unpack2_bf16(w)


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
    return wide and dtype_name == "bfloat16" and head_dim % 8 == 0


def kv_view(buffer, wide: bool):
    """The cache buffer as the kernel reads it: bf16 as int32 pairs (16-byte loads) or int64
    words, others as they are."""
    import torch

    if buffer.dtype == torch.bfloat16:
        return buffer.view(torch.int32 if wide else torch.int64)
    return buffer


@functools.lru_cache(maxsize=None)
def make_fast_decode_kernel(dtype_name: str, HEAD_DIM: int, QPK: int, BLOCK_SIZE: int,
                            N_LAYERS: int, MAX_BLOCKS_PER_SEQ: int, KV_DIM: int,
                            BLOCK_ELEMS: int, V_OFFSET_ELEMS: int, NUM_WARPS: int = 4,
                            MAX_LANES: int = 8, UPDATE_PASSES: int = 0, LOAD_PASSES: int = 0,
                            PREFETCH: bool = False, WIDE: bool = True):
    """Compile (once per shape) the fast decode kernel; see the module docstring."""
    if not supports(HEAD_DIM):
        raise ValueError(f"fast decode attention needs head_dim % {VEC} == 0, got {HEAD_DIM}")
    ops = DTYPE_OPS[dtype_name]
    load, store = ops.load, ops.store
    WIDE = wide_loads(dtype_name, HEAD_DIM, WIDE)
    CV = 8 if WIDE else VEC                       # elements per chunk (one load per lane)
    G = lanes_per_token(HEAD_DIM, MAX_LANES, CV)  # lanes per token
    TPW = WARP_SIZE // G                          # tokens per warp pass
    CPL = HEAD_DIM // CV // G                     # chunks per lane (adjacent in memory)
    DPL = CPL * CV                                # dims per lane
    WPC = 4 if WIDE else 1                        # words per chunk (int32 | int64 | index)
    EPW = CV // WPC                               # elements per word
    PASSES = -(-BLOCK_SIZE // TPW)                # passes per logical block
    LP = PASSES if LOAD_PASSES <= 0 or PREFETCH else min(LOAD_PASSES, PASSES)
    while PASSES % LP:                            # passes loaded at once: divides PASSES
        LP -= 1
    CHUNKS = PASSES // LP
    U = LP if UPDATE_PASSES <= 0 else min(UPDATE_PASSES, LP)
    while LP % U:                                 # passes per softmax update: divides LP
        U -= 1
    STEPS = LP // U
    WORDS = LP * CPL * WPC                        # words per lane per load
    WORD_T = int32 if WIDE else int64
    if WIDE:                                      # 16-byte loads: four int32, two bf16 each
        word, unpack, MASKED = _word_bf16, unpack2_bf16_kv, 0
    elif dtype_name == "bfloat16":                # 8-byte words, four bf16 each
        word, unpack, MASKED = _word_bf16, unpack4_bf16_kv, 0
    else:                                         # element indices, loaded on use
        word, unpack, MASKED = _index_word, _make_unpack4_scalar(load), -1
    THREADS = NUM_WARPS * WARP_SIZE
    OUT_ELEMS = QPK * HEAD_DIM

    @cuda.jit(device=True)
    def table_entry(block_table, table_base, lb, lb_end):
        """Physical block of logical block lb (0 past the split's end: never read)."""
        phys = 0
        if lb < lb_end:
            phys = block_table[table_base + lb]
        return phys

    @cuda.jit(device=True)
    def load_block(kv, kw, vw, phys, lb, lb_end, seq_len, kv_head, group, sub, chunk):
        """This lane's K and V words of passes chunk*LP .. of logical block lb (masked
        tokens: zeros)."""
        base = phys * BLOCK_ELEMS + kv_head * HEAD_DIM
        for pp in range(LP):
            p = chunk * LP + pp
            t_in = p * TPW + group
            ok = lb < lb_end and t_in < BLOCK_SIZE and lb * BLOCK_SIZE + t_in < seq_len
            for c in range(CPL):
                e = base + t_in * KV_DIM + (sub * CPL + c) * CV
                w0 = (pp * CPL + c) * WPC
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

    @cuda.jit(fastmath=True)
    def paged_attention_fast_kernel(layer, q, q_row_stride, kv, block_table, seq_lens,
                                    active_slots, scale, part_acc, part_ml, tickets):
        b = cuda.blockIdx.x                       # row of q / seq_lens (compact index)
        kv_head = cuda.blockIdx.y
        split = cuda.blockIdx.z
        n_splits = cuda.gridDim.z
        n_q_heads = cuda.gridDim.y * QPK
        tid = cuda.threadIdx.x
        warp = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        group = lane // G                         # which token of a pass
        sub = lane % G                            # which dims of that token

        sm_m = cuda.shared.array((NUM_WARPS, QPK), float32)
        sm_l = cuda.shared.array((NUM_WARPS, QPK), float32)
        sm_acc = cuda.shared.array((NUM_WARPS, QPK, HEAD_DIM), float32)
        sm_last = cuda.shared.array(1, int32)

        seq_len = seq_lens[b]
        slot = active_slots[b]
        n_logical = (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE
        per_split = (n_logical + n_splits - 1) // n_splits
        lb_start = split * per_split
        lb_end = min(lb_start + per_split, n_logical)
        table_base = slot * N_LAYERS * MAX_BLOCKS_PER_SEQ + layer * MAX_BLOCKS_PER_SEQ

        # this lane's dims of the group's QPK query heads, pre-scaled
        qr = cuda.local.array((QPK, DPL), float32)
        acc = cuda.local.array((QPK, DPL), float32)
        m = cuda.local.array(QPK, float32)        # running max (the same in every lane)
        l = cuda.local.array(QPK, float32)        # this lane's share of the denominator
        s = cuda.local.array((U, QPK), float32)
        q_base = b * q_row_stride + kv_head * QPK * HEAD_DIM
        for h in range(QPK):
            m[h] = NEG_INF
            l[h] = float32(0.0)
            for c in range(CPL):
                d0 = (sub * CPL + c) * CV
                for j in range(CV):
                    qr[h, c * CV + j] = load(q, q_base + h * HEAD_DIM + d0 + j) * float32(scale)
                    acc[h, c * CV + j] = float32(0.0)

        # Each warp walks its logical blocks lb_start + warp, + NUM_WARPS, ...  Memory is the
        # bottleneck, so loads are issued as early as possible: the block-table entry one
        # iteration ahead, and a whole logical block's K and V words (16 tokens x 128 bytes
        # each, 16 + 16 words per lane) at once -- with PREFETCH, one iteration ahead too.
        n_iters = (lb_end - lb_start + NUM_WARPS - 1) // NUM_WARPS   # block-uniform
        kc = cuda.local.array(WORDS, WORD_T)      # raw K / V words of the current block
        vc = cuda.local.array(WORDS, WORD_T)
        kn = cuda.local.array(WORDS, WORD_T)      # ... and of the next one (PREFETCH)
        vn = cuda.local.array(WORDS, WORD_T)
        phys_next = table_entry(block_table, table_base, lb_start + warp, lb_end)
        if PREFETCH:
            load_block(kv, kn, vn, phys_next, lb_start + warp, lb_end, seq_len, kv_head,
                       group, sub, 0)
            phys_next = table_entry(block_table, table_base, lb_start + NUM_WARPS + warp,
                                    lb_end)
        for it in range(n_iters):
            lb = lb_start + it * NUM_WARPS + warp
            block_ok = lb < lb_end
            phys = phys_next
            if PREFETCH:                          # (then LP = PASSES: one chunk)
                for w in range(WORDS):
                    kc[w] = kn[w]
                    vc[w] = vn[w]
                phys_after = table_entry(block_table, table_base, lb + 2 * NUM_WARPS, lb_end)
                load_block(kv, kn, vn, phys_next, lb + NUM_WARPS, lb_end, seq_len, kv_head,
                           group, sub, 0)
                phys_next = phys_after
            else:
                phys_next = table_entry(block_table, table_base, lb + NUM_WARPS, lb_end)
            for chunk in range(CHUNKS):
                if not PREFETCH:
                    load_block(kv, kc, vc, phys, lb, lb_end, seq_len, kv_head, group, sub,
                               chunk)
                for step in range(STEPS):         # U passes share one softmax update
                    # --- scores of this lane's tokens (one per pass) ------------------
                    for u in range(U):
                        pl = step * U + u             # pass within the chunk
                        t_in = (chunk * LP + pl) * TPW + group
                        ok = block_ok and t_in < BLOCK_SIZE and \
                            lb * BLOCK_SIZE + t_in < seq_len
                        for h in range(QPK):
                            s[u, h] = float32(0.0)
                        for c in range(CPL):
                            for w in range(WPC):
                                kx = unpack(kv, kc[(pl * CPL + c) * WPC + w])
                                for x in range(EPW):
                                    d = c * CV + w * EPW + x
                                    for h in range(QPK):
                                        s[u, h] += qr[h, d] * kx[x]
                        off = G // 2
                        while off > 0:            # sum over the G lanes of the token
                            for h in range(QPK):
                                s[u, h] += cuda.shfl_xor_sync(FULL_MASK, s[u, h], off)
                            off //= 2
                        if not ok:
                            for h in range(QPK):
                                s[u, h] = NEG_INF
                    # --- online softmax over the step's tokens (warp-uniform max) --------
                    for h in range(QPK):
                        mx = s[0, h]
                        for u in range(1, U):
                            mx = max(mx, s[u, h])
                        off = G
                        while off < WARP_SIZE:    # max over the warp's tokens
                            mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, off))
                            off *= 2
                        m_new = max(m[h], mx)
                        corr = float32(1.0)
                        if m_new > NEG_INF:
                            corr = math.exp(m[h] - m_new)
                        m[h] = m_new
                        l[h] *= corr
                        for i in range(DPL):
                            acc[h, i] *= corr
                        for u in range(U):
                            e = float32(0.0)
                            if s[u, h] > NEG_INF:
                                e = math.exp(s[u, h] - m_new)
                            s[u, h] = e           # s now holds probabilities
                            l[h] += e
                    # --- accumulate p * V for this lane's tokens and dims ----------------
                    for u in range(U):
                        pl = step * U + u
                        for c in range(CPL):
                            for w in range(WPC):
                                vx = unpack(kv, vc[(pl * CPL + c) * WPC + w])
                                for x in range(EPW):
                                    d = c * CV + w * EPW + x
                                    for h in range(QPK):  # p = 0 where masked (V = 0)
                                        acc[h, d] += s[u, h] * vx[x]

        # --- the warp's tokens were spread over lane groups: sum the groups ---------------
        off = G
        while off < WARP_SIZE:
            for h in range(QPK):
                l[h] += cuda.shfl_xor_sync(FULL_MASK, l[h], off)
                for i in range(DPL):
                    acc[h, i] += cuda.shfl_xor_sync(FULL_MASK, acc[h, i], off)
            off *= 2
        if lane == 0:
            for h in range(QPK):
                sm_m[warp, h] = m[h]
                sm_l[warp, h] = l[h]
        if group == 0:
            for h in range(QPK):
                for c in range(CPL):
                    d0 = (sub * CPL + c) * CV
                    for j in range(CV):
                        sm_acc[warp, h, d0 + j] = acc[h, c * CV + j]
        cuda.syncthreads()

        # --- merge the warps: each thread finishes some (head, dim) outputs ---------------
        for idx in range(tid, OUT_ELEMS, THREADS):
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
            head = kv_head * QPK + h
            row = (b * n_q_heads + head) * n_splits + split
            if n_splits == 1:
                res = float32(0.0)
                if ll > float32(0.0):
                    res = oo / ll
                store(q, b * q_row_stride + head * HEAD_DIM + d, res)
            else:
                part_acc[row * HEAD_DIM + d] = oo
                if d == 0:
                    part_ml[row * 2] = mm
                    part_ml[row * 2 + 1] = ll
        if n_splits == 1:
            return

        # --- split-KV: the last split block of this (sequence, KV head) merges ------------
        threadfence()
        cuda.syncthreads()
        if tid == 0:
            ticket = cuda.atomic.add(tickets, b * cuda.gridDim.y + kv_head, 1)
            sm_last[0] = 1 if ticket == n_splits - 1 else 0
        cuda.syncthreads()
        if sm_last[0] == 0:
            return
        threadfence()
        for idx in range(tid, OUT_ELEMS, THREADS):
            h = idx // HEAD_DIM
            d = idx - h * HEAD_DIM
            head = kv_head * QPK + h
            row0 = (b * n_q_heads + head) * n_splits
            mm = NEG_INF
            for sp in range(n_splits):
                mm = max(mm, part_ml[(row0 + sp) * 2])
            ll = float32(0.0)
            oo = float32(0.0)
            if mm > NEG_INF:
                for sp in range(n_splits):
                    ms = part_ml[(row0 + sp) * 2]
                    if ms > NEG_INF:
                        f = math.exp(ms - mm)
                        ll += f * part_ml[(row0 + sp) * 2 + 1]
                        oo += f * part_acc[(row0 + sp) * HEAD_DIM + d]
            res = float32(0.0)
            if ll > float32(0.0):
                res = oo / ll
            store(q, b * q_row_stride + head * HEAD_DIM + d, res)
        if tid == 0:
            tickets[b * cuda.gridDim.y + kv_head] = 0

    return paged_attention_fast_kernel


# --- launch policy ------------------------------------------------------------------------

#: aim for this many thread blocks per launch before splitting sequences.  Measured on an H200
#: (132 SMs; attention-2026-11-30.json sweep): batch 64 x 8 KV heads is best unsplit, batch 8
#: with 4 splits, batch 1 with 32: about 256 blocks in each case.
TARGET_BLOCKS = 256
MAX_SPLITS = 32


def choose_splits(batch: int, n_kv_heads: int, max_blocks_per_seq: int, num_warps: int,
                  target_blocks: int = TARGET_BLOCKS, max_splits: int = MAX_SPLITS) -> int:
    """Splits per sequence: enough thread blocks to fill the GPU, each split keeping at least
    one logical block per warp of the longest possible sequence.  Depends only on the batch
    size and the cache shape (not on the current lengths), so a CUDA graph can fix it."""
    if SIMULATING:
        return 2 if max_blocks_per_seq > 1 else 1     # exercise the split path, cheaply
    want = -(-target_blocks // max(1, batch * n_kv_heads))
    cap = max(1, max_blocks_per_seq // num_warps)
    return max(1, min(want, cap, max_splits))


#: warps per thread block (the simulator runs one: every thread is a Python thread)
NUM_WARPS = 1 if SIMULATING else 8
#: ... and from this many (sequence, KV head) blocks on, 4 warps per block: measured on an
#: H200 (attention-2026-11-30.json and kernels-*.json "attention_short"): 8 warps win at
#: batch 1 (6.4 against 8.4 us at context 160), 4 warps from batch 8 x 8 KV heads on
#: (16.9 against 18.2 us at batch 8, context 1024; 14.9 against 20.2 at batch 64, context 160)
FEW_WARPS_FROM_BLOCKS = 64


def num_warps_for(batch: int, n_kv_heads: int) -> int:
    """Warps per block for a launch: depends only on the batch (a CUDA graph fixes it)."""
    if SIMULATING or batch * n_kv_heads < FEW_WARPS_FROM_BLOCKS:
        return NUM_WARPS
    return min(NUM_WARPS, 4)
#: the kernel's shape knobs (see make_fast_decode_kernel), chosen by ``benchmarks/attention.py
#: --sweep`` on an H200 (attention-2026-11-30.json: variant "wide-g8u2l2"): 16-byte loads,
#: 8 lanes per token, 2 passes (8 tokens) per load and per softmax update.
DEFAULT_VARIANT = dict(max_lanes=8, update_passes=2, load_passes=2, prefetch=False, wide=True)

_tickets: dict = {}


def _ticket_buffer(device, n: int):
    """A zeroed int32 buffer of at least n entries, kept for the process: CUDA graphs capture
    its address, and the merging blocks leave it zeroed again."""
    import torch

    key = str(device)
    buf = _tickets.get(key)
    if buf is None or buf.numel() < n:
        size = max(n, 1 << 16)
        buf = torch.zeros(size, dtype=torch.int32, device=device)
        _tickets.setdefault(key + "/old", []).append(_tickets.get(key))   # keep old ones alive
        _tickets[key] = buf
    return buf


def decode_attention_fast(q, cache, block_table, layer, seq_lens, active_slots, scale,
                          num_warps: int | None = None, n_splits: int | None = None,
                          **variant):
    """Launch the fast kernel: output written over q (as the article's kernel does).
    ``seq_lens`` / ``active_slots``: int32 on q's device; ``block_table`` as in base.py."""
    from paged_tutorial.backends.numba_cuda.runtime.launch import as_kernel_array, flat, launch, persistent_buffer, rows, words

    c = cache.config
    n_seqs, n_q_heads, head_dim = q.shape
    n_kv = c.num_kv_heads
    nw = num_warps_for(n_seqs, n_kv) if num_warps is None else num_warps
    options = {**DEFAULT_VARIANT, **variant}     # lanes, update/load passes, prefetch, wide
    kernel = make_fast_decode_kernel(c.dtype, head_dim, n_q_heads // n_kv, c.BLOCK_SIZE,
                                     c.num_layers, c.MAX_BLOCKS_PER_SEQ, c.KV_DIM,
                                     c.BLOCK_ELEMS, c.V_OFFSET_ELEMS, nw,
                                     options["max_lanes"], options["update_passes"],
                                     options["load_passes"], options["prefetch"],
                                     options["wide"])
    if n_seqs == 0:
        return q
    splits = n_splits or choose_splits(n_seqs, n_kv, c.MAX_BLOCKS_PER_SEQ, nw)
    n_part = n_seqs * n_q_heads * splits if splits > 1 else 1
    # scratch for the split partials: kept for the process (no allocation per call; every
    # launch on the stream finishes before the next one reuses it)
    part_acc = persistent_buffer(q.device, "attention.part_acc", n_part * head_dim)
    part_ml = persistent_buffer(q.device, "attention.part_ml", n_part * 2)
    tickets = _ticket_buffer(q.device, n_seqs * n_kv)
    qa, q_rs = rows(q, "q")
    launch(kernel, (n_seqs, n_kv, splits), nw * WARP_SIZE, int(layer), qa, q_rs,
           words(cache.buffer) if wide_loads(c.dtype, head_dim, options["wide"])
           else as_kernel_array(kv_view(cache.buffer, False)),
           flat(block_table), flat(seq_lens),
           flat(active_slots), float(scale), as_kernel_array(part_acc),
           as_kernel_array(part_ml), as_kernel_array(tickets))
    return q
