"""Prefill attention through torch's fused SDPA (FlashAttention on NVIDIA GPUs): the one op of
the numba backend that is not a Numba kernel by default on the GPU, and why.

Prefill attention is compute-bound (for 2 x 1024-token prompts, 8.6 GFLOP per layer at
Llama-3.2-1B shapes).  Numba exposes no tensor-core instructions, so a Numba kernel runs it on
the float32 FMA units (67 TFLOP/s peak on an H200, against ~800 for bf16 tensor cores): even a
perfect one would spend more time in attention than in all the GEMMs of the step.  The
measured numbers are in ``benchmarks/results/attention-*.json`` (row ``prefill``).
``NumbaBackend(prefill="numba")`` keeps the Numba kernel (``prefill.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def prefill_attention_sdpa(q, k, v, cu_seqlens, scale):
    """Causal attention inside each packed sequence: q [T, nH, D], k/v [T, nKV, D] (rows may
    be strided views of the QKV projection) -> new contiguous [T, nH, D]."""
    n_tokens, n_q_heads, head_dim = q.shape
    group = n_q_heads // k.shape[1]
    out = torch.empty(n_tokens, n_q_heads, head_dim, dtype=q.dtype, device=q.device)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        if end <= start:
            continue
        qs = q[start:end].transpose(0, 1)                              # [nH, L, D]
        ks = k[start:end].transpose(0, 1).repeat_interleave(group, 0)  # [nH, L, D]
        vs = v[start:end].transpose(0, 1).repeat_interleave(group, 0)
        o = F.scaled_dot_product_attention(qs[None], ks[None], vs[None], is_causal=True,
                                           scale=scale)
        out[start:end] = o[0].transpose(0, 1)
    return out
