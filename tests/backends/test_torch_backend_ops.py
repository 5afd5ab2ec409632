"""The torch backend's fused layer start (q and k rotated as one view, k and v written by one
scatter) against the contract's plain composition: ``linear``, then ``rope`` on q and k, then
``write_kv``, which rotates each half from clones of the old values.  Bit for bit, in float32
and bfloat16, with tokens of several slots at positions that cross blocks."""

from __future__ import annotations

import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.paged_reads import cache_view
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.config import CacheConfig


def rope_by_halves(x, positions, cos, sin):
    """RoPE as HF writes it, one half at a time from clones (the reading the fused op must
    reproduce)."""
    pos = positions.long()
    c = cos[pos].to(x.dtype)[:, None, :]
    s = sin[pos].to(x.dtype)[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].clone(), x[..., half:].clone()
    x[..., :half] = x1 * c - x2 * s
    x[..., half:] = x2 * c + x1 * s


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_layer_start_equals_linear_rope_write(dtype):
    torch.manual_seed(0)
    n_heads, n_kv, d, hidden = 6, 2, 8, 40
    config = CacheConfig(num_layers=2, num_kv_heads=n_kv, head_dim=d, dtype=dtype,
                         kv_cache_bytes=24 * 2 * 16 * n_kv * d * 4, max_slots=3, max_seq_len=64)
    caches = [pt.PagedKVCache(config) for _ in range(2)]
    for cache in caches:
        for slot, n in enumerate([5, 40, 17]):
            cache.ensure_capacity(slot, n)
    table = caches[0].device_block_table()
    assert torch.equal(table, caches[1].device_block_table())
    tdt = getattr(torch, dtype)
    slots = torch.tensor([0, 1, 1, 2, 1], dtype=torch.int32)
    positions = torch.tensor([4, 15, 16, 3, 39], dtype=torch.int32)
    x = torch.randn(5, hidden).to(tdt)
    w = torch.randn((n_heads + 2 * n_kv) * d, hidden).to(tdt)
    ang = torch.arange(64, dtype=torch.float32)[:, None] * torch.rand(d // 2)
    cos, sin = ang.cos(), ang.sin()
    backend = TorchBackend("cpu")
    got = backend.qkv_rope_write_kv(x, w, n_heads, positions, cos, sin, caches[0], table, 1,
                                    slots)
    want = Backend.qkv_rope_write_kv(backend, x, w, n_heads, positions, cos, sin, caches[1],
                                     table, 1, slots)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.equal(caches[0].buffer, caches[1].buffer)
    # the plain composition itself is HF's rotation (of the backend's own projection: on the
    # CPU a float32 step of few rows is summed by cpu_matvec, in another order than x @ w.T)
    # and the cache rows the table names
    q = backend.linear(x, w)[:, :n_heads * d].reshape(5, n_heads, d)
    rope_by_halves(q, positions, cos, sin)
    assert torch.equal(got[0], q)
    view = cache_view(caches[0])
    phys = table[slots.long(), 1, positions.long() // 16].long()
    assert torch.equal(view[phys, 1, positions.long() % 16], got[2].reshape(5, -1))
