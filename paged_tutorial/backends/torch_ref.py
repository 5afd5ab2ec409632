"""Every engine op in plain torch: the oracle the kernels are checked against, and the CPU path.

Each op mirrors what HF ``transformers``' Llama does (same casts, same order), so the whole
engine on this backend reproduces HF's tokens.  The paged cache is read and written through
the block table exactly as the kernels do, only with torch indexing instead of threads
(``paged_reads.py``): on a GPU the table, the slots and the lengths stay on the device, and a
decode layer is a fixed number of torch ops whatever the batch.

``check_inputs`` (default: on the CPU only) checks every block-table entry an op will follow
before it follows one (``check_block_entries``), reading the tensors in place; on a GPU that
check would copy the table to the host in every layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.paged_reads import (attention, cache_view, decode_attention_rows,
                                                 gather_kv, gather_kv_rows)
from paged_tutorial.cache.block_table import check_block_entries
from paged_tutorial.model.sampling import sample_reference


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, device: str | torch.device = "cpu", check_inputs: bool | None = None):
        self.device = torch.device(device)
        self.check_inputs = self.device.type == "cpu" if check_inputs is None else \
            bool(check_inputs)

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
    def _check_entries(self, cache, block_table, layer, slots, n_tokens, where) -> None:
        """check_inputs: the entries below n_tokens[i] of (slots[i], layer) are assigned."""
        table = block_table.cpu().numpy()          # no copy for CPU tensors
        needed: dict[int, int] = {}
        for slot, n in zip(slots.cpu().numpy().tolist(), n_tokens.cpu().numpy().tolist()):
            needed[slot] = max(needed.get(slot, 0), n)
        for slot, n in needed.items():
            check_block_entries(cache, table, slot, layer, n, where)

    def write_kv(self, cache, k, v, block_table, layer, slots, positions):
        view = cache_view(cache)
        bs = cache.config.BLOCK_SIZE
        pos = positions.long()
        if self.check_inputs:
            self._check_entries(cache, block_table, layer, slots, pos + 1, "write_kv")
        phys = block_table[slots.long(), layer, pos // bs].long()
        row = pos % bs
        view[phys, 0, row] = k.reshape(k.shape[0], -1).to(view.dtype)
        view[phys, 1, row] = v.reshape(v.shape[0], -1).to(view.dtype)

    def gather_kv(self, cache, block_table, slot: int, layer: int, seq_len: int):
        """K, V of one (slot, layer) as contiguous [seq_len, nKV, D] tensors (a dense copy the
        notebooks and tests use to check the paged layout)."""
        if self.check_inputs:
            check_block_entries(cache, block_table.cpu().numpy(), slot, layer, seq_len,
                                "gather_kv")
        return gather_kv(cache, block_table, slot, layer, seq_len)

    def prefill_attention(self, q, k, v, inputs, scale):
        out = torch.empty_like(q)
        bounds = inputs.cu_seqlens_host
        for start, end in zip(bounds[:-1], bounds[1:]):
            out[start:end] = attention(q[start:end], k[start:end], v[start:end], scale,
                                       causal=True)
        return out

    def prefill_attention_from_cache(self, q, cache, block_table, layer, inputs, scale):
        if self.check_inputs:
            self._check_entries(cache, block_table, layer, inputs.seq_slots, inputs.seq_lens,
                                "prefill_attention_from_cache")
        return super().prefill_attention_from_cache(q, cache, block_table, layer, inputs, scale)

    def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                         max_seq_len=None):
        if self.check_inputs:
            self._check_entries(cache, block_table, layer, active_slots, seq_lens,
                                "decode_attention")
        # lengths and slots made on the host by a notebook follow q to its device (a no-op for
        # the engine's inputs, which are there already)
        seq_lens, active_slots = seq_lens.to(q.device), active_slots.to(q.device)
        # every sequence's K/V up to the longest, read at once; each row masks what is past
        # its own length (the cache holds exactly the tokens a query may see, so no causal mask)
        k, v = gather_kv_rows(cache, block_table, active_slots, layer,
                              max_seq_len or cache.config.max_seq_len)
        q.copy_(decode_attention_rows(q, k, v, seq_lens, scale))
        return q

    # --- sampling ----------------------------------------------------------------------
    def sample(self, logits, temperature, top_p, uniforms):
        return sample_reference(logits, temperature, top_p, uniforms)
