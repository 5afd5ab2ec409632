"""``engine/cuda_start.py``: the background CUDA start does nothing without a GPU (on a GPU:
``tests/gpu/test_gpu_cold_start.py``)."""

from __future__ import annotations

import pytest
import torch

from paged_tutorial.engine.cuda_start import CudaStart


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_without_a_gpu_it_does_nothing():
    start = CudaStart().start()
    assert start.wait(timeout=60)
    assert not start.started and start.error is None
