"""The torch oracle's paged reads: the batched decode attention and the batched cached-prefix
prefill against one sequence at a time, with the unused cache rows poisoned so that any read
of them shows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.backends.paged_reads import (attention, gather_kv,
                                                 prefill_attention_from_cache)
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.config import CacheConfig
from paged_tutorial.step_inputs import prefill_layout


def test_batched_decode_attention_equals_each_sequence_alone():
    torch.manual_seed(0)
    config = CacheConfig(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32",
                         kv_cache_bytes=24 * 2 * 16 * 16 * 4, max_slots=3, max_seq_len=64)
    cache = pt.PagedKVCache(config)
    cache.buffer.fill_(float("nan"))                 # rows nobody wrote: NaN
    lens = [5, 40, 17]
    backend = TorchBackend("cpu")
    table = None
    for slot, n in enumerate(lens):
        cache.ensure_capacity(slot, n)
        table = cache.device_block_table()
        for layer in range(2):
            k, v = torch.randn(n, 2, 8), torch.randn(n, 2, 8)
            backend.write_kv(cache, k, v, table, layer, torch.full((n,), slot),
                             torch.arange(n))
    q = torch.randn(3, 4, 8)
    seq_lens, slots = torch.tensor(lens, dtype=torch.int32), torch.tensor([2, 0, 1])
    seq_lens = seq_lens[[2, 0, 1]]
    got = backend.decode_attention(q.clone(), cache, table, 1, seq_lens, slots, 0.3,
                                   max_seq_len=40)
    for b, (slot, n) in enumerate(zip(slots.tolist(), seq_lens.tolist())):
        k, v = gather_kv(cache, table, slot, 1, n)
        want = attention(q[b:b + 1], k, v, 0.3, causal=False)[0]
        torch.testing.assert_close(got[b], want, rtol=1e-6, atol=1e-6)
    # without the host-known longest length: the whole table row, the same result
    whole = backend.decode_attention(q.clone(), cache, table, 1, seq_lens, slots, 0.3)
    torch.testing.assert_close(whole, got, rtol=1e-6, atol=1e-6)


def per_sequence_prefill_from_cache(q, cache, table, layer, inputs, scale):
    """The cached-prefix prefill one sequence at a time: each sequence's K/V read alone, its
    new queries attending causally (the reading the batched op must reproduce)."""
    out = torch.empty_like(q)
    bounds = inputs.cu_seqlens_host
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        total = inputs.context_lens_host[i] + (end - start)
        slot = int(inputs.seq_slots[i])
        k, v = gather_kv(cache, table, slot, layer, total)
        out[start:end] = attention(q[start:end], k, v, scale, causal=True)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_prefill_from_cache_equals_each_sequence_alone(dtype):
    """Sequences with no context, a context inside a block, whole blocks, and one new token,
    in one step; every cache row nobody wrote holds NaN, so a read past a sequence shows."""
    torch.manual_seed(1)
    n_kv, d = 3, 8
    config = CacheConfig(num_layers=2, num_kv_heads=n_kv, head_dim=d, dtype=dtype,
                         kv_cache_bytes=40 * 2 * 16 * n_kv * d * 4, max_slots=4,
                         max_seq_len=80)
    cache = pt.PagedKVCache(config)
    cache.buffer.fill_(float("nan"))
    contexts, news, slots = [0, 7, 32, 50], [12, 9, 20, 1], [3, 0, 2, 1]
    backend = TorchBackend("cpu")
    table = None
    for slot, ctx, new in zip(slots, contexts, news):
        cache.ensure_capacity(slot, ctx + new)
        table = cache.device_block_table()
        for layer in range(2):
            n = ctx + new
            k = torch.randn(n, n_kv, d).to(cache.buffer.dtype)
            v = torch.randn(n, n_kv, d).to(cache.buffer.dtype)
            backend.write_kv(cache, k, v, table, layer, torch.full((n,), slot),
                             torch.arange(n))
    cu = [0]
    for new in news:
        cu.append(cu[-1] + new)
    inputs = prefill_layout(cu, context_lens=contexts, seq_slots=slots, block_table=table)
    q = torch.randn(cu[-1], 9, d).to(cache.buffer.dtype)          # 9 query heads over 3
    got = prefill_attention_from_cache(q, cache, table, 1, inputs, 0.35)
    want = per_sequence_prefill_from_cache(q, cache, table, 1, inputs, 0.35)
    assert torch.isfinite(got).all()
    tol = 1e-6 if dtype == "float32" else 1e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


class PerSequenceTorch(TorchBackend):
    """The torch backend with the per-sequence cached-prefix prefill."""

    def prefill_attention_from_cache(self, q, cache, block_table, layer, inputs, scale):
        return per_sequence_prefill_from_cache(q, cache, block_table, layer, inputs, scale)


def test_engine_with_prefix_caching_gives_the_per_sequence_tokens_and_logits():
    tiny = pt.ModelConfig(vocab_size=97, hidden_size=48, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                          head_dim=8, max_position_embeddings=256, tie_word_embeddings=False)
    model = pt.random_model(tiny, dtype="float32", seed=3)
    rng = np.random.default_rng(5)
    system = rng.integers(0, 97, 37).tolist()
    prompts = [system + rng.integers(0, 97, n).tolist() for n in (3, 11, 30, 20)]
    runs = []
    for backend in (TorchBackend("cpu"), PerSequenceTorch("cpu")):
        engine = pt.Engine(model, backend=backend, max_slots=4, max_seq_len=96,
                           prefix_caching=True)
        engine.record_logits = True
        steps = []
        results = engine.generate(prompts, max_tokens=6, on_step=steps.append)
        runs.append((results, steps))
    (ours, our_steps), (ref, ref_steps) = runs
    assert [r.token_ids for r in ours] == [r.token_ids for r in ref]
    assert sum(r.num_cached_tokens for r in ours) > 0       # the cached path did run
    assert len(our_steps) == len(ref_steps)
    for a, b in zip(our_steps, ref_steps):
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
