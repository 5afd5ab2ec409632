"""The torch oracle's paged reads: the batched decode attention against one sequence at a
time, with the unused cache rows poisoned so that any read of them shows."""

from __future__ import annotations

import torch

import paged_tutorial as pt
from paged_tutorial.backends.paged_reads import attention, gather_kv
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.config import CacheConfig


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
