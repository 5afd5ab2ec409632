"""Which backends can run in this process, asked before any weights are loaded.

``numba_gpu_problem()`` says why the ``numba`` backend cannot start on this machine's GPU (no GPU
torch can see, the process already simulating, numba-cuda or its CUDA bindings missing, a driver
too old for the installed ``cuda-bindings``, no NVVM to compile with), or None when it can: it
compiles and runs one small kernel to find out; ``numba_fix_for(problem)`` says what to do
about it.  ``backend="auto"`` uses it to fall back to the
torch backend; the command line uses ``check_backend`` to refuse a backend before loading a
model.  ``kernel_device()`` says where kernel arguments live in this process.
"""

from __future__ import annotations

import functools
import os

import torch

from paged_tutorial.backends.numba_env import SIM_ENV, numba_cuda_imported, numba_cuda_simulating

FIX_HINT = ("install numba-cuda's CUDA toolkit for your driver: `pip install -e \".[cu12]\"` "
            "in the repository for a CUDA 12.x driver, \".[cu13]\" for 13.x (`nvidia-smi` "
            "prints it); docs/troubleshooting.md, 'Common problems'")


def numba_fix_for(problem: str) -> str:
    """How to get the numba backend working, for the problem ``numba_gpu_problem`` named."""
    if SIM_ENV in problem or "simulator" in problem:
        return (f"start a new Python process with {SIM_ENV} unset (Numba chooses between its "
                "simulator and the GPU once per process, when numba.cuda is first imported)")
    return FIX_HINT


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def torch_gpu_problem() -> str | None:
    """Why torch cannot use a CUDA GPU here, or None."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build, or no NVIDIA GPU is "
                "present")
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA GPU"


def simulator_problem() -> str | None:
    """Why this process cannot use the real GPU through Numba (it simulates), or None."""
    if numba_cuda_imported():
        if numba_cuda_simulating():
            return ("this process already runs Numba's CUDA simulator (Numba decides once per "
                    "process: start a new one without NUMBA_ENABLE_CUDASIM)")
        return None
    if os.environ.get(SIM_ENV, "0").strip() not in ("", "0"):
        return f"{SIM_ENV}={os.environ[SIM_ENV]} is set, which selects Numba's CUDA simulator"
    return None


@functools.lru_cache(maxsize=None)
def _numba_gpu_launch_problem() -> str | None:
    """Compile and run one small kernel on the GPU; the first line of the error if that fails.
    Cached: the answer does not change within a process."""
    try:
        from paged_tutorial.backends.numba_cuda import NumbaBackend

        backend = NumbaBackend(simulate=False)
        gate_up = torch.ones(1, 2, device=backend.device)
        out = backend.silu_mul(gate_up)
        torch.cuda.synchronize()
        expected = torch.nn.functional.silu(gate_up[:, :1]) * gate_up[:, 1:]
        if not torch.allclose(out, expected):
            return f"a test kernel ran but returned {out.tolist()}, expected {expected.tolist()}"
    except Exception as exc:            # any failure to start: report it, the caller decides
        return _first_line(exc)
    return None


def numba_gpu_problem() -> str | None:
    """None if the ``numba`` backend runs on this machine's GPU, else one line saying why not."""
    return torch_gpu_problem() or simulator_problem() or _numba_gpu_launch_problem()


def check_backend(name: str) -> None:
    """Raise RuntimeError (one message, with the fix) if backend ``name`` cannot run in this
    process.  Cheap for ``torch`` and ``auto``; ``numba`` launches one small kernel."""
    if name == "numba":
        alternatives = ("Use --backend torch (any machine) or numba-sim (the same kernels in "
                        "Numba's CUDA simulator, slow)")
        no_gpu = torch_gpu_problem()
        if no_gpu is not None:
            raise RuntimeError(f"backend 'numba' cannot run here: it needs an NVIDIA GPU and "
                               f"{no_gpu}.  {alternatives}")
        problem = numba_gpu_problem()
        if problem is not None:
            raise RuntimeError(f"backend 'numba' cannot run here: {problem}.  {alternatives}; "
                               f"to fix numba on this GPU, {numba_fix_for(problem)}")
    elif name == "numba-sim":
        if numba_cuda_imported() and not numba_cuda_simulating():
            raise RuntimeError(
                "backend 'numba-sim' needs Numba's CUDA simulator, but this process imported "
                "numba.cuda for the GPU; start a new process with NUMBA_ENABLE_CUDASIM=1")


def kernel_device() -> torch.device:
    """Where kernel arguments must live in this process: the CPU when Numba simulates the GPU,
    else the current CUDA device."""
    from paged_tutorial.backends.numba_cuda import SIMULATING

    return torch.device("cpu") if SIMULATING else torch.device("cuda", torch.cuda.current_device())
