"""backend="auto": numba where it can start on the GPU, else torch with a one-line warning; and
the checks the command line makes before loading weights.

This machine has no GPU, so "a GPU is visible" is simulated by replacing
``torch.cuda.is_available``; what numba does on that GPU is either this process's real state
(it runs Numba's simulator, so the real GPU is out of reach) or a replaced launch check.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch

from paged_tutorial import backends
from paged_tutorial.backends import availability, make_backend
from paged_tutorial.backends.torch_ref import TorchBackend


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    availability._numba_gpu_launch_problem.cache_clear()
    yield
    availability._numba_gpu_launch_problem.cache_clear()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_auto_without_gpu_is_torch_on_cpu_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend = make_backend("auto")
    assert isinstance(backend, TorchBackend) and backend.device.type == "cpu"
    assert "CPU-only build" in availability.numba_gpu_problem() or \
        "sees no CUDA GPU" in availability.numba_gpu_problem()


def test_auto_falls_back_to_torch_on_the_gpu_when_numba_cannot_start(fake_gpu, monkeypatch):
    monkeypatch.setattr(backends, "numba_gpu_problem",
                        lambda: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the driver is too old")
    with pytest.warns(RuntimeWarning) as record:
        backend = make_backend("auto")
    assert isinstance(backend, TorchBackend) and backend.device.type == "cuda"
    assert len(record) == 1
    message = str(record[0].message)
    assert "\n" not in message
    assert "driver is too old" in message and "torch backend" in message and "cu12" in message


def test_the_fallback_warning_names_the_fix_for_its_problem(fake_gpu, monkeypatch):
    monkeypatch.setattr(backends, "numba_gpu_problem",
                        lambda: "NUMBA_ENABLE_CUDASIM=1 is set, which selects Numba's CUDA "
                                "simulator")
    with pytest.warns(RuntimeWarning) as record:
        make_backend("auto")
    message = str(record[0].message)
    assert "\n" not in message and "NUMBA_ENABLE_CUDASIM unset" in message
    assert "cu12" not in message                 # no toolkit to install for this one


@pytest.mark.skipif(torch.cuda.is_available(), reason="this process must be simulating")
def test_a_simulating_process_reports_it_as_the_reason(fake_gpu):
    import paged_tutorial.backends.numba_cuda  # noqa: F401  (numba.cuda imported: simulator)

    problem = availability.numba_gpu_problem()
    assert problem is not None and "simulator" in problem
    with pytest.warns(RuntimeWarning, match="simulator"):
        assert isinstance(make_backend("auto"), TorchBackend)
    with pytest.raises(RuntimeError, match="backend 'numba' cannot run here.*simulator"):
        availability.check_backend("numba")


def test_a_failing_launch_is_reported_in_one_line(fake_gpu, monkeypatch):
    import paged_tutorial.backends.numba_cuda as numba_cuda

    def broken(*args, **kwargs):
        raise RuntimeError("cuInit failed: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE\n"
                           "a second line that the report leaves out")

    monkeypatch.setattr(availability, "simulator_problem", lambda: None)
    monkeypatch.setattr(numba_cuda, "NumbaBackend", broken)
    problem = availability.numba_gpu_problem()
    assert problem == "RuntimeError: cuInit failed: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"


def test_check_backend_accepts_what_runs_here():
    availability.check_backend("torch")
    availability.check_backend("auto")
    if availability.simulator_problem() is not None:      # this process simulates
        availability.check_backend("numba-sim")


def test_numba_env_sets_ctypes_bindings_only_without_cuda_bindings(monkeypatch):
    from paged_tutorial.backends import numba_env

    monkeypatch.setattr(numba_env, "numba_cuda_imported", lambda: False)
    for installed, expected in ((False, "0"), (True, None)):
        monkeypatch.delenv(numba_env.BINDING_ENV, raising=False)
        monkeypatch.setenv(numba_env.SIM_ENV, "1")
        monkeypatch.setattr(numba_env, "_cuda_bindings_installed", lambda: installed)
        assert numba_env.decide_numba_environment() is True
        assert os.environ.get(numba_env.BINDING_ENV) == expected
    monkeypatch.setenv(numba_env.BINDING_ENV, "1")                # the user's choice stays
    monkeypatch.setattr(numba_env, "_cuda_bindings_installed", lambda: False)
    numba_env.decide_numba_environment()
    assert os.environ[numba_env.BINDING_ENV] == "1"


def test_numba_cuda_import_hook_is_installed_when_the_process_lacks_it():
    """A kernel started before numba-cuda was installed (Colab, right after the install cell)
    has no numba-cuda import hook; deciding the environment installs it, so numba.cuda is
    numba-cuda's and not numba's own older CUDA target."""
    code = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "NumbaCudaFinder"]
sys.modules.pop("_numba_cuda_redirector", None)
from paged_tutorial.backends.numba_env import decide_numba_environment
decide_numba_environment()
assert any(type(f).__name__ == "NumbaCudaFinder" for f in sys.meta_path)
import numba.cuda
print(numba.cuda.__file__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "numba_cuda" in out.stdout, out.stdout
