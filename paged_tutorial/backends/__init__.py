"""Backends: ``torch`` (the oracle, any device), ``numba`` (Numba CUDA kernels on a GPU),
``numba-sim`` (the same kernels in Numba's CUDA simulator, on the CPU) and ``auto``."""

from __future__ import annotations

import warnings

import torch

from paged_tutorial.backends.availability import numba_fix_for, numba_gpu_problem
from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.torch_ref import TorchBackend

BACKEND_NAMES = ("auto", "torch", "numba", "numba-sim")


def make_backend(backend: str | Backend = "auto", device: str | None = None,
                 debug: bool | None = None) -> Backend:
    """Build a backend by name.  ``auto`` is ``numba`` when a CUDA GPU is visible and the
    numba backend can start on it (one small kernel is compiled and run to find out), else
    ``torch``: on the GPU, with a one-line warning saying why numba could not start, or on the
    CPU.  ``debug=True`` makes the Numba kernel wrappers check their inputs
    (token ids, positions, every block-table entry a kernel will follow) on the host before
    launching; it is on by default in the simulator and off on the GPU (it costs a sync)."""
    if isinstance(backend, Backend):
        return backend
    if backend not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKEND_NAMES)}")
    if backend == "auto":
        backend = _auto_choice()
    if backend == "torch":
        return TorchBackend(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    from paged_tutorial.backends.numba_cuda import NumbaBackend       # imports numba.cuda: decides GPU vs simulator
    return NumbaBackend(simulate=(backend == "numba-sim"), check_inputs=debug)


def _auto_choice() -> str:
    if not torch.cuda.is_available():
        return "torch"
    problem = numba_gpu_problem()
    if problem is None:
        return "numba"
    warnings.warn(f"backend 'auto': the numba backend cannot start on this GPU ({problem}); "
                  f"using the torch backend on the GPU instead (the same answers, slower).  "
                  f"To get numba working, {numba_fix_for(problem)}", RuntimeWarning,
                  stacklevel=3)
    return "torch"
