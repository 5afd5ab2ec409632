"""Every engine op in plain torch: the oracle the kernels are checked against, and the CPU path.

Each op mirrors what HF ``transformers``' Llama does (same casts, same order), so the whole
engine on this backend reproduces HF's tokens.  The paged cache is read and written through
the block table exactly as the kernels do, only with torch indexing instead of threads
(``paged_reads.py``): on a GPU the table, the slots and the lengths stay on the device, a
decode layer is a fixed number of torch ops whatever the batch, and sampling reads nothing back
(``batched_sampling.py``), so the engine captures the torch backend's decode steps in CUDA
graphs there as it does the numba backend's.  Each GPU op is a kernel launch, so the layer's
ops are few: q and k rotated together, k and v written by one scatter, K and V read by one
gather each.

On the CPU the few-row projections of a decode step go to a compiled matrix-vector product
rather than to the BLAS, which serves them poorly there: over the GGUF's own blocks for a
matrix the model keeps them for (``cpu_quantized.py``, ``use_quantized_rows``), over the
float32 values otherwise (``cpu_matvec.py``); the norms, RoPE with the cache write and the
decode attention of such a step go to compiled loops (``cpu_decode_ops.py``) rather than to
chains of torch ops, whose dispatch costs more than their arithmetic at that size.

``check_inputs`` (default: on the CPU only) checks every block-table entry an op will follow
before it follows one (``check_block_entries``), reading the tensors in place; on a GPU that
check would copy the table to the host in every layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from paged_tutorial.backends import cpu_decode_ops, cpu_matvec
from paged_tutorial.backends.cpu_quantized import QuantizedMatrix, quantized_matrix
from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.batched_sampling import sample_batched
from paged_tutorial.backends.paged_reads import (attention, cache_view, decode_attention_rows,
                                                 gather_kv, gather_kv_rows)
from paged_tutorial.cache.block_table import check_block_entries
from paged_tutorial.backends.sampling_rule import sample_reference


def rope_factors(positions, cos, sin, dtype):
    """cos and sin of each token's position, [T, 1, D/2] in the activations' dtype (cast
    before use, as HF does)."""
    pos = positions.long()
    return cos[pos].to(dtype)[:, None, :], sin[pos].to(dtype)[:, None, :]


def rotate_half_pairs(x, c, s) -> None:
    """RoPE in place on x [T, heads, D] (HF's rotate-half pairing: dims i and i + D/2):
    both halves computed from the old values, then written back in one copy."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    x.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))


def write_rows(cache, kv, block_table, layer: int, slots, positions) -> None:
    """Scatter kv [T, 2 (K, V), KV_DIM] into the paged cache: token i to physical block
    block_table[slots[i], layer, positions[i] // BLOCK_SIZE], row positions[i] % BLOCK_SIZE.
    Device index ops only: the table and the positions stay where they are."""
    view = cache_view(cache)
    bs = cache.config.BLOCK_SIZE
    pos = positions.long()
    phys = block_table[slots.long(), layer, pos // bs]
    view[phys.long(), :, pos % bs] = kv.to(view.dtype)


class TorchBackend(Backend):
    name = "torch"
    graph_capturable = True

    def __init__(self, device: str | torch.device = "cpu", check_inputs: bool | None = None):
        self.device = torch.device(device)
        self.check_inputs = self.device.type == "cpu" if check_inputs is None else \
            bool(check_inputs)
        #: weight tensor's data pointer -> (the tensor, its QuantizedMatrix), CPU float32 only
        self.quantized: dict[int, tuple[torch.Tensor, QuantizedMatrix]] = {}

    def use_quantized_rows(self, pairs):
        if self.device.type != "cpu":
            return
        for weight, rows in pairs:
            if weight.dtype == torch.float32 and tuple(weight.shape) == rows.shape:
                self.quantized[weight.data_ptr()] = (weight, quantized_matrix(rows))

    def linear(self, x, weight, bias=None):
        if bias is None and cpu_matvec.takes(x, weight):
            kept = self.quantized.get(weight.data_ptr()) if self.quantized else None
            if kept is not None and kept[0] is weight:
                return kept[1].matvec(x)
            return cpu_matvec.matvec(x, weight)
        return F.linear(x, weight, bias)

    # --- per-token ops -----------------------------------------------------------------
    def embed(self, weight, token_ids):
        return weight[token_ids.long()]

    def rms_norm(self, x, weight, eps):
        if x.dim() == 2 and x.is_contiguous() and weight.is_contiguous() \
                and cpu_decode_ops.takes(x, weight):
            return cpu_decode_ops.rms_norm(None, x, weight, eps)
        x32 = x.float()
        variance = x32.pow(2).mean(-1, keepdim=True)
        return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)

    def add_rms_norm(self, x, residual, weight, eps):
        if type(self).rms_norm is TorchBackend.rms_norm and x.shape == residual.shape \
                and residual.dim() == 2 and residual.is_contiguous() \
                and weight.is_contiguous() and cpu_decode_ops.takes(residual, x, weight):
            return cpu_decode_ops.rms_norm(x, residual, weight, eps)
        residual.add_(x)
        return self.rms_norm(residual, weight, eps)

    def rope(self, q, k, positions, cos, sin):
        c, s = rope_factors(positions, cos, sin, q.dtype)
        rotate_half_pairs(q, c, s)
        rotate_half_pairs(k, c, s)

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
        if self.check_inputs:
            self._check_entries(cache, block_table, layer, slots, positions.long() + 1,
                                "write_kv")
        t = k.shape[0]
        write_rows(cache, torch.stack((k.reshape(t, -1), v.reshape(t, -1)), dim=1),
                   block_table, layer, slots, positions)

    def qkv_rope_write_kv(self, x, qkv_weight, n_q_heads, positions, cos, sin, cache,
                          block_table, layer, slots):
        """``Backend.qkv_rope_write_kv`` in fewer torch ops (what decides the speed of this
        backend on a GPU, where each op is a kernel launch): q and k are adjacent in the
        projection, so they are rotated as one [T, nH + nKV, D] view, and the rotated k and
        v, adjacent too, are written into the cache by one scatter.  A subclass that replaces
        ``rope``, ``write_kv`` or ``rope_write_kv`` (a puzzle's writer, a recorder) gets the
        generic path, which calls them."""
        if any(getattr(type(self), op) is not getattr(TorchBackend, op)
               for op in ("rope", "write_kv", "rope_write_kv")):
            return super().qkv_rope_write_kv(x, qkv_weight, n_q_heads, positions, cos, sin,
                                             cache, block_table, layer, slots)
        qkv = self.linear(x, qkv_weight)
        c = cache.config
        t, d = qkv.shape[0], c.head_dim
        q_dim = n_q_heads * d
        compiled = cpu_decode_ops.takes(qkv, cos, sin) and cpu_decode_ops.takes_cache(
            cache, block_table, positions, slots) and cos.is_contiguous() and sin.is_contiguous()
        # the compiled loop refuses (changing nothing) a table entry that is not a block; the
        # torch ops below then name it (check_inputs) or fail as they would have
        if not (compiled and cpu_decode_ops.rope_write_kv(qkv, n_q_heads, d, positions, cos,
                                                          sin, cache, block_table, layer, slots)):
            if self.check_inputs:
                self._check_entries(cache, block_table, layer, slots, positions.long() + 1,
                                    "qkv_rope_write_kv")
            qk = qkv[:, :q_dim + c.KV_DIM].view(t, n_q_heads + c.num_kv_heads, d)
            rotate_half_pairs(qk, *rope_factors(positions, cos, sin, qkv.dtype))
            write_rows(cache, qkv[:, q_dim:].view(t, 2, c.KV_DIM), block_table, layer, slots,
                       positions)
        q = qkv[:, :q_dim].view(t, n_q_heads, d)
        k = qkv[:, q_dim:q_dim + c.KV_DIM].view(t, c.num_kv_heads, d)
        v = qkv[:, q_dim + c.KV_DIM:].view(t, c.num_kv_heads, d)
        return q, k, v

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
        if q.dim() == 3 and cpu_decode_ops.takes(q) and cpu_decode_ops.takes_cache(
                cache, block_table, seq_lens, active_slots) and cpu_decode_ops.decode_attention(
                q, cache, block_table, layer, active_slots, seq_lens, scale):
            return q             # a wild table entry: the ops below name it, or fail as before
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
        # on the CPU the rule row by row; elsewhere every row at once, with no host reads
        # (the same tokens: tests/backends/test_batched_sampling.py)
        if logits.device.type == "cpu":
            return sample_reference(logits, temperature, top_p, uniforms)
        return sample_batched(logits, temperature, top_p, uniforms)
