"""The whole engine on the Numba kernels (simulated on a CPU) gives the torch backend's tokens."""

from __future__ import annotations

import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

# small enough for the simulator: every CUDA thread is a Python thread
SIM_CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=128, tie_word_embeddings=True)


def numba_backend_name():
    from paged_tutorial.backends.numba_cuda import backend_name

    return backend_name()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_numba_engine_matches_torch_engine(dtype):
    model = pt.random_model(SIM_CONFIG, dtype=dtype, seed=1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 64, n).tolist() for n in (5, 18)]
    kw = dict(max_slots=2, max_seq_len=64, kv_cache_bytes=64 * 2 * 16 * SIM_CONFIG.kv_dim * 4)
    ref_engine = pt.Engine(model, backend="torch", **kw)
    ref_engine.record_logits = True
    ref_logits = []
    ref = ref_engine.generate(prompts, max_tokens=6, on_step=lambda r: ref_logits.append(r.logits))
    engine = pt.Engine(model, backend=numba_backend_name(), **kw)
    engine.record_logits = True
    logits = []
    ours = engine.generate(prompts, max_tokens=6, on_step=lambda r: logits.append(r.logits))
    if dtype == "float32":
        assert [r.token_ids for r in ours] == [r.token_ids for r in ref]
        for a, b in zip(logits, ref_logits):
            assert float((a - b).norm() / b.norm()) < 1e-5
    else:
        # bf16 storage: both round activations to bf16 at the same places, but the kernels keep
        # float32 inside fused ops (e.g. RoPE, attention) where torch rounds in between, so
        # logits differ by a few bf16 ulps; compare the first step's logits and the first token
        a, b = logits[0], ref_logits[0]
        assert float((a - b).norm() / b.norm()) < 3e-2
        assert [r.token_ids[0] for r in ours] == [r.token_ids[0] for r in ref]
    assert (engine.cache.block_table == -1).all()
    assert len(engine.cache.free_blocks) == engine.cache.NUM_BLOCKS


def test_fused_decoder_layer_gives_the_unfused_tokens():
    """Decode at batch 1 in bf16 with the Numba GEMV: five kernels per layer
    (``fuse_norms``: the norms in the GEMVs' prologues, the residual adds in their epilogues)
    against the default, the adds and norms as kernels of their own: the same tokens, logits
    within a rounding of the norm's sum."""
    from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend
    from paged_tutorial.backends.numba_cuda.kernels import gemv

    model = pt.random_model(SIM_CONFIG, dtype="bfloat16", seed=2)
    prompt = np.random.default_rng(3).integers(0, 64, 7).tolist()
    kw = dict(max_slots=1, max_seq_len=64, kv_cache_bytes=64 * 2 * 16 * SIM_CONFIG.kv_dim * 4)
    runs = []
    for fuse, wave in ((True, True), (True, False), (False, True)):
        backend = NumbaBackend(options=KernelOptions(gemv=True, fuse_norms=fuse,
                                                     gemv_wave=wave))
        engine = pt.Engine(model, backend=backend, **kw)
        engine.record_logits = True
        logits = []
        out = engine.generate([prompt], max_tokens=4, on_step=lambda r: logits.append(r.logits))
        runs.append((out[0].token_ids, logits))
    assert gemv.norm_qkv_rope_write_kv_kernel.cache_info().currsize >= 1, "fused path not taken"
    assert gemv.norm_linear_silu_mul_kernel.cache_info().currsize >= 1
    tokens, logits = runs[-1]
    for fused_tokens, fused_logits in runs[:-1]:   # warp norms (one wave), block norms
        assert fused_tokens == tokens
        for a, b in zip(fused_logits, logits):
            assert float((a.float() - b.float()).norm() / b.float().norm()) < 2e-2
