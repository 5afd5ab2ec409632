"""Decode attention over the paged cache on tensor cores: the function of ``attention_fast.py``
(same launch grid, split-KV scheme, merge and output), with the two products of each block of
16 tokens done by ``mma.sync.m16n8k16`` (``device/mma.py``) instead of per-lane FMAs.
``KernelOptions(attention="auto")``, the default, takes it from ``MIN_BATCH`` sequences on
(``NumbaBackend.decode_kernel_for``); ``attention="tensor_core"`` asks for it at every batch.

Why tensor cores at decode, where attention is memory-bound: with grouped-query attention the
``GQA_GROUP`` query heads of a KV head read the same K and V, so a warp holds a small matrix
product per block: ``S = Q K^T`` (GQA_GROUP x 16 tokens) and ``O += P V``.  The CUDA-core kernel
spends ``2 * GQA_GROUP * head_dim`` FMAs per token per lane group; one ``mma`` does 16 x 8 x 16
of them per warp.  The loads are the fast kernel's (every K/V byte read once, 16 bytes per
lane); what changes is the arithmetic and the shuffles between the loads.

One warp per logical block per iteration (``NUM_WARPS`` warps per thread block take turns, as in
``attention_fast``), in FlashAttention-2's register layout, with nothing through shared memory
until the warps meet at the end.  Lane ``l``: ``g = l >> 2``, ``t = l & 3`` (``mma.py``'s
fragment layouts).

1. **Q**, the A operand of ``S = Q K^T`` (M = 16 rows: the group's query heads, zero rows past
   ``GQA_GROUP``; K = head_dim in steps of 16): loaded once, kept as bf16 words.
2. **K**, the B operand (K x N = head dims x 8 tokens, twice per block): column ``n`` is the
   token lane group ``g`` loads, ``8 j + g`` in half ``j``.  The order of the head dims inside a
   dot product is free, so Q and K use the same *permuted* one: lane ``t`` loads 16 contiguous
   bytes, dims ``32 p + 8 t .. + 7`` of its token (``vector_io.load_u32x4``), and its four words
   are ``b0, b1`` of k-steps ``2p`` and ``2p + 1``; Q's fragments hold the same dims (a head dim
   that is an odd multiple of 16 ends with one 8-byte step, dims ``16 k + 4 t .. + 3``).
3. **Online softmax on the C fragments**: lane (g, t) holds rows g and g + 8, tokens
   ``8 j + 2 t``, ``+ 1``; a row's max and sum are over its 4 lanes (``shfl_xor`` 1 and 2).
   Scores are scaled by ``scale`` in float32, tokens past ``seq_len`` are -inf, and the
   running max / denominator / accumulator follow flash-attention's recurrence.
4. **O += P V**: the C fragments of the two n8 halves *are* the A fragment of an m16n8k16 with
   K = the block's 16 tokens (rounded to bf16).  V's B fragment pairs two *tokens* at one head
   dim, so it is a transpose of the cache layout: lane (g, t) loads tokens ``2t, 2t+1, 2t+8,
   2t+9`` over a contiguous run of ``head_dim / 8`` dims (16-byte loads when head_dim % 64 ==
   0) and pairs the halves of the words with shifts.  The output dims are permuted as well:
   mma ``c`` (of head_dim / 8) puts its column ``n`` at dim ``n * head_dim / 8 + c``, so each
   lane ends with one contiguous run of ``head_dim / 4`` dims of rows g and g + 8.
5. **End**: the row sums are summed over the 4 lanes, each warp leaves max, denominator and
   accumulator in shared memory, and the merge is ``attention_fast``'s: one split writes
   ``O / l`` over q, several write partials that the last split block to finish merges
   (``split_kv.py``: the same buffers and policy; warps per block from
   ``attention_fast.num_warps_for``), two dims per thread as one bf16 word.  The kernel
   writes the split ranges, ticket and merge out itself instead of calling ``split_kv``'s
   device functions as ``attention_fast`` does: with those calls it measured 7-12 % slower
   from batch 8 to 64 / 1024 on an H100 (the fast kernel: unchanged), in one run of both
   versions side by side (``docs/measured.md``).

Masked tokens (past ``seq_len``) load no K or V (zeros): the cache past a sequence's end may
hold anything, and ``0 * NaN`` would poison the product.

Limits (``unsupported_reason``): a bfloat16 cache, head_dim a multiple of 16, at most 16 query
heads per KV head, ``BLOCK_SIZE`` 16, compute capability 8.0 or newer (``mma.FIRST_CC``);
the backend takes ``attention_fast`` otherwise.  The simulator runs the same source
(``mma.py`` emulates the instruction through ``sim_shim.warp_collective``).
"""

from __future__ import annotations

import functools
import math

import torch
from numba import cuda, float32, int32

from paged_tutorial.backends.numba_cuda.device import mma
from paged_tutorial.backends.numba_cuda.device.grid_dependency import (allow_next_grid,
                                                                        wait_for_previous_grid)
from paged_tutorial.backends.numba_cuda.device.mma import mma_m16n8k16_bf16
from paged_tutorial.backends.numba_cuda.device.sim_shim import threadfence
from paged_tutorial.backends.numba_cuda.device.vector_io import load_u32x4, pack2
from paged_tutorial.backends.numba_cuda.kernels.attention_fast import num_warps_for
from paged_tutorial.backends.numba_cuda.kernels.split_kv import choose_splits, scratch
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel
from paged_tutorial.backends.numba_cuda.runtime.launch import (as_kernel_array, flat, launch,
                                                                overlapping,
                                                                rows, words)
from paged_tutorial.backends.warp import FULL_MASK, WARP_SIZE

NEG_INF = float32(-math.inf)
#: query heads per KV head one warp can hold (the M of m16n8k16)
MAX_GROUP = 16
#: tokens per logical block the kernel is written for (the K of the P V product)
BLOCK_TOKENS = 16
#: most bytes of the per-warp partials in shared memory (warps are cut to fit)
SHARED_BYTES = 32 * 1024
#: the smallest batch for which ``KernelOptions(attention="auto")`` takes this kernel: on an
#: H100 (``benchmarks/attention.py``, Llama-3.2-1B shapes, two runs in ``docs/measured.md``) it
#: was level with ``attention_fast`` to 12 % faster from 16 sequences on, level to 7 % slower at
#: 8, and 10-18 % slower at 1
MIN_BATCH = 16


@functools.lru_cache(maxsize=None)
def unsupported_reason(dtype_name: str, head_dim: int, gqa_group: int, block_size: int,
                       check_device: bool = True) -> str | None:
    """Why the tensor-core kernel cannot run this layout on this process's GPU (None: it
    can); ``check_device=False`` leaves the GPU out."""
    if dtype_name != "bfloat16":
        return (f"the cache is {dtype_name}, and the tensor-core kernel multiplies bf16 "
                "(mma.sync .bf16): load the model in bfloat16, or use attention='fast'")
    if head_dim % 16:
        return (f"head_dim {head_dim} is not a multiple of 16 (the K step of "
                "mma.m16n8k16): use attention='fast'")
    if gqa_group > MAX_GROUP:
        return (f"{gqa_group} query heads per KV head; one warp's mma holds at most "
                f"{MAX_GROUP}: use attention='fast'")
    if block_size != BLOCK_TOKENS:
        return (f"BLOCK_SIZE {block_size}; the kernel takes blocks of {BLOCK_TOKENS} tokens: "
                "use attention='fast'")
    if check_device and not mma.supported():
        return (f"this GPU is older than compute capability {mma.FIRST_CC[0]}."
                f"{mma.FIRST_CC[1]} (sm_80), which bf16 mma.sync needs: use attention='fast'")
    return None


def warps_for(batch: int, n_kv_heads: int, gqa_group: int, head_dim: int) -> int:
    """Warps per block: ``attention_fast``'s policy, cut so that the warps' partials fit in
    ``SHARED_BYTES`` of shared memory."""
    nw = num_warps_for(batch, n_kv_heads)
    return max(1, min(nw, SHARED_BYTES // (4 * gqa_group * head_dim)))


@functools.lru_cache(maxsize=None)
def make_tc_decode_kernel(HEAD_DIM: int, GQA_GROUP: int, N_LAYERS: int,
                          MAX_BLOCKS_PER_SEQ: int, KV_DIM: int, BLOCK_ELEMS: int,
                          V_OFFSET_ELEMS: int, NUM_WARPS: int = 4, PREFETCH: bool = True):
    """Compile (once per cache layout and warps) the tensor-core decode kernel for a bf16
    cache with 16-token blocks; see the module docstring.  ``PREFETCH``: each warp issues the
    loads of its next block before it computes the current one (twice the K/V registers)."""
    why = unsupported_reason("bfloat16", HEAD_DIM, GQA_GROUP, BLOCK_TOKENS, check_device=False)
    if why:
        raise ValueError(f"tensor-core decode attention: {why}")
    BS = BLOCK_TOKENS
    K_STEPS = HEAD_DIM // 16              # k-steps of S = Q K^T
    K_PAIRS = HEAD_DIM // 32              # pairs of k-steps loaded as one 16-byte load
    QW = 4 * K_STEPS                      # Q words per lane: steps x (a0, a1, a2, a3)
    KW = 2 * K_STEPS * 2                  # K words per lane per block: halves x steps x (b0, b1)
    N_MMA = HEAD_DIM // 8                 # mmas of O += P V: one per 8 output columns
    OW = 4 * N_MMA                        # accumulator registers per lane
    V_DIMS = HEAD_DIM // 8                # head dims of each V token a lane loads (contiguous)
    V_WORDS = V_DIMS // 2                 # ... as words
    V_WIDE = V_DIMS % 8 == 0              # ... 16-byte loads
    VW = 4 * V_WORDS                      # V words per lane per block: 4 tokens
    HALF_WORDS = HEAD_DIM // 2            # words of one q row
    OUT_PAIRS = GQA_GROUP * HALF_WORDS    # (head, dim pair)s of the output
    THREADS = NUM_WARPS * WARP_SIZE

    @cuda.jit(device=True)
    def k_dim(kk, r, t):
        """Head dim of the pair k-step ``kk`` register ``r`` (b0: 0, b1: 1) holds in lane
        group ``t`` (the permuted order of point 2)."""
        if kk < 2 * K_PAIRS:
            return 32 * (kk >> 1) + 8 * t + 4 * (kk & 1) + 2 * r
        return 16 * kk + 4 * t + 2 * r

    @cuda.jit(device=True)
    def table_entry(block_table, table_base, lb, lb_end):
        """Physical block of logical block lb (0 past the split's end: never read)."""
        phys = 0
        if lb < lb_end:
            phys = block_table[table_base + lb]
        return phys

    @cuda.jit(device=True)
    def load_kv(kv, kw, vw, phys, lb, lb_end, seq_len, kv_head, g, t):
        """This lane's K words (tokens 8 j + g, the permuted dims) and V words (tokens
        2t, 2t+1, 2t+8, 2t+9, dims g * V_DIMS ..) of logical block lb; zeros where masked."""
        block_ok = lb < lb_end
        base = phys * BLOCK_ELEMS + kv_head * HEAD_DIM        # element index of token 0
        for j in range(2):
            tok = 8 * j + g
            ok = block_ok and lb * BS + tok < seq_len
            row = (base + tok * KV_DIM) >> 1                   # word index of the K row
            for p in range(K_PAIRS):
                w0 = (j * K_STEPS + 2 * p) * 2
                if ok:
                    x0, x1, x2, x3 = load_u32x4(kv, row + 16 * p + 4 * t)
                else:
                    x0 = x1 = x2 = x3 = int32(0)
                kw[w0] = x0
                kw[w0 + 1] = x1
                kw[w0 + 2] = x2
                kw[w0 + 3] = x3
            for kk in range(2 * K_PAIRS, K_STEPS):             # the 8-byte tail step
                w0 = (j * K_STEPS + kk) * 2
                y0 = int32(0)
                y1 = int32(0)
                if ok:
                    y0 = kv[row + 8 * kk + 2 * t]
                    y1 = kv[row + 8 * kk + 2 * t + 1]
                kw[w0] = y0
                kw[w0 + 1] = y1
        for i in range(4):                                     # tokens 2t, 2t+1, 2t+8, 2t+9
            tok = 2 * t + (i & 1) + 8 * (i >> 1)
            ok = block_ok and lb * BS + tok < seq_len
            row = (base + V_OFFSET_ELEMS + tok * KV_DIM + g * V_DIMS) >> 1
            if V_WIDE:
                for c in range(V_WORDS // 4):
                    if ok:
                        x0, x1, x2, x3 = load_u32x4(kv, row + 4 * c)
                    else:
                        x0 = x1 = x2 = x3 = int32(0)
                    vw[i * V_WORDS + 4 * c] = x0
                    vw[i * V_WORDS + 4 * c + 1] = x1
                    vw[i * V_WORDS + 4 * c + 2] = x2
                    vw[i * V_WORDS + 4 * c + 3] = x3
            else:
                for c in range(V_WORDS):
                    y = int32(0)
                    if ok:
                        y = kv[row + c]
                    vw[i * V_WORDS + c] = y

    @cuda.jit(device=True)
    def pair_halves(x, y, hi):
        """A word of two bf16: the low (hi == 0) or high halves of words x (low) and y."""
        if hi == 0:
            return int32((x & 0xFFFF) | (y << 16))
        return int32(((x >> 16) & 0xFFFF) | ((y >> 16) << 16))

    @cuda.jit(device=True, fastmath=True)
    def block_step(qa, kw, vw, o, s, ml, lb, lb_end, seq_len, scale, t):
        """One logical block: S = Q K^T, the online softmax update, O += P V."""
        block_ok = lb < lb_end
        for j in range(2):                                     # S, tokens 8 j .. 8 j + 7
            d0 = float32(0.0)
            d1 = float32(0.0)
            d2 = float32(0.0)
            d3 = float32(0.0)
            for kk in range(K_STEPS):
                w = (j * K_STEPS + kk) * 2
                d0, d1, d2, d3 = mma_m16n8k16_bf16(qa[4 * kk], qa[4 * kk + 1], qa[4 * kk + 2],
                                                   qa[4 * kk + 3], kw[w], kw[w + 1],
                                                   d0, d1, d2, d3)
            tok = lb * BS + 8 * j + 2 * t
            ok0 = block_ok and tok < seq_len
            ok1 = block_ok and tok + 1 < seq_len
            s[4 * j] = d0 * scale if ok0 else NEG_INF
            s[4 * j + 1] = d1 * scale if ok1 else NEG_INF
            s[4 * j + 2] = d2 * scale if ok0 else NEG_INF
            s[4 * j + 3] = d3 * scale if ok1 else NEG_INF
        for r in range(2):                                     # rows g (r = 0) and g + 8
            mx = max(max(s[2 * r], s[2 * r + 1]), max(s[4 + 2 * r], s[5 + 2 * r]))
            mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 1))
            mx = max(mx, cuda.shfl_xor_sync(FULL_MASK, mx, 2))
            m_old = ml[2 * r]
            m_new = max(m_old, mx)
            corr = float32(1.0)
            if m_new > NEG_INF:
                corr = math.exp(m_old - m_new)
            ml[2 * r] = m_new
            total = ml[2 * r + 1] * corr
            for c in range(N_MMA):
                o[4 * c + 2 * r] *= corr
                o[4 * c + 2 * r + 1] *= corr
            for x in (0, 1, 4, 5):
                e = float32(0.0)
                if s[x + 2 * r] > NEG_INF:
                    e = math.exp(s[x + 2 * r] - m_new)
                s[x + 2 * r] = e
                total += e
            ml[2 * r + 1] = total
        a0 = pack2(s[0], s[1])                                 # P as A: row g, tokens 2t, +1
        a1 = pack2(s[2], s[3])                                 # row g + 8
        a2 = pack2(s[4], s[5])                                 # row g, tokens 2t + 8, + 9
        a3 = pack2(s[6], s[7])                                 # row g + 8
        for c in range(N_MMA):                                 # O columns n * V_DIMS + c
            hi = c & 1
            w = c >> 1
            b0 = pair_halves(vw[w], vw[V_WORDS + w], hi)
            b1 = pair_halves(vw[2 * V_WORDS + w], vw[3 * V_WORDS + w], hi)
            o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3] = mma_m16n8k16_bf16(
                a0, a1, a2, a3, b0, b1, o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3])

    @cuda.jit(device=True, fastmath=True)
    def warp_to_shared(o, ml, warp, g, t, sm_m, sm_l, sm_acc):
        """Sum the row denominators over the row's 4 lanes and leave the warp's max,
        denominator and accumulator (rows < GQA_GROUP) in shared memory."""
        for r in range(2):
            total = ml[2 * r + 1]
            total += cuda.shfl_xor_sync(FULL_MASK, total, 1)
            total += cuda.shfl_xor_sync(FULL_MASK, total, 2)
            h = g + 8 * r
            if h < GQA_GROUP:
                if t == 0:
                    sm_m[warp, h] = ml[2 * r]
                    sm_l[warp, h] = total
                for c in range(N_MMA):
                    sm_acc[warp, h, 2 * t * V_DIMS + c] = o[4 * c + 2 * r]
                    sm_acc[warp, h, (2 * t + 1) * V_DIMS + c] = o[4 * c + 2 * r + 1]

    @cuda.jit(device=True, fastmath=True)
    def merge_warps(sm_m, sm_l, sm_acc, q32, q_row_words, b, kv_head, split, n_splits,
                    n_q_heads, part_acc, part_ml):
        """Each thread finishes some (head, dim pair)s from the warps' partials: the output
        (one split; a bf16 word over q) or the split's partial (``part_acc``, ``part_ml``)."""
        for idx in range(cuda.threadIdx.x, OUT_PAIRS, THREADS):
            h = idx // HALF_WORDS
            d = 2 * (idx - h * HALF_WORDS)
            mm = sm_m[0, h]
            for w in range(1, NUM_WARPS):
                mm = max(mm, sm_m[w, h])
            ll = float32(0.0)
            o0 = float32(0.0)
            o1 = float32(0.0)
            if mm > NEG_INF:
                for w in range(NUM_WARPS):
                    f = math.exp(sm_m[w, h] - mm)
                    ll += f * sm_l[w, h]
                    o0 += f * sm_acc[w, h, d]
                    o1 += f * sm_acc[w, h, d + 1]
            head = kv_head * GQA_GROUP + h
            if n_splits == 1:
                r0 = float32(0.0)
                r1 = float32(0.0)
                if ll > float32(0.0):
                    r0 = o0 / ll
                    r1 = o1 / ll
                q32[b * q_row_words + head * HALF_WORDS + (d >> 1)] = pack2(r0, r1)
            else:
                row = (b * n_q_heads + head) * n_splits + split
                part_acc[row * HEAD_DIM + d] = o0
                part_acc[row * HEAD_DIM + d + 1] = o1
                if d == 0:
                    part_ml[row * 2] = mm
                    part_ml[row * 2 + 1] = ll

    @cuda.jit(device=True, fastmath=True)
    def merge_splits(q32, q_row_words, b, kv_head, n_splits, n_q_heads, part_acc, part_ml):
        """The last split block of (sequence, KV head): every split's partial into q."""
        for idx in range(cuda.threadIdx.x, OUT_PAIRS, THREADS):
            h = idx // HALF_WORDS
            d = 2 * (idx - h * HALF_WORDS)
            head = kv_head * GQA_GROUP + h
            row0 = (b * n_q_heads + head) * n_splits
            mm = NEG_INF
            for sp in range(n_splits):
                mm = max(mm, part_ml[(row0 + sp) * 2])
            ll = float32(0.0)
            o0 = float32(0.0)
            o1 = float32(0.0)
            if mm > NEG_INF:
                for sp in range(n_splits):
                    ms = part_ml[(row0 + sp) * 2]
                    if ms > NEG_INF:
                        f = math.exp(ms - mm)
                        ll += f * part_ml[(row0 + sp) * 2 + 1]
                        o0 += f * part_acc[(row0 + sp) * HEAD_DIM + d]
                        o1 += f * part_acc[(row0 + sp) * HEAD_DIM + d + 1]
            r0 = float32(0.0)
            r1 = float32(0.0)
            if ll > float32(0.0):
                r0 = o0 / ll
                r1 = o1 / ll
            q32[b * q_row_words + head * HALF_WORDS + (d >> 1)] = pack2(r0, r1)

    @cached_kernel(fastmath=True)
    @overlapping
    def paged_attention_tc_kernel(layer, q32, q_row_words, kv, block_table, seq_lens,
                                  active_slots, scale, part_acc, part_ml, tickets):
        b = cuda.blockIdx.x                       # row of q / seq_lens (compact index)
        kv_head = cuda.blockIdx.y
        split = cuda.blockIdx.z
        n_splits = cuda.gridDim.z
        n_q_heads = cuda.gridDim.y * GQA_GROUP
        tid = cuda.threadIdx.x
        warp = tid // WARP_SIZE
        lane = tid % WARP_SIZE
        g = lane >> 2                             # the mma fragments' groupID
        t = lane & 3                              # ... and threadID_in_group

        sm_m = cuda.shared.array((NUM_WARPS, GQA_GROUP), float32)
        sm_l = cuda.shared.array((NUM_WARPS, GQA_GROUP), float32)
        sm_acc = cuda.shared.array((NUM_WARPS, GQA_GROUP, HEAD_DIM), float32)
        sm_last = cuda.shared.array(1, int32)

        seq_len = seq_lens[b]
        slot = active_slots[b]
        n_logical = (seq_len + BS - 1) // BS
        per_split = (n_logical + n_splits - 1) // n_splits
        lb_start = split * per_split
        lb_end = min(lb_start + per_split, n_logical)
        table_base = slot * N_LAYERS * MAX_BLOCKS_PER_SEQ + layer * MAX_BLOCKS_PER_SEQ
        # step inputs (lengths, slots, block table) are read before the wait; q and the cache
        # (this token's K/V is written by the previous kernel) after it
        phys = table_entry(block_table, table_base, lb_start + warp, lb_end)
        wait_for_previous_grid()
        allow_next_grid()

        # Q as the A fragments of every k-step (rows past the group: zeros)
        qa = cuda.local.array(QW, int32)
        q_base = b * q_row_words + kv_head * GQA_GROUP * HALF_WORDS
        for kk in range(K_STEPS):
            for r in range(2):
                dw = k_dim(kk, r, t) >> 1
                lo = int32(0)
                hi = int32(0)
                if g < GQA_GROUP:
                    lo = q32[q_base + g * HALF_WORDS + dw]
                if g + 8 < GQA_GROUP:
                    hi = q32[q_base + (g + 8) * HALF_WORDS + dw]
                qa[4 * kk + 2 * r] = lo          # a0 / a2: row g
                qa[4 * kk + 2 * r + 1] = hi      # a1 / a3: row g + 8

        o = cuda.local.array(OW, float32)
        for i in range(OW):
            o[i] = float32(0.0)
        ml = cuda.local.array(4, float32)         # (max, this lane's sum) of rows g, g + 8
        ml[0] = NEG_INF
        ml[1] = float32(0.0)
        ml[2] = NEG_INF
        ml[3] = float32(0.0)
        s = cuda.local.array(8, float32)
        kw = cuda.local.array(KW, int32)
        vw = cuda.local.array(VW, int32)

        n_iters = (lb_end - lb_start + NUM_WARPS - 1) // NUM_WARPS   # block-uniform
        lb = lb_start + warp
        if PREFETCH:
            kn = cuda.local.array(KW, int32)      # the next block's words, loaded in advance
            vn = cuda.local.array(VW, int32)
            load_kv(kv, kn, vn, phys, lb, lb_end, seq_len, kv_head, g, t)
            phys = table_entry(block_table, table_base, lb + NUM_WARPS, lb_end)
            for it in range(n_iters):
                lb = lb_start + it * NUM_WARPS + warp
                for i in range(KW):
                    kw[i] = kn[i]
                for i in range(VW):
                    vw[i] = vn[i]
                if it + 1 < n_iters:
                    load_kv(kv, kn, vn, phys, lb + NUM_WARPS, lb_end, seq_len, kv_head, g, t)
                    phys = table_entry(block_table, table_base, lb + 2 * NUM_WARPS, lb_end)
                block_step(qa, kw, vw, o, s, ml, lb, lb_end, seq_len, scale, t)
        else:
            for it in range(n_iters):
                lb = lb_start + it * NUM_WARPS + warp
                load_kv(kv, kw, vw, phys, lb, lb_end, seq_len, kv_head, g, t)
                phys = table_entry(block_table, table_base, lb + NUM_WARPS, lb_end)
                block_step(qa, kw, vw, o, s, ml, lb, lb_end, seq_len, scale, t)

        warp_to_shared(o, ml, warp, g, t, sm_m, sm_l, sm_acc)
        cuda.syncthreads()
        merge_warps(sm_m, sm_l, sm_acc, q32, q_row_words, b, kv_head, split, n_splits,
                    n_q_heads, part_acc, part_ml)
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
        merge_splits(q32, q_row_words, b, kv_head, n_splits, n_q_heads, part_acc, part_ml)
        if tid == 0:
            tickets[b * cuda.gridDim.y + kv_head] = 0

    return paged_attention_tc_kernel


def decode_attention_tc(q, cache, block_table, layer, seq_lens, active_slots, scale,
                        num_warps: int | None = None, n_splits: int | None = None,
                        prefetch: bool = False, overlap: bool = True):
    """Launch the tensor-core kernel: output written over q (as ``decode_attention_fast``).
    ``num_warps`` / ``n_splits`` override the launch policy (``warps_for``,
    ``split_kv.choose_splits``), ``prefetch`` the kernel's load order (each warp loads
    its next block before computing this one: more registers, and on an H100 slower from
    batch 8 on, level at batch 1), for the benchmarks; raises ValueError when the layout is not
    supported (``unsupported_reason``)."""
    c = cache.config
    n_seqs, n_q_heads, head_dim = q.shape
    n_kv = c.num_kv_heads
    group = n_q_heads // n_kv
    why = unsupported_reason(c.dtype, head_dim, group, c.BLOCK_SIZE)
    if why:
        raise ValueError(f"tensor-core decode attention: {why}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"tensor-core decode attention: q is {q.dtype}, the cache bfloat16")
    nw = warps_for(n_seqs, n_kv, group, head_dim) if num_warps is None else num_warps
    kernel = make_tc_decode_kernel(head_dim, group, c.num_layers, c.MAX_BLOCKS_PER_SEQ,
                                   c.KV_DIM, c.BLOCK_ELEMS, c.V_OFFSET_ELEMS, nw, prefetch)
    if n_seqs == 0:
        return q
    splits = n_splits or choose_splits(n_seqs, n_kv, c.MAX_BLOCKS_PER_SEQ, nw)
    # the fast kernel's scratch: launches on one stream take turns
    part_acc, part_ml, tickets = scratch(q.device, n_seqs, n_q_heads, n_kv, splits, head_dim)
    qa, q_rw = rows(q, "q", words=True)
    launch(kernel, (n_seqs, n_kv, splits), nw * WARP_SIZE, int(layer), qa, q_rw,
           words(cache.buffer), flat(block_table), flat(seq_lens), flat(active_slots),
           float(scale), as_kernel_array(part_acc), as_kernel_array(part_ml),
           as_kernel_array(tickets), overlap=overlap)
    return q

