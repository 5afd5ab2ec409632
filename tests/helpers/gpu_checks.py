"""Comparisons the GPU tests share (``tests/gpu/``).

Elementwise ops are compared with ``ulps``: max |a - b| / (rtol |b| + rtol / 10) with rtol the
storage dtype's relative step (bf16 1e-2, fp16 2e-3, fp32 1e-5), which must stay <= 1 (one or
two roundings apart).  Attention and matrix products are compared by ||a - b|| / ||b||
(``rel_err``) against float32 references.
"""

from __future__ import annotations

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
RTOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def ulps(a, b) -> float:
    rtol = RTOL[a.dtype]
    a, b = a.float(), b.float()
    return float(((a - b).abs() / (rtol * b.abs() + rtol / 10)).max())


def rel_err(a, b) -> float:
    a, b = a.float(), b.float().to(a.device)
    return float((a - b).norm() / b.norm())


def same_bits(a, b) -> bool:
    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(bits), b.view(bits))


def within_one_rounding(a, b) -> bool:
    """Bit-equal, or the differing elements within one rounding (ulps <= 1)."""
    bits = torch.int16 if a.element_size() == 2 else torch.int32
    differ = a.view(bits) != b.view(bits)
    return not bool(differ.any()) or ulps(a[differ], b[differ]) <= 1


def rn(g, dt, *shape, scale=1.0):
    """Normal random values drawn on the GPU with generator ``g``, in dtype ``dt``."""
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dt)


def attention_backend(kernel: str):
    """A backend whose decode attention is ``kernel``: "fast" or "article" (``NumbaBackend``'s
    own), or "triton" (``TritonAttentionBackend``, the peer)."""
    from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend

    if kernel == "triton":
        from paged_tutorial.backends.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    return NumbaBackend(options=KernelOptions(attention=kernel))
