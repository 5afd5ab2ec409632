"""The warm prefix-cache prefill on the GPU (marker ``gpu``), at the geometry of
``benchmarks/prefix_sharing.py --gpu``: Llama-3.2-1B's shapes (random weights), 16 requests of
1056 tokens that share 1024, the prefix cached by a first wave.  The step that computes the
remaining 16 tokens of each request must not wait for the GPU before its last kernel is
queued (no host sync in packing, the block-table sync or the layers: only sampling reads the
tokens back), and greedy tokens with prefix caching equal those without it in float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import paged_tutorial as pt

pytestmark = pytest.mark.gpu

N, SYSTEM, QUESTION = 16, 1024, 32


def prompts(vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, SYSTEM).tolist()
    return [system + rng.integers(0, vocab, QUESTION).tolist() for _ in range(N)]


@pytest.fixture(scope="module")
def model_fp32():
    config = pt.llama_3_2_1b_config()
    return pt.random_model(config, dtype="float32", seed=0, device="cuda")


def engine(model, prefix_caching: bool):
    return pt.Engine(model, backend="numba", max_slots=N, max_seq_len=2048,
                     prefix_caching=prefix_caching)


def test_warm_prefix_step_queues_its_layers_without_a_host_sync(model_fp32):
    eng = engine(model_fp32, prefix_caching=True)
    batch_prompts = prompts(model_fp32.config.vocab_size)
    params = pt.SamplingParams(max_tokens=2, ignore_eos=True)
    eng.generate(batch_prompts, params)                       # the cold wave caches the prefix
    for p in batch_prompts:
        eng.add_request(p, params)
    batch = eng.scheduler.schedule()
    assert batch.kind == "prefill" and len(batch.requests) == N
    assert [r.num_computed_tokens for r in batch.requests] == [SYSTEM + 16] * N
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        inputs = eng.model_runner.prefill_inputs(batch.requests)
        assert inputs.reads_cached_context and inputs.token_ids.shape[0] == N * 16
        eng.model_runner.network.forward(inputs, eng.cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eng.scheduler.rollback(batch, count=False)                # served normally below
    eng.run_until_done()
    eng.cache.check_invariants()


def test_float32_tokens_equal_with_and_without_prefix_caching(model_fp32):
    batch_prompts = prompts(model_fp32.config.vocab_size, seed=2)
    params = pt.SamplingParams(max_tokens=4, ignore_eos=True)
    waves = {}
    for caching in (False, True):
        eng = engine(model_fp32, caching)
        waves[caching] = [[r.token_ids for r in eng.generate(batch_prompts, params)]
                          for _wave in ("cold", "warm")]
        eng.cache.check_invariants()
        del eng
        torch.cuda.empty_cache()
    assert waves[True] == waves[False]
