"""Paged decode attention in Triton: a peer of the Numba kernels, for comparison.

The same algorithm as ``numba_cuda/kernels/attention_fast.py`` (one program per (sequence, KV head,
split), the group's query heads sharing every K/V read, an online softmax, split-KV with a
merge), written with Triton's block operations: a tile of ``BLOCKS_PER_TILE`` logical blocks
is gathered through the block table, and both products run on tensor cores (``tl.dot``; the
group's 4 query heads are padded to 16 rows, the smallest ``tl.dot`` shape).  A second small
kernel merges the splits.

Optional: Triton is imported lazily and may be missing (CPU machines); ``available()`` says
whether it can run here.  ``TRITON_INTERPRET=1`` runs it on the CPU (slowly), which is how it
was checked without a GPU.
"""

from __future__ import annotations

import torch

try:                                     # optional dependency
    import triton
    import triton.language as tl
except ImportError:                      # pragma: no cover - CPU machines without triton
    triton = None
    tl = None

#: aim for this many programs per launch before splitting sequences (H200: 132 SMs)
TARGET_PROGRAMS = 2 * 132
MAX_SPLITS = 32
BLOCKS_PER_TILE = 4


def available() -> bool:
    return triton is not None and (torch.cuda.is_available() or _interpreting())


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


if triton is not None:
    @triton.jit
    def _paged_decode_kernel(q_ptr, q_row_stride, cache_ptr, table_ptr, seq_lens_ptr, slots_ptr,
                             part_acc_ptr, part_ml_ptr, layer, scale, n_splits,
                             SINGLE: tl.constexpr, UPCAST: tl.constexpr, QPK: tl.constexpr, QPAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                             BLOCK_SIZE: tl.constexpr, TILE_BLOCKS: tl.constexpr,
                             N_LAYERS: tl.constexpr, MAX_BLOCKS_PER_SEQ: tl.constexpr,
                             KV_DIM: tl.constexpr, BLOCK_ELEMS: tl.constexpr,
                             V_OFFSET_ELEMS: tl.constexpr):
        b = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        n_q_heads = tl.num_programs(1) * QPK
        seq_len = tl.load(seq_lens_ptr + b)
        slot = tl.load(slots_ptr + b)
        n_logical = tl.cdiv(seq_len, BLOCK_SIZE)
        per_split = tl.cdiv(n_logical, n_splits)
        tok_start = split * per_split * BLOCK_SIZE
        tok_end = tl.minimum(tok_start + per_split * BLOCK_SIZE, seq_len)

        rows = tl.arange(0, QPAD)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows < QPK
        q = tl.load(q_ptr + b * q_row_stride + (kv_head * QPK + rows)[:, None] * HEAD_DIM
                    + dims[None, :], mask=row_ok[:, None], other=0.0)
        if UPCAST:                        # the CPU interpreter's bf16 tl.dot is wrong
            q = q.to(tl.float32)
        m = tl.full([QPAD], float("-inf"), tl.float32)
        l = tl.zeros([QPAD], tl.float32)
        acc = tl.zeros([QPAD, HEAD_DIM], tl.float32)
        TOK: tl.constexpr = BLOCK_SIZE * TILE_BLOCKS
        t = tl.arange(0, TOK)
        table_base = (slot * N_LAYERS + layer) * MAX_BLOCKS_PER_SEQ
        for tok0 in range(tok_start, tok_end, TOK):
            tok = tok0 + t
            ok = tok < tok_end
            phys = tl.load(table_ptr + table_base + tok // BLOCK_SIZE, mask=ok, other=0)
            off = phys.to(tl.int64) * BLOCK_ELEMS + (tok % BLOCK_SIZE) * KV_DIM \
                + kv_head * HEAD_DIM
            k = tl.load(cache_ptr + off[:, None] + dims[None, :], mask=ok[:, None], other=0.0)
            v = tl.load(cache_ptr + V_OFFSET_ELEMS + off[:, None] + dims[None, :],
                        mask=ok[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k)) * scale                   # [QPAD, TOK], float32
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        head = kv_head * QPK + rows
        if SINGLE:                        # one split: normalise and write over q
            o = acc / tl.where(l > 0, l, 1.0)[:, None]
            tl.store(q_ptr + b * q_row_stride + head[:, None] * HEAD_DIM + dims[None, :],
                     o.to(q_ptr.dtype.element_ty), mask=row_ok[:, None])
            return
        prow = (b * n_q_heads + head) * n_splits + split
        tl.store(part_acc_ptr + prow[:, None] * HEAD_DIM + dims[None, :], acc,
                 mask=row_ok[:, None])
        tl.store(part_ml_ptr + prow * 2, m, mask=row_ok)
        tl.store(part_ml_ptr + prow * 2 + 1, l, mask=row_ok)

    @triton.jit
    def _merge_kernel(part_acc_ptr, part_ml_ptr, out_ptr, out_row_stride, n_splits,
                      SPAD: tl.constexpr, HEAD_DIM: tl.constexpr):
        b = tl.program_id(0)
        head = tl.program_id(1)
        n_q_heads = tl.num_programs(1)
        sp = tl.arange(0, SPAD)
        dims = tl.arange(0, HEAD_DIM)
        sp_ok = sp < n_splits
        prow = (b * n_q_heads + head) * n_splits + sp
        ms = tl.load(part_ml_ptr + prow * 2, mask=sp_ok, other=float("-inf"))
        ls = tl.load(part_ml_ptr + prow * 2 + 1, mask=sp_ok, other=0.0)
        mm = tl.max(ms, 0)
        f = tl.where(ms > float("-inf"), tl.exp(ms - mm), 0.0)
        acc = tl.load(part_acc_ptr + prow[:, None] * HEAD_DIM + dims[None, :],
                      mask=sp_ok[:, None], other=0.0)
        ll = tl.sum(f * ls, 0)
        o = tl.sum(acc * f[:, None], 0) / tl.where(ll > 0, ll, 1.0)
        tl.store(out_ptr + b * out_row_stride + head * HEAD_DIM + dims,
                 o.to(out_ptr.dtype.element_ty))


def choose_splits(batch: int, n_kv_heads: int, max_blocks_per_seq: int) -> int:
    want = -(-TARGET_PROGRAMS // max(1, batch * n_kv_heads))
    cap = max(1, max_blocks_per_seq // BLOCKS_PER_TILE)
    return max(1, min(want, cap, MAX_SPLITS))


def decode_attention_triton(q, cache, block_table, layer, seq_lens, active_slots, scale,
                            n_splits: int | None = None, num_warps: int = 4,
                            num_stages: int = 2):
    """Same contract as ``Backend.decode_attention``: output written over q, returns q."""
    if triton is None:
        raise RuntimeError("the Triton decode kernel needs the `triton` package (pip install "
                           "triton; it ships with CUDA builds of torch)")
    c = cache.config
    n_seqs, n_q_heads, head_dim = q.shape
    if n_seqs == 0:
        return q
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"the Triton decode kernel needs a power-of-two head_dim >= 16, "
                         f"got {head_dim}")
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        raise ValueError("q rows must be contiguous [heads, head_dim]")
    n_kv = c.num_kv_heads
    qpk = n_q_heads // n_kv
    splits = n_splits or choose_splits(n_seqs, n_kv, c.MAX_BLOCKS_PER_SEQ)
    n_part = n_seqs * n_q_heads * splits if splits > 1 else 1
    part_acc = torch.empty(n_part * head_dim, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(n_part * 2, dtype=torch.float32, device=q.device)
    _paged_decode_kernel[(n_seqs, n_kv, splits)](
        q, q.stride(0), cache.buffer, block_table, seq_lens, active_slots, part_acc, part_ml,
        int(layer), float(scale), splits, SINGLE=splits == 1, UPCAST=_interpreting(),
        QPK=qpk, QPAD=max(16, _next_pow2(qpk)), HEAD_DIM=head_dim, BLOCK_SIZE=c.BLOCK_SIZE,
        TILE_BLOCKS=BLOCKS_PER_TILE, N_LAYERS=c.num_layers,
        MAX_BLOCKS_PER_SEQ=c.MAX_BLOCKS_PER_SEQ, KV_DIM=c.KV_DIM, BLOCK_ELEMS=c.BLOCK_ELEMS,
        V_OFFSET_ELEMS=c.V_OFFSET_ELEMS, num_warps=num_warps, num_stages=num_stages)
    if splits == 1:
        return q
    _merge_kernel[(n_seqs, n_q_heads)](part_acc, part_ml, q, q.stride(0), splits,
                                       SPAD=_next_pow2(splits), HEAD_DIM=head_dim,
                                       num_warps=1)
    return q
