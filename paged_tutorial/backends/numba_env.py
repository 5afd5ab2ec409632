"""The two environment variables Numba reads once, when ``numba.cuda`` is first imported.

Imports nothing from Numba, so it can run before anything else touches ``numba.cuda``:

* ``NUMBA_ENABLE_CUDASIM``: simulator (``1``) or real GPU.  Set to ``1`` when the user has not
  chosen and torch sees no CUDA GPU, so that the import picks the simulator instead of failing
  to find a driver.
* ``NUMBA_CUDA_USE_NVIDIA_BINDING``: numba-cuda talks to the driver through NVIDIA's
  ``cuda-bindings`` package or, with ``0``, through ctypes.  On macOS the package installs
  numba-cuda 0.20.1 (the newest release with a wheel there) without ``cuda-bindings``, and that
  release refuses to import unless the variable is ``0``.  Set to ``0`` when ``cuda-bindings``
  is not installed and the user has not chosen; numba-cuda 0.30 (Linux, Windows) always brings
  ``cuda-bindings``, so there nothing changes.

Numba decides once per process: a process is either simulating or on the GPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys

SIM_ENV = "NUMBA_ENABLE_CUDASIM"
BINDING_ENV = "NUMBA_CUDA_USE_NVIDIA_BINDING"


def numba_cuda_imported() -> bool:
    return "numba.cuda" in sys.modules


def numba_cuda_simulating() -> bool:
    """Which implementation the already-imported ``numba.cuda`` is."""
    cuda = sys.modules["numba.cuda"]
    return cuda.jit.__module__.startswith("numba.cuda.simulator")


def _cuda_bindings_installed() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError):          # no ``cuda`` namespace package at all
        return False


def ensure_numba_cuda_redirect() -> None:
    """numba-cuda makes ``import numba.cuda`` load its own package through an import hook that
    its ``_numba_cuda_redirector.pth`` installs when the interpreter starts.  A process that
    started before numba-cuda was installed (a Colab kernel right after the install cell) or
    whose site-packages were added without their ``.pth`` files has no hook, and ``numba.cuda``
    would be numba's own, older CUDA target (no ``cgutils``; kernels fail to build).  Install
    the hook here when it is missing (importing the redirector module is what the .pth does)."""
    if "_numba_cuda_redirector" in sys.modules:
        return
    try:
        if importlib.util.find_spec("_numba_cuda_redirector") is None:
            return                                # a numba-cuda without the redirector
    except (ImportError, ValueError):
        return
    import _numba_cuda_redirector  # noqa: F401  (inserts numba-cuda's finder in sys.meta_path)


def decide_numba_environment() -> bool:
    """Set both variables (unless the user did) *before* ``numba.cuda`` is imported, and make
    sure ``numba.cuda`` will be numba-cuda's; return True if this process simulates.  After
    the import the decision is made: report it."""
    if numba_cuda_imported():
        return numba_cuda_simulating()
    ensure_numba_cuda_redirect()
    if BINDING_ENV not in os.environ and not _cuda_bindings_installed():
        os.environ[BINDING_ENV] = "0"
    if SIM_ENV not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ[SIM_ENV] = "1"
    return os.environ.get(SIM_ENV, "0").strip() not in ("", "0")
