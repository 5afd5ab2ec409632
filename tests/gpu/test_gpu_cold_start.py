"""Cold-start pieces on a GPU (marker ``gpu``): the command line's background CUDA start makes
the context in its thread, in a fresh process; a device that cannot start leaves its error in
the thread's object instead of raising."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import torch
from paged_tutorial.engine.cuda_start import CudaStart
assert not torch.cuda.is_initialized()
start = CudaStart().start()
assert start.wait(timeout=120) and start.started and start.error is None, start.error
assert torch.cuda.is_initialized()
missing = CudaStart(device=f"cuda:{torch.cuda.device_count()}").start()  # past the last GPU
assert missing.wait(timeout=120) and not missing.started
assert isinstance(missing.error, RuntimeError), missing.error   # kept, never raised
print("OK")
"""


def test_the_background_start_makes_the_context():
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-4000:]
