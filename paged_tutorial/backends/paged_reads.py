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
    two [S, n_tokens, nKV, D] tensors, each read by one gather (K and V apart, so each comes
    out contiguous)."""
    c = cache.config
    view = cache_view(cache)
    shape = (phys.shape[0], phys.shape[1] * c.BLOCK_SIZE, c.num_kv_heads, c.head_dim)
    k = view[:, 0][phys].view(shape)                    # [S, nb, BLOCK_SIZE, KV_DIM] -> tokens
    v = view[:, 1][phys].view(shape)
    return k[:, :n_tokens], v[:, :n_tokens]


def gather_kv_rows(cache, block_table: torch.Tensor, seq_slots: torch.Tensor, layer: int,
                   n_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V of positions 0 .. n_tokens-1 of each (seq_slots[s], layer), read through the block
    table: two [S, n_tokens, nKV, D] tensors.  Positions past a sequence's own length hold
    whatever their block holds (an unassigned entry, -1, reads block 0): mask them."""
    n_blocks = cache.config.blocks_for_tokens(n_tokens)
    phys = block_table[seq_slots.long(), layer, :n_blocks].clamp(min=0).long()   # [S, nb]
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
    unseen = torch.arange(k.shape[1], device=q.device) >= seq_lens[:, None]   # [B, L]
    v = v.masked_fill(unseen[:, :, None, None], 0)          # unseen rows: no NaN * 0
    qg = q.reshape(b, n_kv, n_heads // n_kv, d)                      # [B, nKV, group, D]
    scores = torch.matmul(qg, k.permute(0, 2, 3, 1)) * scale          # [B, nKV, group, L]
    scores = scores.masked_fill(unseen[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v.transpose(1, 2)).reshape(b, n_heads, d)


def prefill_query_layout(inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where each new token of a prefill sits in a padded [S, max_query_len] grid, and what it
    may see, all built on the device from ``inputs`` (no host round trip): (seq [T], the
    sequence of each packed row; row [T], its index among that sequence's new tokens;
    visible [S, max_query_len, max_seq_len] bool, key j visible from grid cell (s, r) when
    j <= context_lens[s] + r and j < seq_lens[s]).  Grid cells past a sequence's new tokens
    see its keys up to its length: finite values that nobody reads."""
    device = inputs.cu_seqlens.device
    n_tokens = inputs.token_ids.shape[0]
    packed = torch.arange(n_tokens, dtype=inputs.cu_seqlens.dtype, device=device)
    seq = torch.searchsorted(inputs.cu_seqlens[1:], packed, right=True)
    row = (packed - inputs.cu_seqlens[seq]).long()
    query_pos = inputs.context_lens.long()[:, None] + torch.arange(
        inputs.max_query_len, device=device)                                  # [S, Q]
    last = torch.minimum(query_pos, inputs.seq_lens.long()[:, None] - 1)     # [S, Q]
    keys = torch.arange(inputs.max_seq_len, device=device)
    visible = keys[None, None, :] <= last[:, :, None]                         # [S, Q, L]
    return seq, row, visible


def _prefill_query_masks(inputs):
    """``prefill_query_layout`` and the two masks every layer applies: (seq, row, hidden
    [S, 1, 1, Q, L], True where a grid cell may not see a key; unseen [S, L, 1, 1], True for
    keys past a sequence's length)."""
    seq, row, visible = prefill_query_layout(inputs)
    return seq, row, ~visible[:, None, None], ~visible[:, -1, :, None, None]


def prefill_attention_from_cache(q, cache, block_table, layer: int, inputs, scale):
    """``Backend.prefill_attention_from_cache`` with torch ops, every sequence at once: the K/V
    of each sequence (context and new tokens, already written) gathered through the block
    table, the new queries scattered into a padded [S, max_query_len] grid, one masked
    attention over the grid (each query sees its sequence's keys up to its own position),
    and the real rows gathered back.  A fixed number of ops whatever the number of
    sequences; the index tensors and masks are built once per step (``prefill_query_layout``),
    so each layer adds only its gathers, two matmuls and the softmax."""
    seq, row, hidden, unseen = inputs.derived("paged_reads.prefill_query_masks",
                                              lambda: _prefill_query_masks(inputs))
    k_all, v_all = gather_kv_rows(cache, block_table, inputs.seq_slots, layer,
                                  inputs.max_seq_len)                   # [S, L, nKV, D]
    n_seqs, n_queries = inputs.num_seqs, inputs.max_query_len
    n_heads, d = q.shape[1], q.shape[2]
    n_kv = k_all.shape[2]
    group = n_heads // n_kv
    grid = q.new_zeros(n_seqs, n_queries, n_heads, d)
    grid[seq, row] = q
    # the query heads of a KV group stacked as rows, so each K/V head is used once:
    # [S, nKV, group * Q, D] against k [S, nKV, L, D]
    qg = grid.view(n_seqs, n_queries, n_kv, group, d).permute(0, 2, 3, 1, 4).reshape(
        n_seqs, n_kv, group * n_queries, d)
    k = k_all.transpose(1, 2)
    v = v_all.masked_fill(unseen, 0).transpose(1, 2)      # keys no row sees: no NaN * 0
    scores = torch.matmul(qg, k.transpose(2, 3)) * scale
    scores = scores.view(n_seqs, n_kv, group, n_queries, -1).masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(
        n_seqs, n_kv, group * n_queries, -1)
    out = torch.matmul(probs, v).view(n_seqs, n_kv, group, n_queries, d)
    out = out.permute(0, 3, 1, 2, 4).reshape(n_seqs, n_queries, n_heads, d)
    return out[seq, row]
