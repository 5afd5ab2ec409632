"""The projections of a decode step on the CPU: a compiled matrix-vector product.

A decode step multiplies a few rows of activations (one per running sequence) by every weight
matrix of the model, so its time is the time to stream the weights through the cores once.
Through ``torch.nn.functional.linear`` the CPU BLAS serves these few-row products with its
general routines, which on some CPUs (measured on a 2-core AMD EPYC with torch's MKL) are far
from that: one row read the weights at about a fifth of the core's read bandwidth, and two or
three rows took two to three times as long as one.  ``matvec`` reads each weight row once for
all the activation rows, ``ROWS_AT_ONCE`` weight rows at a time (each activation element loaded
once for all of them), so a step of three rows costs about what a step of one does.

The weight rows are split over the threads torch runs with (``torch.get_num_threads()``, the
count ``paged_tutorial.threads`` chooses from the cores other processes leave free): one
thread computes on the calling thread, with no pool and no barrier, which is what a machine
with a busy core needs; two or more split the output rows into one contiguous share each
(Numba's parallel loop), which is what an idle machine with several cores needs to read the
weights at more than one core's bandwidth.

The torch backend uses it on the CPU for float32 steps of at most ``MAX_ROWS`` rows
(``torch_ref.py``); larger steps (prompts) go to the BLAS, whose kernels do enough work per
weight read there.  Each output is the float32 dot product of a weight row with an activation
row, summed in another order than the BLAS's, so logits agree with HF's to rounding, as the
fused Q/K/V and gate/up projections already do.
"""

from __future__ import annotations

import numpy as np
import torch

from paged_tutorial.backends.numba_env import decide_numba_environment

MAX_ROWS = 8             # activation rows up to which a product takes this path
ROWS_AT_ONCE = 4         # weight rows one pass over an activation row multiplies

_compiled = None         # (serial, parallel) compiled by Numba, on the first product


def _rows_into(x, weight, out, first, stop):
    """out[b, o] = dot(weight[o], x[b]) for every activation row b and first <= o < stop,
    ROWS_AT_ONCE weight rows per pass over x[b] (the unrolled body below is that constant)."""
    n_in = weight.shape[1]
    o = first
    while o + ROWS_AT_ONCE <= stop:
        w0, w1, w2, w3 = weight[o], weight[o + 1], weight[o + 2], weight[o + 3]
        for b in range(x.shape[0]):
            x_row = x[b]
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for i in range(n_in):
                xi = x_row[i]
                a0 += w0[i] * xi
                a1 += w1[i] * xi
                a2 += w2[i] * xi
                a3 += w3[i] * xi
            out[b, o] = a0
            out[b, o + 1] = a1
            out[b, o + 2] = a2
            out[b, o + 3] = a3
        o += ROWS_AT_ONCE
    while o < stop:
        w_row = weight[o]
        for b in range(x.shape[0]):
            x_row = x[b]
            acc = np.float32(0.0)
            for i in range(n_in):
                acc += w_row[i] * x_row[i]
            out[b, o] = acc
        o += 1


def share_bounds(n_out: int, shares: int, share: int) -> tuple[int, int]:
    """The output rows [first, stop) of one of ``shares`` threads: contiguous, a multiple of
    ROWS_AT_ONCE long except the last."""
    per = -(-n_out // shares)
    per = -(-per // ROWS_AT_ONCE) * ROWS_AT_ONCE
    return min(n_out, share * per), min(n_out, (share + 1) * per)


def compiled_matvec():
    """(serial, parallel) compiled once per process (Numba caches the machine code on disk).
    Numba reads its environment when it is first imported, so the simulator-or-GPU decision
    (``numba_env.py``) is made before this imports it."""
    global _compiled
    if _compiled is None:
        decide_numba_environment()
        from numba import njit, prange

        rows_into = njit(fastmath=True, nogil=True, cache=True)(_rows_into)
        bounds = njit(cache=True)(share_bounds)

        def serial(x, weight, out):
            rows_into(x, weight, out, 0, weight.shape[0])

        def parallel(x, weight, out, shares):
            for share in prange(shares):
                first, stop = bounds(weight.shape[0], shares, share)
                rows_into(x, weight, out, first, stop)

        _compiled = (njit(fastmath=True, nogil=True, cache=True)(serial),
                     njit(fastmath=True, nogil=True, cache=True, parallel=True)(parallel))
    return _compiled


def threads_to_use() -> int:
    """torch's thread count (what the package chose, or the user), within the threads Numba
    started with."""
    import numba

    return max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))


def takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``matvec`` serves ``linear(x, weight)``: float32 on the CPU, a contiguous weight,
    x of at most MAX_ROWS rows, nothing that records gradients."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and x.dim() == 2 and x.shape[0] <= MAX_ROWS and weight.is_contiguous()
            and not (x.requires_grad or weight.requires_grad))


def matvec(x: torch.Tensor, weight: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """x [B, in] @ weight[out, in].T -> new [B, out] (float32 CPU tensors, B <= MAX_ROWS), on
    ``threads`` threads (default ``threads_to_use()``)."""
    x = x.contiguous()
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    serial, parallel = compiled_matvec()
    threads = threads_to_use() if threads is None else threads
    if threads <= 1:
        serial(x.numpy(), weight.numpy(), out.numpy())
    else:
        import numba

        torch_threads = torch.get_num_threads()
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        parallel(x.numpy(), weight.numpy(), out.numpy(), threads)
        if torch.get_num_threads() != torch_threads:   # one OpenMP runtime: Numba's loop set it
            torch.set_num_threads(torch_threads)
    return out
