"""The paged cache read with torch ops, and dense attention over what was read.

The torch oracle (``torch_ref.py``) is built from these, and ``Backend``'s default
``prefill_attention_from_cache`` (``base.py``) uses them, so every backend has that op.  All
reads are device index ops through the block table: the table never leaves the device.
"""

from __future__ import annotations

import torch


def cache_view(cache) -> torch.Tensor:
    """The flat buffer seen as [NUM_BLOCKS, 2 (K, V), BLOCK_SIZE, KV_DIM]."""
    c = cache.config
    return cache.buffer.view(c.NUM_BLOCKS, 2, c.BLOCK_SIZE, c.KV_DIM)


def _read_blocks(cache, phys: torch.Tensor, n_tokens: int):
    """K, V of the blocks ``phys`` [S, nb] (physical ids), each row's blocks in logical order:
    two [S, n_tokens, nKV, D] tensors."""
    c = cache.config
    kv = cache_view(cache)[phys]                          # [S, nb, 2, BLOCK_SIZE, KV_DIM]
    shape = (phys.shape[0], phys.shape[1] * c.BLOCK_SIZE, c.num_kv_heads, c.head_dim)
    return kv[:, :, 0].reshape(shape)[:, :n_tokens], kv[:, :, 1].reshape(shape)[:, :n_tokens]


def gather_kv_rows(cache, block_table: torch.Tensor, seq_slots: torch.Tensor, layer: int,
                   n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V of positions 0 .. n_tokens-1 of each (seq_slots[s], layer), read through the block
    table: two [S, n_tokens, nKV, D] tensors.  Positions past a sequence's own length hold
    whatever their block holds (an unassigned entry, -1, reads block 0): mask them."""
    n_blocks = cache.config.blocks_for_tokens(n_tokens)
    phys = block_table[seq_slots.long(), layer, :n_blocks].long().clamp(min=0)   # [S, nb]
    return _read_blocks(cache, phys, n_tokens)


def gather_kv(cache, block_table: torch.Tensor, slot: int, layer: int, seq_len: int):
    """K, V of the first ``seq_len`` tokens of (slot, layer) as contiguous [seq_len, nKV, D]
    tensors on the cache's device."""
    n_blocks = cache.config.blocks_for_tokens(seq_len)
    k, v = _read_blocks(cache, block_table[slot, layer, :n_blocks].long()[None], seq_len)
    return k[0], v[0]


def attention(q, k, v, scale, causal):
    """q [Tq, nH, D], k/v [Tk, nKV, D] -> [Tq, nH, D]; softmax in float32 like HF.  Causal:
    query i is the (Tk - Tq + i)-th key's token, so it sees keys 0 .. Tk - Tq + i (the queries
    are the last Tq of the Tk tokens)."""
    group = q.shape[1] // k.shape[1]
    qh = q.transpose(0, 1)                                  # [nH, Tq, D]
    kh = k.transpose(0, 1).repeat_interleave(group, dim=0)  # [nH, Tk, D]
    vh = v.transpose(0, 1).repeat_interleave(group, dim=0)
    scores = torch.matmul(qh, kh.transpose(1, 2)) * scale
    if causal:
        tq, tk = scores.shape[-2:]
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, vh).transpose(0, 1)


def decode_attention_rows(q, k, v, seq_lens, scale):
    """One query token per sequence: q [B, nH, D] against k/v [B, L, nKV, D], of which row b
    sees its first seq_lens[b] keys.  The query heads of a KV group are stacked so each K/V
    head is used once.  Returns [B, nH, D]."""
    b, n_heads, d = q.shape
    n_kv = k.shape[2]
    visible = torch.arange(k.shape[1], device=q.device) < seq_lens.long()[:, None]  # [B, L]
    v = v.masked_fill(~visible[:, :, None, None], 0)        # unseen rows: no NaN * 0
    qg = q.reshape(b, n_kv, n_heads // n_kv, d)                      # [B, nKV, group, D]
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale          # [B, nKV, group, L]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v.transpose(1, 2)).reshape(b, n_heads, d)


def prefill_attention_from_cache(q, cache, block_table, layer: int, inputs, scale):
    """``Backend.prefill_attention_from_cache`` with torch ops: the K/V of every sequence
    (context and new tokens, already written) gathered through the block table at once, then
    causal attention of each sequence's new queries.  The loop over sequences slices by the
    host copies of ``cu_seqlens`` and the context lengths: nothing is read back from the
    device."""
    k_all, v_all = gather_kv_rows(cache, block_table, inputs.seq_slots, layer,
                                  inputs.max_seq_len)
    out = torch.empty_like(q)
    bounds = inputs.cu_seqlens_host
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        total = inputs.context_lens_host[i] + (end - start)
        out[start:end] = attention(q[start:end], k_all[i, :total], v_all[i, :total], scale,
                                   causal=True)
    return out
