"""Glue between torch tensors and Numba kernels, identical for the GPU and the simulator.

- ``as_kernel_array(t)``: a torch tensor -> what a kernel receives, sharing memory (results
  land in the torch tensor).  bf16 goes as its int16 bit patterns (``dtypes.py``).  On the GPU:
  ``numba.cuda.as_cuda_array``; in the simulator: the tensor's NumPy view wrapped so the
  simulator does not copy it in and out (or, while ``access_log.record_kernel_accesses`` names
  the tensor, a stand-in that records every element access).
- ``rows(t)``: a 1-D kernel view over a tensor whose rows may be strided (e.g. q sliced out of a
  fused QKV projection) plus the row stride, in elements.  Each row itself must be contiguous.
- ``launch(kernel, grid, block, *args)``: on the GPU the kernel goes onto torch's current stream
  (``cuda.external_stream``), so it is ordered with the surrounding torch ops and can be
  captured in a CUDA graph; in the simulator it runs with a short thread switch interval
  (``sim_shim.fast_thread_switching``).
- Launch sizes differ on purpose: the same kernel runs with 256-thread blocks on the GPU and
  with 64-thread blocks, and few of them, in the simulator, where every thread is a Python
  thread.  Kernels are written with grid-stride loops so that both are correct.
"""

from __future__ import annotations

import os

import torch
from numba import cuda

from . import access_log, sim_shim
from .sim_shim import SIMULATING

#: threads per block for row kernels (one block per row) and grid-stride elementwise kernels
ROW_THREADS = 64 if SIMULATING else 256
ELEMWISE_THREADS = 64 if SIMULATING else 256
SAMPLE_THREADS = 64 if SIMULATING else 512
#: the simulator runs a grid block after block: a few blocks that loop beat many small ones
SIM_MAX_BLOCKS = 2
GPU_MAX_BLOCKS = 65535 * 16

if SIMULATING:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
elif "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:   # pragma: no cover - GPU only
    # Decode launches are small by nature (grid = batch x heads); Numba would warn on each
    # new launch shape.  Set the variable to 1 to see the warnings again.  (Set in the
    # environment too: Numba re-reads its config from NUMBA_* variables when they change.)
    from numba.cuda.core import config as _numba_config

    os.environ["NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS"] = "0"
    _numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0


def _bits_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def as_kernel_array(t: torch.Tensor):
    """Zero-copy kernel argument for tensor ``t`` (any strides)."""
    t = _bits_view(t.detach())
    if SIMULATING:
        if t.device.type != "cpu":
            raise ValueError("numba-sim backend: tensors must be on the CPU, got "
                             f"{t.device}")
        # a recording stand-in while access_log.record_kernel_accesses names this tensor
        return access_log.stand_in(t, FakeCUDAArray(t.numpy()))
    if t.device.type != "cuda":
        raise ValueError(f"numba backend: tensors must be on the GPU, got {t.device}")
    return cuda.as_cuda_array(t)


def rows(t: torch.Tensor, name: str = "tensor"):
    """(1-D kernel view starting at row 0, row stride in elements) for a tensor [R, ...] whose
    rows are each contiguous; rows may be strided (a column slice of a wider matrix)."""
    if t.dim() < 1:
        raise ValueError(f"{name}: expected at least 1 dimension")
    inner = t[0] if t.shape[0] > 0 else t.new_empty(t.shape[1:])
    if t.dim() > 1 and not inner.is_contiguous():
        raise ValueError(f"{name}: each row must be contiguous (got strides {tuple(t.stride())}); "
                         "pass .contiguous()")
    row_elems = inner.numel() if t.dim() > 1 else 1
    row_stride = t.stride(0) if t.dim() > 1 else 1
    if t.shape[0] == 0:
        span = 0
    else:
        span = (t.shape[0] - 1) * row_stride + row_elems
    flat = t.as_strided((span,), (1,), t.storage_offset())
    return as_kernel_array(flat), row_stride


def flat(t: torch.Tensor, name: str = "tensor"):
    """1-D kernel view of a contiguous tensor."""
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (got strides {tuple(t.stride())})")
    return as_kernel_array(t.reshape(-1))


_streams: dict[int, object] = {}


def _current_stream():
    ptr = torch.cuda.current_stream().cuda_stream
    stream = _streams.get(ptr)
    if stream is None:
        stream = _streams[ptr] = cuda.external_stream(ptr)
    return stream


def launch(kernel, grid, block, *args) -> None:
    """Run ``kernel[grid, block](*args)`` on torch's stream (GPU) or in the simulator."""
    if SIMULATING:
        with sim_shim.fast_thread_switching():
            kernel[grid, block](*args)
    else:
        kernel[grid, block, _current_stream()](*args)


def elemwise_grid(n: int, threads: int = ELEMWISE_THREADS) -> int:
    """Blocks for a grid-stride loop over n items."""
    blocks = max(1, -(-n // threads))
    return min(blocks, SIM_MAX_BLOCKS if SIMULATING else GPU_MAX_BLOCKS)
