"""Backends: ``torch`` (the oracle, any device), ``numba`` (Numba CUDA kernels on a GPU),
``numba-sim`` (the same kernels in Numba's CUDA simulator, on the CPU) and ``auto``."""

from __future__ import annotations

import torch

from .base import Backend
from .torch_ref import TorchBackend

BACKEND_NAMES = ("auto", "torch", "numba", "numba-sim")


def make_backend(backend: str | Backend = "auto", device: str | None = None,
                 debug: bool | None = None) -> Backend:
    """Build a backend by name.  ``auto`` is ``numba`` when a CUDA GPU is visible, else
    ``torch`` on the CPU.  ``debug=True`` makes the Numba kernel wrappers check their inputs
    (token ids, positions, every block-table entry a kernel will follow) on the host before
    launching; it is on by default in the simulator and off on the GPU (it costs a sync)."""
    if isinstance(backend, Backend):
        return backend
    if backend not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKEND_NAMES)}")
    if backend == "auto":
        backend = "numba" if torch.cuda.is_available() else "torch"
    if backend == "torch":
        return TorchBackend(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    from .numba_cuda import NumbaBackend       # imports numba.cuda: decides GPU vs simulator
    return NumbaBackend(simulate=(backend == "numba-sim"), check_inputs=debug)
