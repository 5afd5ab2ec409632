"""The Numba CUDA backend: every non-GEMM op of the engine as a Numba CUDA kernel.

One kernel source, two ways to run it:

- ``numba``: on an NVIDIA GPU (kernels on torch's current stream; GEMMs stay ``torch`` =
  cuBLAS, as the article's engine used cuBLAS);
- ``numba-sim``: Numba's CUDA simulator on the CPU (``NUMBA_ENABLE_CUDASIM=1``), every CUDA
  thread a Python thread -- slow, for small shapes in tests and notebooks.  ``sim_shim.py``
  (``device/``) supplies what the simulator lacks (warp shuffles, libdevice bit casts).

Numba chooses between the two when ``numba.cuda`` is first imported, so a process is either
simulating or on the GPU, never both.  Importing this package calls
``ensure_simulator_decided()`` first, which turns the simulator on when no CUDA GPU is visible
and the user has not set ``NUMBA_ENABLE_CUDASIM`` themselves.

Layout: ``backend.py`` (``NumbaBackend``: each engine op as a kernel launch); ``options.py``
(``KernelOptions``: which kernels and fusions it uses); ``kernels/`` (one
module per kernel family: ``attention`` is the article's ``pagedAttentionKernel``,
``attention_fast`` the split-K decode kernel, ``prefill``, ``prefill_sdpa``, ``norms``,
``elementwise``, ``gemv``, ``rope``, ``rope_write_kv``, ``kv_write``, ``sampling``); ``device/``
(device functions the kernels share: ``dtypes`` bf16/fp16/fp32 load and store, ``reduce`` warp and
block reductions, ``vector_io`` 16-byte loads and stores, ``sim_shim`` what the simulator lacks);
``runtime/`` (the host side: ``launch`` turns torch tensors into kernel arguments and launches,
``access_log`` records which elements a simulated kernel touched).
"""

from __future__ import annotations

from paged_tutorial.backends.numba_env import SIM_ENV, decide_numba_environment  # noqa: F401  (imports no numba)


def ensure_simulator_decided() -> bool:
    """Decide simulator vs GPU *before* ``numba.cuda`` is imported; return True if simulating.

    If ``numba.cuda`` is already imported the decision is made: report it.  Otherwise, when the
    user has not set NUMBA_ENABLE_CUDASIM and torch sees no CUDA GPU, set it to 1 so that the
    import below picks the simulator instead of failing to find a driver (and, without
    ``cuda-bindings``, use numba-cuda's ctypes bindings: see ``numba_env.py``)."""
    return decide_numba_environment()


ensure_simulator_decided()

# ruff: noqa: E402  (the imports below must follow the decision above)
from paged_tutorial.backends.numba_cuda.backend import NumbaBackend, backend_name  # noqa: F401
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING  # noqa: F401
from paged_tutorial.backends.numba_cuda.options import (ATTENTION_KERNELS,  # noqa: F401
                                                        KernelOptions)

__all__ = ["NumbaBackend", "KernelOptions", "ensure_simulator_decided", "SIMULATING",
           "backend_name"]
