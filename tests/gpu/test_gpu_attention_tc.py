"""The tensor-core decode attention (``kernels/attention_tc.py``; the default
``KernelOptions(attention="auto")`` takes it from ``attention_tc.MIN_BATCH`` sequences) on a GPU (marker ``gpu``): what the simulator
cannot show, that the inline PTX ``mma.sync.m16n8k16`` assembles and computes the product the
emulation computes, at full size.

- one m16n8k16 product against NumPy (the fragment layouts on the hardware itself);
- Llama-3.2-1B's attention (32 query / 8 KV heads, head_dim 64, bf16, blocks scattered at
  random) at batch 1, 8 and 64 and contexts 1024 and 2048 (with mixed lengths ending mid-block
  too), against the float32 reference and against the fast kernel, through the package's
  launch policy (splits, warps), with and without prefetching; kanana-nano's head_dim 128 / group 3;
- through the backend option, and captured in a CUDA graph.

Timings: ``benchmarks/attention.py`` (columns ``tensor_core`` and ``tensor_core-prefetch``
beside ``fast``).
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers.gpu_checks import rel_err
from helpers.mma_fragments import mma_kernel
from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend
from paged_tutorial.backends.numba_cuda.kernels import attention_fast, attention_tc, split_kv
from paged_tutorial.backends.numba_cuda.runtime import launch
from paged_tutorial.measure import attention_bench

pytestmark = pytest.mark.gpu


def test_one_mma_matches_numpy():
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(16, 16, generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn(16, 8, generator=g, device="cuda").to(torch.bfloat16)
    c = torch.randn(16, 8, generator=g, device="cuda")
    d = torch.zeros(16 * 8, device="cuda")
    mma_kernel[1, 32](a.contiguous().view(torch.int32).reshape(-1),
                      b.t().contiguous().view(torch.int32).reshape(-1), c.reshape(-1), d)
    torch.cuda.synchronize()
    want = a.double() @ b.double() + c.double()
    torch.testing.assert_close(d.view(16, 8).double(), want, rtol=1e-5, atol=1e-5)


def _lens(g, batch, ctx, mixed):
    if not mixed:
        return torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    return torch.randint(1, ctx + 1, (batch,), generator=g, device="cuda").to(torch.int32)


@pytest.mark.parametrize("batch,ctx", [(1, 1024), (1, 2048), (8, 1024), (8, 2048),
                                       (64, 1024), (64, 2048)])
def test_llama_1b_shapes_against_the_reference_and_the_fast_kernel(batch, ctx):
    g = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx)
    cache, n_layers, _ = attention_bench.build_cache(batch, ctx, g)
    bt = cache.device_block_table()
    slots = torch.randperm(batch, generator=g, device="cuda").to(torch.int32)
    q0 = torch.randn(batch, attention_bench.N_Q, attention_bench.D, generator=g,
                     device="cuda").to(torch.bfloat16)
    scale = attention_bench.SCALE
    for mixed in (False, True):
        lens = _lens(g, batch, ctx, mixed)
        layer = n_layers - 1
        want = attention_bench.reference(q0, cache, layer, lens, slots)
        fast = attention_fast.decode_attention_fast(q0.clone(), cache, bt, layer, lens, slots,
                                                    scale)
        for prefetch in (True, False):
            got = attention_tc.decode_attention_tc(q0.clone(), cache, bt, layer, lens, slots,
                                                   scale, prefetch=prefetch)
            torch.cuda.synchronize()
            assert rel_err(got, want) < 5e-3, (mixed, prefetch)
            assert rel_err(got, fast) < 1e-2, (mixed, prefetch)
    tickets = launch.persistent_buffer("cuda", split_kv.TICKETS, 1, torch.int32,
                                       zero=True)
    assert int(tickets.abs().sum()) == 0


def test_head_dim_128_group_3():
    """kanana-nano-2.1b's attention: 24 query / 8 KV heads of head_dim 128."""
    from paged_tutorial.backends.paged_reads import attention
    from paged_tutorial.backends.torch_ref import TorchBackend
    from paged_tutorial.cache.paged_cache import PagedKVCache
    from paged_tutorial.config import CacheConfig

    g = torch.Generator(device="cuda").manual_seed(3)
    cfg = CacheConfig(num_layers=2, num_kv_heads=8, head_dim=128, dtype="bfloat16",
                      kv_cache_bytes=1 << 28, max_slots=8, max_seq_len=2048)
    cache = PagedKVCache(cfg, device="cuda")
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g, device="cuda")
                       .to(torch.bfloat16))
    perm = torch.randperm(len(cache.free_blocks), generator=torch.Generator().manual_seed(1))
    cache.free_blocks = [cache.free_blocks[i] for i in perm.tolist()]
    ctx = [1024, 977, 513, 2000, 31, 1500, 700, 1]
    for slot, n in enumerate(ctx):
        cache.ensure_capacity(slot, n)
    bt = cache.device_block_table()
    q = torch.randn(8, 24, 128, generator=g, device="cuda").to(torch.bfloat16)
    slots = torch.arange(8, dtype=torch.int32, device="cuda")
    lens = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    scale = 1 / math.sqrt(128)
    ref = TorchBackend("cuda")
    want = q.float().clone()
    for b, n in enumerate(ctx):
        k, v = ref.gather_kv(cache, bt, b, 1, n)
        want[b] = attention(want[b:b + 1], k.float(), v.float(), scale, causal=False)[0]
    got = attention_tc.decode_attention_tc(q.clone(), cache, bt, 1, lens, slots, scale)
    assert rel_err(got, want) < 5e-3


def test_the_option_and_a_cuda_graph():
    g = torch.Generator(device="cuda").manual_seed(9)
    cache, _, _ = attention_bench.build_cache(8, 1024, g)
    bt = cache.device_block_table()
    slots = torch.arange(8, dtype=torch.int32, device="cuda")
    lens = torch.randint(1, 1025, (8,), generator=g, device="cuda").to(torch.int32)
    q0 = torch.randn(8, attention_bench.N_Q, attention_bench.D, generator=g,
                     device="cuda").to(torch.bfloat16)
    nb = NumbaBackend(options=KernelOptions(attention="tensor_core"))
    want = attention_bench.reference(q0, cache, 0, lens, slots)
    eager = nb.decode_attention(q0.clone(), cache, bt, 0, lens, slots, attention_bench.SCALE)
    assert nb.attention_fallback is None
    assert rel_err(eager, want) < 5e-3
    q = q0.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        nb.decode_attention(q, cache, bt, 0, lens, slots, attention_bench.SCALE)
    q.copy_(q0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q, eager)


def test_the_default_engine_takes_it_from_its_batch_on_and_keeps_the_fast_kernels_logits(
        monkeypatch):
    """A bf16 engine with the default options at a batch of ``MIN_BATCH`` (decode replayed
    from CUDA graphs): its attention is the tensor-core kernel, and its decode logits stay
    within 1 % of the same engine's with ``attention="fast"`` wherever the two have the same
    history: every row of the first decode step (the prefill is the same in both), and each
    later step's rows whose tokens so far agree (a random model's near-flat logits let the
    two kernels' rounding pick different tokens, after which a row's inputs differ)."""
    import numpy as np

    import paged_tutorial as pt
    from paged_tutorial.config import ModelConfig

    config = ModelConfig(vocab_size=512, hidden_size=512, intermediate_size=1024,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=512, tie_word_embeddings=False)
    model = pt.random_model(config, dtype="bfloat16", seed=4, device="cuda")
    batch = attention_tc.MIN_BATCH
    prompts = [np.random.default_rng(s).integers(0, 512, 5 + 7 * s).tolist()
               for s in range(batch)]

    def decode_run(backend):
        engine = pt.Engine(model, backend=backend, max_slots=batch, max_seq_len=256,
                           kv_cache_bytes=1 << 27)
        engine.record_logits = True
        steps = []
        results = engine.generate(prompts, pt.SamplingParams(max_tokens=6, ignore_eos=True),
                                  on_step=steps.append)
        decode = [(list(s.request_ids), s.logits.float()) for s in steps
                  if s.kind == "decode" and len(s.request_ids) == batch]
        return {r.request_id: r.token_ids for r in results}, decode

    calls = []
    real = attention_tc.decode_attention_tc
    monkeypatch.setattr(attention_tc, "decode_attention_tc",
                        lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    got_tokens, got = decode_run(NumbaBackend())
    assert batch in calls                     # launched (or captured) at the full batch
    assert all(n >= batch for n in calls)
    calls.clear()
    want_tokens, want = decode_run(NumbaBackend(options=KernelOptions(attention="fast")))
    assert not calls
    assert len(got) == len(want) >= 3
    for step, ((ids, a), (ids_fast, b)) in enumerate(zip(got, want)):
        assert ids == ids_fast
        same = [i for i, r in enumerate(ids)
                if got_tokens[r][:step + 1] == want_tokens[r][:step + 1]]
        if step == 0:
            assert len(same) == batch, "the prefill gave different first tokens"
        if same:
            err = float((a[same] - b[same]).norm() / b[same].norm())
            assert err < 1e-2, (step, len(same), err)
