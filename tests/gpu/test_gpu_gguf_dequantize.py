"""GGUF dequantization on the GPU (marker ``gpu``): every tensor of the embedded SmolLM2 GGUF,
expanded from its file bytes by torch on the GPU, equals bit for bit what NumPy computes on the
host (``gguf_file.dequantize``, itself checked against the ``gguf`` package in
``tests/loading/test_gguf_file.py``); the model loaded onto the GPU holds the same weights as
the one loaded on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.loading.gguf_file import GGUFFile, dequantize
from paged_tutorial.loading.gguf_torch import dequantize_on
from paged_tutorial.loading.models import find_embedded_smollm2

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gguf_path():
    try:
        return find_embedded_smollm2()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def test_every_tensor_dequantizes_on_the_gpu_bit_for_bit(gguf_path):
    file = GGUFFile.open(gguf_path)
    kinds = set()
    for tensor in file.tensors:
        on_gpu = dequantize_on(tensor, torch.device("cuda")).cpu().numpy().reshape(-1)
        expected = dequantize(tensor)
        assert np.array_equal(on_gpu.view(np.uint32), expected.view(np.uint32)), tensor.name
        kinds.add(tensor.tensor_type.name)
    assert {"Q4_1", "Q8_0", "F32"} <= kinds


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_load_holds_the_cpu_load_weights(gguf_path, dtype):
    on_cpu = pt.load_model(gguf_path, dtype, device="cpu")
    on_gpu = pt.load_model(gguf_path, dtype, device="cuda")
    assert on_cpu.weights.keys() == on_gpu.weights.keys()
    for name, weight in on_cpu.weights.items():
        moved = on_gpu.weights[name]
        assert moved.device.type == "cuda" and moved.dtype == weight.dtype, name
        assert torch.equal(moved.cpu(), weight), name
