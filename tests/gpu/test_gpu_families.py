"""Qwen2 and Qwen3 on the numba backend on a GPU against HF transformers on the same GPU (marker
``gpu``; skipped in the simulator): random weights at real head sizes (Qwen2.5's head_dim 64,
Qwen3's 128), loaded from a safetensors folder and from a GGUF with llama.cpp's tensor names.

- float32: greedy tokens equal HF float32's, token for token, several prompts served together
  (prefill, then decode steps replayed from CUDA graphs);
- bfloat16: the first-step logits stay near HF float32's (``BF16_RTOL``): the bias GEMM, the
  per-head norms and the fused RoPE/cache-write kernel run in bf16 storage."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from helpers.families import VOCAB, build_tiny_qwen, hf_greedy, write_qwen_gguf
from helpers.gpu_checks import rel_err

pytestmark = pytest.mark.gpu

#: per family: the HF config changes that give real head sizes
SHAPES = {
    "qwen2": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2),                       # head_dim 64, as Qwen2.5-0.5B
    "qwen3": dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=128),         # as every Qwen3
}
NEW_TOKENS = 24
#: bf16 first-step logits against HF float32 (bf16 storage rounds every activation: a few 1e-3)
BF16_RTOL = 5e-2


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    built = {}

    def get(name: str):
        if name not in built:
            folder = tmp_path_factory.mktemp(name)
            hf = build_tiny_qwen(name, folder, **SHAPES[name])
            gguf = write_qwen_gguf(tmp_path_factory.mktemp(name + "-gguf") / f"{name}.gguf",
                                   folder, name)
            built[name] = (folder, gguf, hf.to("cuda"))
        return built[name]

    return get


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, VOCAB, n).tolist() for n in (4, 17, 33, 64)]


@pytest.mark.parametrize("source", ["folder", "gguf"])
@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_float32_tokens_equal_hf(qwen, name, source):
    folder, gguf, hf = qwen(name)
    model = pt.load_model(str(folder if source == "folder" else gguf), dtype="float32",
                          device="cuda")
    engine = pt.Engine(model, backend="numba", max_slots=4, max_seq_len=256)
    results = engine.generate(prompts(), max_tokens=NEW_TOKENS)
    for i, (prompt, res) in enumerate(zip(prompts(), results)):
        assert res.token_ids == hf_greedy(hf, prompt, NEW_TOKENS), f"prompt {i}"


@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_bfloat16_first_logits_near_hf(qwen, name):
    folder, _, hf = qwen(name)
    model = pt.load_model(str(folder), dtype="bfloat16", device="cuda")
    engine = pt.Engine(model, backend="numba", max_slots=4, max_seq_len=256)
    engine.record_logits = True
    firsts = {}

    def keep(report):
        for row, rid in enumerate(report.request_ids):
            firsts.setdefault(rid, report.logits[row].float())

    engine.generate(prompts(), max_tokens=2, on_step=keep)
    hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16)     # HF's own bf16 error is the yardstick
    for i, prompt in enumerate(prompts()):
        ids = torch.tensor([prompt], device="cuda")
        with torch.no_grad():
            ref = hf(ids).logits[0, -1].float()
            spread = rel_err(hf_bf16(ids).logits[0, -1], ref)
        assert rel_err(firsts[i], ref) < max(BF16_RTOL, 2 * spread), f"prompt {i}"
