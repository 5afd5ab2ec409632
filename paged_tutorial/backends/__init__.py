"""Backends, found by name in one registry: ``BACKENDS`` maps each name to how it is built
and one line of help (the command line's ``--backend`` list reads it).

What a backend can do is an attribute of its class (``Backend``): ``graph_capturable`` (its
decode step reads nothing back to the host, so a CUDA graph can capture it), ``check_inputs``
(it checks token ids, positions and block-table entries on the host before using them) and
``simulated`` (its kernels run in Numba's CUDA simulator on the CPU).  Code that needs to
know asks the backend, never its name."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from paged_tutorial.backends.availability import numba_fix_for, numba_gpu_problem
from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.torch_ref import TorchBackend


@dataclass(frozen=True)
class BackendEntry:
    """One name of the registry: ``build(device, debug)`` makes the backend."""
    name: str
    help: str
    build: Callable[[str | None, bool | None], Backend]


def _torch(device: str | None, debug: bool | None) -> Backend:
    return TorchBackend(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _numba(simulate: bool) -> Callable[[str | None, bool | None], Backend]:
    def build(device: str | None, debug: bool | None) -> Backend:
        from paged_tutorial.backends.numba_cuda import NumbaBackend   # imports numba.cuda: GPU vs simulator
        return NumbaBackend(simulate=simulate, check_inputs=debug)
    return build


def _auto(device: str | None, debug: bool | None) -> Backend:
    return BACKENDS[auto_choice()].build(device, debug)


#: every backend name, in the order the command line lists them
BACKENDS: dict[str, BackendEntry] = {entry.name: entry for entry in (
    BackendEntry("auto", "numba on an NVIDIA GPU when it starts there (else torch on that GPU, "
                         "with a warning); torch on a CPU", _auto),
    BackendEntry("torch", "every op in plain torch: the reference; GPU if visible, else CPU",
                 _torch),
    BackendEntry("numba", "Numba CUDA kernels + cuBLAS on an NVIDIA GPU (the engine the "
                          "notebooks take apart)", _numba(simulate=False)),
    BackendEntry("numba-sim", "the same kernels in Numba's CUDA simulator on the CPU: every GPU "
                              "thread is a Python thread, so it is very slow; for small models "
                              "and a few tokens", _numba(simulate=True)),
)}
BACKEND_NAMES = tuple(BACKENDS)


def make_backend(backend: str | Backend = "auto", device: str | None = None,
                 debug: bool | None = None) -> Backend:
    """Build a backend by name (``BACKENDS``).  ``auto`` is ``numba`` when a CUDA GPU is
    visible and the numba backend can start on it (one small kernel is compiled and run to
    find out), else ``torch``: on the GPU, with a one-line warning saying why numba could not
    start, or on the CPU.  ``debug=True`` makes the Numba kernel wrappers check their inputs
    (token ids, positions, every block-table entry a kernel will follow) on the host before
    launching; it is on by default in the simulator and off on the GPU (it costs a sync)."""
    if isinstance(backend, Backend):
        return backend
    entry = BACKENDS.get(backend) if isinstance(backend, str) else None
    if entry is None:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return entry.build(device, debug)


def auto_choice() -> str:
    """The backend name ``auto`` stands for in this process (see ``make_backend``)."""
    if not torch.cuda.is_available():
        return "torch"
    problem = numba_gpu_problem()
    if problem is None:
        return "numba"
    warnings.warn(f"backend 'auto': the numba backend cannot start on this GPU ({problem}); "
                  f"using the torch backend on the GPU instead (the same answers, slower).  "
                  f"To get numba working, {numba_fix_for(problem)}", RuntimeWarning,
                  stacklevel=4)
    return "torch"
