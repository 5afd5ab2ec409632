"""Prefill attention through torch's FlashAttention kernels: the one op of the numba backend
that is not a Numba kernel by default on the GPU, and why.

Prefill attention is compute-bound (for 2 x 1024-token prompts, 8.6 GFLOP per layer at
Llama-3.2-1B shapes).  Numba exposes no tensor-core instructions, so a Numba kernel runs it on
the float32 FMA units (67 TFLOP/s peak on an H200, against ~800 for bf16 tensor cores): even a
perfect one would spend more time in attention than in all the GEMMs of the step (the
measured numbers: ``docs/measured.md``, prefill attention).
``KernelOptions(prefill="numba")`` keeps the Numba kernel (``prefill.py``).

- ``prefill_attention_varlen``: **one call per layer** for the whole packed batch: FlashAttention's
  variable-length kernel (``torch.ops.aten._flash_attention_forward`` with cumulative sequence
  offsets, the op behind ``torch.nn.attention.varlen``), causal inside each sequence, GQA
  native (no K/V copies), reading q/k/v as the strided views of the QKV projection they are.
  It needs a CUDA device, bf16 or fp16, and head_dim a multiple of 8 (at most 256).
- ``prefill_attention_sdpa``: the fallback for everything else (float32, CPU tensors): one
  ``scaled_dot_product_attention`` call per sequence.

``LAST_PATH`` records which one the last call took ("varlen" or "per-sequence"), so tests and
benchmarks can tell.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LAST_PATH: str | None = None


def varlen_supported(q: torch.Tensor) -> bool:
    d = q.shape[-1]
    return (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and d % 8 == 0
            and d <= 256)


def prefill_attention_varlen(q, k, v, cu_seqlens_dev: torch.Tensor, max_len: int, scale):
    """Causal attention inside each packed sequence, one kernel: q [T, nH, D], k/v
    [T, nKV, D] (rows may be strided; each row contiguous), ``cu_seqlens_dev`` int32 [N + 1]
    on q's device -> new contiguous [T, nH, D]."""
    global LAST_PATH
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens_dev, cu_seqlens_dev, max_len, max_len, 0.0, True, False,
        scale=float(scale))[0]
    LAST_PATH = "varlen"
    return out


def prefill_attention_sdpa(q, k, v, cu_seqlens, scale):
    """Causal attention inside each packed sequence, one SDPA call per sequence: q [T, nH, D],
    k/v [T, nKV, D] (rows may be strided views of the QKV projection) -> new contiguous
    [T, nH, D]."""
    global LAST_PATH
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
    LAST_PATH = "per-sequence"
    return out
