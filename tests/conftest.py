"""Shared fixtures: tiny random Llamas built and saved by HF transformers, and the embedded
SmolLM2 model (loaded once per session)."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest
import torch

# Simulator or GPU: the one place the test suite decides.  pytest imports this file before any
# test module, so importing the backend package here applies the package's own rule
# (``ensure_simulator_decided``: Numba's CUDA simulator when no CUDA GPU is visible and
# NUMBA_ENABLE_CUDASIM is unset) before anything else imports numba.cuda.  Test modules read
# the outcome (``SIMULATING``) and never decide again.
from paged_tutorial.backends.numba_cuda import SIMULATING  # noqa: E402

GPU_SKIP_REASON = ("needs a CUDA GPU: this process runs Numba's CUDA simulator (no GPU was "
                   "visible, or NUMBA_ENABLE_CUDASIM=1)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs the real kernels at full model size; needs a "
                                       "CUDA GPU (skipped, with the reason, in the simulator)")


GPU_TESTS = Path(__file__).parent / "gpu"      # every test in here carries the gpu marker
#: the tests that run the graders: under --cov (README, "Test") only these are traced; every
#: other test carries pytest-cov's no_cover marker, so tracing the engine's and the simulator's
#: code for a figure about the graders costs nothing there
GRADER_TESTS = (Path(__file__).parent / "teaching", Path(__file__).parent / "mutation")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if GPU_TESTS in item.path.parents:
            item.add_marker(pytest.mark.gpu)
        if not any(folder in item.path.parents for folder in GRADER_TESTS):
            item.add_marker(pytest.mark.no_cover)
    if SIMULATING:
        skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(skip)


TINY_CONFIGS = {
    # name: (LlamaConfig kwargs, config.json spelling)
    "gqa2-tied-default": (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               tie_word_embeddings=True, rope_theta=10000.0), "transformers"),
    "gqa3-untied-llama3-hub": (dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                                    num_attention_heads=6, num_key_value_heads=2, head_dim=32,
                                    tie_word_embeddings=False, rope_theta=500000.0,
                                    rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 64}),
                               "hub"),
    "mha-untied-default": (dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                                tie_word_embeddings=False, rope_theta=10000.0), "transformers"),
    "gqa4-tied-llama3": (dict(hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                              num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                              tie_word_embeddings=True, rope_theta=500000.0,
                              rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 32}),
                         "transformers"),
}


def build_tiny_llama(name: str, folder: Path, vocab_size: int = 320, seed: int = 0):
    """Create a random HF LlamaForCausalLM, save it as safetensors in ``folder``; return it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs, spelling = TINY_CONFIGS[name]
    kwargs = dict(kwargs)
    rope_scaling = kwargs.pop("rope_scaling", None)
    rope_theta = kwargs.pop("rope_theta")
    rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
    if rope_scaling:
        rope_parameters = {**rope_scaling, "rope_theta": rope_theta}
    config = LlamaConfig(vocab_size=vocab_size, max_position_embeddings=256, rms_norm_eps=1e-5,
                         initializer_range=0.08, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None, rope_parameters=rope_parameters, **kwargs)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():     # norms away from 1 so that a missing norm weight shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, safe_serialization=True)
    if spelling == "hub":     # rewrite config.json the way the hub's Llama-3.2 file spells it
        cfg_path = folder / "config.json"
        d = json.loads(cfg_path.read_text())
        params = d.pop("rope_parameters")
        d["rope_theta"] = params.pop("rope_theta")
        d["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
        cfg_path.write_text(json.dumps(d, indent=2))
    return model


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """Factory: tiny_llama(name) -> (folder, hf_model), built once per name per session."""
    cache = {}

    def get(name: str):
        if name not in cache:
            folder = tmp_path_factory.mktemp(name)
            cache[name] = (folder, build_tiny_llama(name, folder))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def smollm2_path():
    from paged_tutorial.loading.models import find_embedded_smollm2

    return find_embedded_smollm2()


@pytest.fixture(scope="session")
def smollm2_f32():
    import paged_tutorial as pt

    return pt.load_model("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    from transformers import LlamaForCausalLM

    path = Path(smollm2_path)
    return LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                            dtype=torch.float32).eval()


#: where each test's peak GPU memory goes, one JSON line per test (``benchmarks/gpu_tests.py``
#: sets it and names the tests that hold the most)
GPU_MEMORY_LOG = os.environ.get("PAGED_TUTORIAL_TEST_GPU_MEMORY_LOG")
#: cached GPU memory a test process keeps past this goes back to the GPU after the test
GPU_MEMORY_KEPT_BYTES = 1 << 30


@pytest.fixture(autouse=True)
def _gpu_memory_handed_back(request):
    """Several test processes share one GPU: memory torch's caching allocator keeps after a
    test (2 GiB for every engine's default KV cache) goes back to the GPU, so one process's
    cache never starves its neighbours; where asked, each test's peak is logged, and what its
    process still holds after it (memory that grows from test to test is an engine kept alive)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    yield
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    peak_reserved = torch.cuda.max_memory_reserved()
    if torch.cuda.memory_reserved() > GPU_MEMORY_KEPT_BYTES:
        gc.collect()
        torch.cuda.empty_cache()
    if GPU_MEMORY_LOG:
        with open(GPU_MEMORY_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({"test": request.node.nodeid, "pid": os.getpid(),
                                  "peak_reserved": peak_reserved,
                                  "allocated_after": torch.cuda.memory_allocated()}) + "\n")


@pytest.fixture(scope="session")
def solved_folder(tmp_path_factory):
    """Where this test session's remembered puzzle answers go (``exercises/solved.py``)."""
    return tmp_path_factory.mktemp("solved")


@pytest.fixture(autouse=True)
def _solved_answers_kept_apart(solved_folder, monkeypatch):
    """Puzzle answers a test gets right are remembered in the session's folder, and its
    verdicts recorded in the session's progress file: never in the user's own."""
    monkeypatch.setenv("PAGED_TUTORIAL_SOLVED", str(solved_folder))
    if os.environ.get("PAGED_TUTORIAL_PROGRESS", "").lower() != "off":
        monkeypatch.setenv("PAGED_TUTORIAL_PROGRESS", str(solved_folder / "progress.json"))
