"""A decode graph is captured while another thread of the process uses CUDA (marker ``gpu``):
a second engine, a notebook's widgets or a test's threads must not break the capture.  The
other thread here allocates and frees device memory without pause (cudaMalloc / cudaFree are
the calls a process-wide capture refuses)."""

from __future__ import annotations

import threading

import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

pytestmark = pytest.mark.gpu


def test_capture_while_another_thread_allocates():
    model = pt.random_model(ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16),
                            dtype="float32", seed=0, device="cuda")
    stop = threading.Event()
    allocations = [0]

    def allocate():
        size = 1 << 20
        while not stop.is_set():
            block = torch.empty(size, dtype=torch.uint8, device="cuda")
            del block
            torch.cuda.empty_cache()                    # the next one is a fresh cudaMalloc
            allocations[0] += 1
            size = (1 << 20) + (allocations[0] % 64) * 4096

    other = threading.Thread(target=allocate, daemon=True)
    other.start()
    try:
        for backend in ("numba", "torch"):
            engine = pt.Engine(model, backend=backend, max_slots=8, max_seq_len=64)
            prompts = [[1 + i, 2 + i, 3 + i] for i in range(7)]      # buckets 1 .. 8
            for n in (1, 2, 3, 5, 7):
                engine.generate(prompts[:n], pt.SamplingParams(max_tokens=4,
                                                               ignore_eos=True), chat=False)
            graphs = engine.model_runner.graphs
            assert graphs is not None and len(graphs.graphs) >= 3 and graphs.replays > 0
            assert not engine.has_unfinished()
    finally:
        stop.set()
        other.join(timeout=10)
    assert allocations[0] > 10
