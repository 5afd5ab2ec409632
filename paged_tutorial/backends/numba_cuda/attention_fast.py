"""Decode attention over the paged cache, optimised: the same function as the article's
``paged_attention_kernel`` (``attention.py``, kept as the readable reference), organised the
way memory-bound GPU code has to be.

What the article's kernel does per cached token: one block per (sequence, *query* head) reads
K and V with 2-byte loads, sums 64 products through a shuffle tree, and spends two block
barriers.  With GQA four query heads read the same K/V, so the cache is read four times, and
the barriers leave the memory system idle most of the time (2.9 % of bandwidth measured).

This kernel
1. **shares each K/V read among the query heads of a KV group**: one thread block per
   (sequence, KV head, split); the ``QPK`` query heads of the group live in registers, so every
   K/V element is read once per step instead of ``QPK`` times.
2. **uses wide loads**: bf16 K/V rows are read as 8-byte words (``int64``, four bf16 each,
   unpacked with shifts), 8 lanes cover a 64-dim row with two fully coalesced 64-byte loads.
3. **gives each warp whole blocks of tokens, with its own online softmax and no barrier**: a
   warp takes one logical block (``BLOCK_SIZE`` tokens) per iteration; ``G`` lanes share a
   token (``32 // G`` tokens per pass), sum their partial dot products with ``log2(G)``
   butterfly shuffles, then the warp updates its running max / denominator / accumulator
   (flash-attention's recurrence) for all its tokens at once.  Warps meet once, at the end,
   in shared memory.
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

Limits: ``head_dim % 4 == 0`` (the backend falls back to the article's kernel otherwise).
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32

from .dtypes import DTYPE_OPS
from .sim_shim import SIMULATING, libdevice

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
VEC = 4                      # head dims per load (an 8-byte word of bf16)
NEG_INF = float32(-math.inf)


def supports(head_dim: int) -> bool:
    return head_dim % VEC == 0 and head_dim <= 1024


def lanes_per_token(head_dim: int, max_lanes: int = 8) -> int:
    """G: lanes that share one token's row (a power of two dividing head_dim / 4, at most
    ``max_lanes``)."""
    chunks = head_dim // VEC
    g = 1
    while g * 2 <= max_lanes and chunks % (g * 2) == 0:
        g *= 2
    return g


if SIMULATING:
    def _fence():
        """The simulator runs blocks one after another: nothing to order."""
else:                                            # pragma: no cover - GPU only
    @cuda.jit(device=True)
    def _fence():
        cuda.threadfence()


# --- loading four consecutive elements ---------------------------------------------------

@cuda.jit(device=True)
def _bf16_hi(bits32):
    """bf16 stored in the *upper* half of a 32-bit pattern -> float32 (bits below ignored)."""
    return libdevice.int_as_float(int32(bits32 & 0xFFFF0000))


@cuda.jit(device=True)
def load4_bf16(kv64, e):
    """Elements e..e+3 (e % 4 == 0) of a bf16 buffer seen as int64 words."""
    w = kv64[e >> 2]
    return (_bf16_hi(w << 16), _bf16_hi(w), _bf16_hi(w >> 16), _bf16_hi(w >> 32))


def _make_load4_scalar(load):
    @cuda.jit(device=True)
    def load4(a, e):
        return (load(a, e), load(a, e + 1), load(a, e + 2), load(a, e + 3))
    return load4


def kv_view(buffer):
    """The cache buffer as the kernel reads it: bf16 as int64 words, others as they are."""
    import torch

    if buffer.dtype == torch.bfloat16:
        return buffer.view(torch.int64)
    return buffer


@functools.lru_cache(maxsize=None)
def make_fast_decode_kernel(dtype_name: str, HEAD_DIM: int, QPK: int, BLOCK_SIZE: int,
                            N_LAYERS: int, MAX_BLOCKS_PER_SEQ: int, KV_DIM: int,
                            BLOCK_ELEMS: int, V_OFFSET_ELEMS: int, NUM_WARPS: int = 4,
                            MAX_LANES: int = 8):
    """Compile (once per shape) the fast decode kernel; see the module docstring."""
    if not supports(HEAD_DIM):
        raise ValueError(f"fast decode attention needs head_dim % {VEC} == 0, got {HEAD_DIM}")
    ops = DTYPE_OPS[dtype_name]
    load, store = ops.load, ops.store
    load4 = load4_bf16 if dtype_name == "bfloat16" else _make_load4_scalar(load)
    G = lanes_per_token(HEAD_DIM, MAX_LANES)      # lanes per token
    TPW = WARP_SIZE // G                          # tokens per warp pass
    CPL = HEAD_DIM // VEC // G                    # 4-element chunks per lane
    DPL = CPL * VEC                               # dims per lane
    PASSES = -(-BLOCK_SIZE // TPW)                # passes per logical block
    THREADS = NUM_WARPS * WARP_SIZE
    OUT_ELEMS = QPK * HEAD_DIM

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
        s = cuda.local.array((PASSES, QPK), float32)
        q_base = b * q_row_stride + kv_head * QPK * HEAD_DIM
        for h in range(QPK):
            m[h] = NEG_INF
            l[h] = float32(0.0)
            for c in range(CPL):
                d0 = (c * G + sub) * VEC
                for j in range(VEC):
                    qr[h, c * VEC + j] = load(q, q_base + h * HEAD_DIM + d0 + j) * float32(scale)
                    acc[h, c * VEC + j] = float32(0.0)

        n_iters = (lb_end - lb_start + NUM_WARPS - 1) // NUM_WARPS   # block-uniform
        for it in range(n_iters):
            lb = lb_start + it * NUM_WARPS + warp
            block_ok = lb < lb_end
            phys = 0
            if block_ok:
                phys = block_table[table_base + lb]
            head_base = phys * BLOCK_ELEMS + kv_head * HEAD_DIM
            # --- scores of this lane's tokens (one per pass) ---------------------------
            for p in range(PASSES):
                t_in = p * TPW + group
                ok = block_ok and t_in < BLOCK_SIZE and lb * BLOCK_SIZE + t_in < seq_len
                for h in range(QPK):
                    s[p, h] = float32(0.0)
                if ok:
                    k_base = head_base + t_in * KV_DIM
                    for c in range(CPL):
                        k0, k1, k2, k3 = load4(kv, k_base + (c * G + sub) * VEC)
                        for h in range(QPK):
                            s[p, h] += (qr[h, c * VEC] * k0 + qr[h, c * VEC + 1] * k1
                                        + qr[h, c * VEC + 2] * k2 + qr[h, c * VEC + 3] * k3)
                off = G // 2
                while off > 0:                    # sum over the G lanes of the token
                    for h in range(QPK):
                        s[p, h] += cuda.shfl_xor_sync(FULL_MASK, s[p, h], off)
                    off //= 2
                if not ok:
                    for h in range(QPK):
                        s[p, h] = NEG_INF
            # --- online softmax over the block (warp-uniform max) --------------------------
            for h in range(QPK):
                mx = s[0, h]
                for p in range(1, PASSES):
                    mx = max(mx, s[p, h])
                off = G
                while off < WARP_SIZE:            # max over the warp's tokens
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
                for p in range(PASSES):
                    e = float32(0.0)
                    if s[p, h] > NEG_INF:
                        e = math.exp(s[p, h] - m_new)
                    s[p, h] = e                   # s now holds probabilities
                    l[h] += e
            # --- accumulate p * V for this lane's tokens and dims --------------------------
            for p in range(PASSES):
                t_in = p * TPW + group
                ok = block_ok and t_in < BLOCK_SIZE and lb * BLOCK_SIZE + t_in < seq_len
                if ok:
                    v_base = head_base + t_in * KV_DIM + V_OFFSET_ELEMS
                    for c in range(CPL):
                        v0, v1, v2, v3 = load4(kv, v_base + (c * G + sub) * VEC)
                        for h in range(QPK):
                            acc[h, c * VEC] += s[p, h] * v0
                            acc[h, c * VEC + 1] += s[p, h] * v1
                            acc[h, c * VEC + 2] += s[p, h] * v2
                            acc[h, c * VEC + 3] += s[p, h] * v3

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
                    d0 = (c * G + sub) * VEC
                    for j in range(VEC):
                        sm_acc[warp, h, d0 + j] = acc[h, c * VEC + j]
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
        _fence()
        cuda.syncthreads()
        if tid == 0:
            ticket = cuda.atomic.add(tickets, b * cuda.gridDim.y + kv_head, 1)
            sm_last[0] = 1 if ticket == n_splits - 1 else 0
        cuda.syncthreads()
        if sm_last[0] == 0:
            return
        _fence()
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

#: aim for this many thread blocks per launch before splitting sequences (H200: 132 SMs)
TARGET_BLOCKS = 4 * 132
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
NUM_WARPS = 1 if SIMULATING else 4

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
                          max_lanes: int = 8):
    """Launch the fast kernel: output written over q (as the article's kernel does).
    ``seq_lens`` / ``active_slots``: int32 on q's device; ``block_table`` as in base.py."""
    import torch

    from .launch import as_kernel_array, flat, launch, rows

    c = cache.config
    n_seqs, n_q_heads, head_dim = q.shape
    n_kv = c.num_kv_heads
    nw = NUM_WARPS if num_warps is None else num_warps
    kernel = make_fast_decode_kernel(c.dtype, head_dim, n_q_heads // n_kv, c.BLOCK_SIZE,
                                     c.num_layers, c.MAX_BLOCKS_PER_SEQ, c.KV_DIM,
                                     c.BLOCK_ELEMS, c.V_OFFSET_ELEMS, nw, max_lanes)
    if n_seqs == 0:
        return q
    splits = n_splits or choose_splits(n_seqs, n_kv, c.MAX_BLOCKS_PER_SEQ, nw)
    n_part = n_seqs * n_q_heads * splits if splits > 1 else 1
    part_acc = torch.empty(n_part * head_dim, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(n_part * 2, dtype=torch.float32, device=q.device)
    tickets = _ticket_buffer(q.device, n_seqs * n_kv)
    qa, q_rs = rows(q, "q")
    launch(kernel, (n_seqs, n_kv, splits), nw * WARP_SIZE, int(layer), qa, q_rs,
           as_kernel_array(kv_view(cache.buffer)), flat(block_table), flat(seq_lens),
           flat(active_slots), float(scale), as_kernel_array(part_acc),
           as_kernel_array(part_ml), as_kernel_array(tickets))
    return q
