"""``paged_tutorial.teaching.oracles``: the references the kernels are graded against -- the NumPy replay
of the decode kernel's addressing, the poisoned cache, the online-softmax recurrence and the
torch oracle -- checked against the package's cache formulas and the article's kernel (tiny
launches in the simulator)."""

from __future__ import annotations

import numpy as np
import torch

import paged_tutorial as pt
from paged_tutorial.teaching import oracles
from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.backends.torch_ref import TorchBackend


def small_cache(head_dim=32, n_kv=2, dtype="float32", num_blocks=8, max_slots=3, layers=2):
    item = 4 if dtype == "float32" else 2
    cfg = pt.CacheConfig(num_layers=layers, num_kv_heads=n_kv, head_dim=head_dim, dtype=dtype,
                         kv_cache_bytes=num_blocks * 2 * 16 * n_kv * head_dim * item,
                         max_slots=max_slots, max_seq_len=64)
    cache = pt.PagedKVCache(cfg, oracles.kernel_device())
    g = torch.Generator().manual_seed(0)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g).to(cache.buffer.dtype))
    return cache


def test_read_trace_matches_cache_formulas():
    cache = small_cache()
    cache.free_blocks = [5, 0, 7, 2, 6, 1, 3, 4]
    cache.ensure_capacity(2, 21)
    tr = oracles.kernel_read_trace(cache, layer=1, slot=2, seq_len=21, q_head=3, q_per_kv=2)
    assert tr.kv_head == 1 and tr.num_blocks == 2 and tr.tokens_in_block.tolist() == [16, 5]
    assert tr.table_index.tolist() == [cache.flat_index(2, 1, lb) for lb in range(2)]
    assert tr.physical_block.tolist() == cache.block_table[2, 1, :2].tolist()
    item = cache.config.ITEMSIZE
    for i in (0, 15, 16, 20):
        phys = tr.physical_block[tr.logical_block[i]]
        for d in (0, 31):
            assert tr.k_index[i, d] * item == cache.k_byte_offset(phys, tr.token_in_block[i], 1, d)
            assert tr.v_index[i, d] * item == cache.v_byte_offset(phys, tr.token_in_block[i], 1, d)
    assert tr.elements().size == 2 * 21 * 32


def test_poisoned_copy_and_kernel():
    """The decode kernel gives bit-identical output on a cache poisoned outside its trace."""
    cache = small_cache(n_kv=1, max_slots=2, layers=1)
    cache.free_blocks = [3, 6, 1, 0, 4, 2, 7, 5]
    cache.ensure_capacity(1, 5)
    tr = oracles.kernel_read_trace(cache, 0, 1, 5, 0, 1)
    poisoned = oracles.poisoned_copy(cache, tr.elements(), tr.table_index)
    assert isinstance(poisoned, oracles.PoisonedCache) and poisoned.trap_block not in \
        tr.physical_block
    assert int(torch.isnan(poisoned.buffer).sum()) == cache.buffer.numel() - tr.elements().size
    flat = poisoned.block_table.reshape(-1)
    assert (flat[tr.table_index] == tr.physical_block).all()
    others = np.setdiff1d(np.arange(flat.size), tr.table_index)
    assert (flat[others] == poisoned.trap_block).all()
    q = torch.randn(1, 1, 32, generator=torch.Generator().manual_seed(1)).to(cache.buffer.device)
    clean = attention.decode(q.clone(), cache, cache.device_block_table(), 0, [5], [1], 0.2)
    dirty = attention.decode(q.clone(), poisoned, poisoned.device_block_table(), 0, [5], [1], 0.2)
    assert torch.equal(clean, dirty)
    expected = TorchBackend().decode_attention(q.cpu().clone(), oracles.clone_cache(cache, "cpu"),
                                               torch.from_numpy(cache.block_table), 0,
                                               torch.tensor([5]), torch.tensor([1]), 0.2)
    torch.testing.assert_close(clean.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_clone_cache_is_independent():
    cache = small_cache(layers=1)
    cache.ensure_capacity(0, 3)
    twin = oracles.clone_cache(cache)
    twin.buffer.zero_()
    twin.block_table[0, 0, 0] = -1
    assert cache.buffer.abs().sum() > 0 and cache.block_table[0, 0, 0] >= 0
    assert twin.free_blocks == cache.free_blocks and twin.free_blocks is not cache.free_blocks


def test_online_softmax_trace():
    rng = np.random.default_rng(4)
    scores = rng.standard_normal(50).astype(np.float32) * 3
    values = rng.standard_normal((50, 8)).astype(np.float32)
    tr = oracles.online_softmax_trace(scores, values)
    assert tr["correction"][0] == 0.0
    np.testing.assert_allclose(tr["out"], oracles.exact_attention(scores, values), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(tr["d"][-1], np.exp(scores - scores.max()).sum(), rtol=1e-5)
    q, k = rng.standard_normal(8), rng.standard_normal((50, 8))
    np.testing.assert_allclose(oracles.oracle_decode(q, k, values, 0.3),
                               oracles.exact_attention(k @ q * 0.3, values), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(oracles.online_softmax_attention(q, k, values, 0.3),
                               oracles.exact_attention(k @ q * 0.3, values), rtol=1e-4, atol=1e-5)
