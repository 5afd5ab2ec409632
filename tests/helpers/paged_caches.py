"""Paged caches for kernel tests: random contents, blocks handed out in random order, and a
float32 twin that the torch reference reads."""

from __future__ import annotations

import torch

from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig


def make_cache(g, dtype, *, n_kv, head_dim, block_size=16, num_layers=2, max_slots=4,
               max_seq_len=64, num_blocks=40, device="cpu"):
    """A cache full of random values (``dtype`` by name: "float32", "bfloat16", ...)."""
    itemsize = 4 if dtype == "float32" else 2
    cfg = CacheConfig(num_layers=num_layers, num_kv_heads=n_kv, head_dim=head_dim, dtype=dtype,
                      kv_cache_bytes=num_blocks * 2 * block_size * n_kv * head_dim * itemsize,
                      max_slots=max_slots, max_seq_len=max_seq_len, block_size=block_size)
    cache = PagedKVCache(cfg, device=device)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g).to(cache.buffer.dtype))
    return cache


def assign(g, cache, lens):
    """Blocks for ``{slot: seq_len}`` in every layer, each picked at random from the free
    list."""
    c = cache.config
    for slot, n in lens.items():
        for layer in range(c.num_layers):
            for logical in range(c.blocks_for_tokens(n)):
                pick = int(torch.randint(len(cache.free_blocks), (1,), generator=g))
                cache.block_table[slot, layer, logical] = cache.free_blocks.pop(pick)
                cache.mark_table_changed(slot, layer, logical)
    cache.check_invariants()


def float32_twin(cache):
    """The same cache (contents and block table) in float32, on the CPU."""
    c = cache.config
    twin = PagedKVCache(CacheConfig(
        num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        dtype="float32", kv_cache_bytes=c.NUM_BLOCKS * c.BLOCK_ELEMS * 4, max_slots=c.max_slots,
        max_seq_len=c.max_seq_len, block_size=c.BLOCK_SIZE))
    twin.buffer.copy_(cache.buffer.cpu().float())
    twin.block_table[...] = cache.block_table
    return twin


def rel_err(a, b):
    a, b = a.detach().cpu().float(), b.detach().cpu().float()
    return float((a - b).norm() / b.norm())
