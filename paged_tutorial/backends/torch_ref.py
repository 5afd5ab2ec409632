"""Every engine op in plain torch: the oracle the kernels are checked against, and the CPU path.

Each op mirrors what HF ``transformers``' Llama does (same casts, same order), so the whole
engine on this backend reproduces HF's tokens.  The paged cache is read and written through
the block table exactly as the kernels do, only with torch indexing instead of threads.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from paged_tutorial.cache.block_table import check_block_entries
from paged_tutorial.model.sampling import sample_reference
from paged_tutorial.backends.base import Backend


# --- reading the paged cache and attending: the oracle's pieces, also the default of
# Backend.prefill_attention_from_cache (base.py) for every backend ---------------------------
def cache_view(cache) -> torch.Tensor:
    """The flat buffer seen as [NUM_BLOCKS, 2 (K, V), BLOCK_SIZE, KV_DIM]."""
    c = cache.config
    return cache.buffer.view(c.NUM_BLOCKS, 2, c.BLOCK_SIZE, c.KV_DIM)


def gather_kv(cache, block_table, slot: int, layer: int, seq_len: int, host_table=None):
    """K, V of the first ``seq_len`` tokens of (slot, layer), read through the block table
    into contiguous [seq_len, nKV, D] tensors on the cache's device.  ``host_table``: a host
    copy of the table for the entry check (default: block_table copied to the host)."""
    c = cache.config
    view = cache_view(cache)
    n_blocks = -(-seq_len // c.BLOCK_SIZE)
    check_block_entries(cache, block_table.cpu().numpy() if host_table is None else host_table,
                        slot, layer, seq_len, "gather_kv")
    phys = block_table[slot, layer, :n_blocks].long()
    kv = view[phys]                                        # [nb, 2, BS, KV_DIM]
    k = kv[:, 0].reshape(-1, c.num_kv_heads, c.head_dim)[:seq_len]
    v = kv[:, 1].reshape(-1, c.num_kv_heads, c.head_dim)[:seq_len]
    return k, v


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


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)

    # --- per-token ops -----------------------------------------------------------------
    def embed(self, weight, token_ids):
        return weight[token_ids.long()]

    def rms_norm(self, x, weight, eps):
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)

    def add_rms_norm(self, x, residual, weight, eps):
        residual.add_(x)
        return self.rms_norm(residual, weight, eps)

    def rope(self, q, k, positions, cos, sin):
        pos = positions.long()
        c = cos[pos].to(q.dtype)[:, None, :]          # [T, 1, D/2], cast like HF does
        s = sin[pos].to(q.dtype)[:, None, :]
        for x in (q, k):
            half = x.shape[-1] // 2
            x1, x2 = x[..., :half].clone(), x[..., half:].clone()
            x[..., :half] = x1 * c - x2 * s
            x[..., half:] = x2 * c + x1 * s

    def silu_mul(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    # --- the paged cache ---------------------------------------------------------------
    _cache_view = staticmethod(cache_view)

    def write_kv(self, cache, k, v, block_table, layer, slots, positions):
        view = self._cache_view(cache)
        bs = cache.config.BLOCK_SIZE
        pos = positions.long()
        table, s_host, p_host = block_table.cpu().numpy(), slots.cpu().numpy(), pos.cpu().numpy()
        for slot in np.unique(s_host):
            check_block_entries(cache, table, int(slot), layer,
                                int(p_host[s_host == slot].max()) + 1, "write_kv")
        phys = block_table[slots.long(), layer, pos // bs].long()
        row = pos % bs
        view[phys, 0, row] = k.reshape(k.shape[0], -1).to(view.dtype)
        view[phys, 1, row] = v.reshape(v.shape[0], -1).to(view.dtype)

    def gather_kv(self, cache, block_table, slot: int, layer: int, seq_len: int):
        """K, V of one (slot, layer) as contiguous [seq_len, nKV, D] tensors (a dense copy the
        notebooks and tests use to check the paged layout)."""
        return gather_kv(cache, block_table, slot, layer, seq_len)

    def prefill_attention(self, q, k, v, cu_seqlens, scale):
        out = torch.empty_like(q)
        for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
            out[start:end] = self._attend(q[start:end], k[start:end], v[start:end], scale,
                                          causal=True)
        return out

    def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale):
        lens = seq_lens.tolist()
        slots = active_slots.tolist()
        for b, (slot, seq_len) in enumerate(zip(slots, lens)):
            k, v = self.gather_kv(cache, block_table, slot, layer, seq_len)
            # No causal mask: the cache holds exactly the tokens this query may see.
            q[b] = self._attend_one(q[b], k, v, scale)
        return q

    @staticmethod
    def _attend_one(q, k, v, scale):
        """One query token: q [nH, D], k/v [L, nKV, D] -> [nH, D].  The query heads of a KV
        group are stacked so each K/V head is used once (no repeated copies of K/V)."""
        n_kv, d = k.shape[1], k.shape[2]
        qg = q.reshape(n_kv, -1, d)                                   # [nKV, group, D]
        scores = torch.matmul(qg, k.permute(1, 2, 0)) * scale          # [nKV, group, L]
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v.transpose(0, 1)).reshape(q.shape)  # [nH, D]

    _attend = staticmethod(attention)     # the same function, under the name others use

    # --- sampling ----------------------------------------------------------------------
    def sample(self, logits, temperature, top_p, uniforms):
        return sample_reference(logits, temperature, top_p, uniforms)
