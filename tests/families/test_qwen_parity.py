"""Qwen2 (QKV biases) and Qwen3 (per-head q/k RMSNorm, explicit head_dim) served by the engine
give HF transformers' greedy tokens, token for token: random float32 weights, loaded from a
safetensors folder and from a GGUF written with llama.cpp's tensor names, on the torch backend
and on the Numba kernels (the simulator here; ``tests/gpu/test_gpu_families.py`` on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from helpers.families import VOCAB, build_tiny_qwen, hf_greedy, write_qwen_gguf

FAMILIES = ("qwen2", "qwen3")
SOURCES = ("folder", "gguf")
#: float32 logits against HF: equal up to summation order (see tests/engine/test_engine.py)
LOGIT_RTOL = 1e-4


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """Factory: qwen(name) -> (folder, gguf path, HF model), built once per family."""
    built = {}

    def get(name: str):
        if name not in built:
            folder = tmp_path_factory.mktemp(name)
            hf = build_tiny_qwen(name, folder)
            gguf = write_qwen_gguf(tmp_path_factory.mktemp(name + "-gguf") / f"{name}.gguf",
                                   folder, name)
            built[name] = (folder, gguf, hf)
        return built[name]

    return get


def load(qwen, name: str, source: str):
    folder, gguf, hf = qwen(name)
    model = pt.load_model(str(folder if source == "folder" else gguf), dtype="float32")
    return model, hf


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", FAMILIES)
def test_torch_backend_matches_hf(qwen, name, source):
    model, hf = load(qwen, name, source)
    assert model.config.architecture == type(hf).__name__
    engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=128)
    engine.record_logits = True
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, VOCAB, n).tolist() for n in (5, 16, 17)]
    logits = {i: [] for i in range(len(prompts))}

    def keep(report):
        for row, rid in enumerate(report.request_ids):
            logits[rid].append(report.logits[row])

    results = engine.generate(prompts, max_tokens=16, on_step=keep)
    for i, (prompt, res) in enumerate(zip(prompts, results)):
        assert res.token_ids == hf_greedy(hf, prompt, 16), f"prompt {i} ({len(prompt)} tokens)"
        with torch.no_grad():
            ref = hf(torch.tensor([prompt + res.token_ids[:-1]])).logits[0, len(prompt) - 1:]
        rel = (torch.stack(logits[i]) - ref).norm() / ref.norm()
        assert rel < LOGIT_RTOL, f"prompt {i}: relative logit error {rel:.2e}"


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("name", FAMILIES)
def test_numba_kernels_match_hf(qwen, name, source):
    from paged_tutorial.backends.numba_cuda import backend_name

    model, hf = load(qwen, name, source)
    engine = pt.Engine(model, backend=backend_name(), max_slots=2, max_seq_len=32)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, VOCAB, n).tolist() for n in (3, 6)]
    results = engine.generate(prompts, max_tokens=3)
    assert [r.token_ids for r in results] == [hf_greedy(hf, p, 3) for p in prompts]
    assert len(engine.cache.free_blocks) == engine.cache.NUM_BLOCKS


@pytest.mark.parametrize("name", FAMILIES)
def test_prefix_cache_hits_match_hf(qwen, name):
    """A prompt whose first block is found in the prefix cache attends to it there (the
    cached K were normalised and rotated when written)."""
    model, hf = load(qwen, name, "folder")
    engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=128,
                       prefix_caching=True)
    rng = np.random.default_rng(6)
    shared = rng.integers(0, VOCAB, 16).tolist()
    cached = []
    for tail in (rng.integers(0, VOCAB, 3).tolist(), rng.integers(0, VOCAB, 5).tolist()):
        result = engine.generate([shared + tail], max_tokens=6)[0]
        assert result.token_ids == hf_greedy(hf, shared + tail, 6)
        cached.append(result.num_cached_tokens)
    assert cached == [0, 16]


def test_a_missing_bias_or_norm_changes_the_tokens(qwen):
    """The parity above is not vacuous: the engine without Qwen2's biases or Qwen3's q/k norms
    gives other tokens than HF."""
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, VOCAB, 9).tolist()
    for name, role in (("qwen2", "qkv_bias"), ("qwen3", "q_norm")):
        model, hf = load(qwen, name, "folder")
        engine = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=64)
        for layer in engine.model_runner.network.layers:
            setattr(layer, role, None)
        out = engine.generate([prompt], max_tokens=8)[0].token_ids
        assert out != hf_greedy(hf, prompt, 8), name
