"""The projections of a decode step on the CPU: a compiled matrix-vector product.

A decode step multiplies a few rows of activations (one per running sequence) by every weight
matrix of the model, so its time is the time to stream the weights through a core once.
Through ``torch.nn.functional.linear`` the CPU BLAS serves these few-row products with its
general routines, which on some CPUs (measured on a 2-core AMD EPYC with torch's MKL) are far
from that: one row read the weights at about a fifth of the core's read bandwidth, and two or
three rows took two to three times as long as one, paying a thread barrier per call that
stalls whenever another process holds a core.  ``matvec`` reads each weight row once for all
the activation rows, on the calling thread, so a step of three rows costs about what a step
of one does.  The torch backend uses it on the CPU for float32 steps of at most ``MAX_ROWS``
rows (``torch_ref.py``); larger steps (prompts) go to the BLAS, whose kernels do enough work
per weight read there.

Each output is the float32 dot product of a weight row with an activation row, summed in
another order than the BLAS's, so logits agree with HF's to rounding, as the fused Q/K/V and
gate/up projections already do.
"""

from __future__ import annotations

import numpy as np
import torch

from paged_tutorial.backends.numba_env import decide_numba_environment

MAX_ROWS = 8             # activation rows up to which a product takes this path

_compiled = None         # _matvec_into compiled by Numba, on the first product


def _matvec_into(x, weight, out):
    """out[b, o] = dot(weight[o], x[b]) for x [B, in], weight [out, in], out [B, out]."""
    n_out, n_in = weight.shape
    n_rows = x.shape[0]
    for o in range(n_out):
        w_row = weight[o]
        for b in range(n_rows):
            x_row = x[b]
            acc = np.float32(0.0)
            for i in range(n_in):
                acc += w_row[i] * x_row[i]
            out[b, o] = acc


def compiled_matvec():
    """``_matvec_into`` compiled (once per process; Numba caches the machine code on disk).
    Numba reads its environment when it is first imported, so the simulator-or-GPU decision
    (``numba_env.py``) is made before this imports it."""
    global _compiled
    if _compiled is None:
        decide_numba_environment()
        from numba import njit

        _compiled = njit(fastmath=True, nogil=True, cache=True)(_matvec_into)
    return _compiled


def takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``matvec`` serves ``linear(x, weight)``: float32 on the CPU, a contiguous weight,
    x of at most MAX_ROWS rows, nothing that records gradients."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and x.dim() == 2 and x.shape[0] <= MAX_ROWS and weight.is_contiguous()
            and not (x.requires_grad or weight.requires_grad))


def matvec(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [B, in] @ weight[out, in].T -> new [B, out] (float32 CPU tensors, B <= MAX_ROWS)."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    compiled_matvec()(x.numpy(), weight.numpy(), out.numpy())
    return out
