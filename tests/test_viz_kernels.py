"""``paged_tutorial.viz.kernels``: the NumPy traces and demo kernels notebooks 03-05 rely on,
checked against the package (cache formulas, the decode kernel, the torch oracle), and the
chapter 03-05 exercise checkers.  Kernel launches are tiny (the simulator runs them on a CPU)."""

import math

import numpy as np
import pytest
import torch

import paged_tutorial as pt
import paged_tutorial.viz.kernels as vk
from paged_tutorial import exercises
from paged_tutorial.backends.torch_ref import TorchBackend


def small_cache(head_dim=32, n_kv=2, dtype="float32", num_blocks=8, max_slots=3, layers=2):
    item = 4 if dtype == "float32" else 2
    cfg = pt.CacheConfig(num_layers=layers, num_kv_heads=n_kv, head_dim=head_dim, dtype=dtype,
                         kv_cache_bytes=num_blocks * 2 * 16 * n_kv * head_dim * item,
                         max_slots=max_slots, max_seq_len=64)
    cache = pt.PagedKVCache(cfg, vk.kernel_device())
    g = torch.Generator().manual_seed(0)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g).to(cache.buffer.dtype))
    return cache


def test_read_trace_matches_cache_formulas():
    cache = small_cache()
    cache.free_blocks = [5, 0, 7, 2, 6, 1, 3, 4]
    cache.ensure_capacity(2, 21)
    tr = vk.kernel_read_trace(cache, layer=1, slot=2, seq_len=21, q_head=3, q_per_kv=2)
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
    tr = vk.kernel_read_trace(cache, 0, 1, 5, 0, 1)
    poisoned = vk.poisoned_copy(cache, tr.elements(), tr.table_index)
    assert int(torch.isnan(poisoned.buffer).sum()) == cache.buffer.numel() - tr.elements().size
    assert (poisoned.block_table.reshape(-1)[tr.table_index] == tr.physical_block).all()
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 32, generator=g).to(vk.kernel_device())
    clean = vk.article_decode(q.clone(), cache, cache.device_block_table(), 0, [5], [1], 0.2)
    dirty = vk.article_decode(q.clone(), poisoned, poisoned.device_block_table(), 0, [5], [1], 0.2)
    assert torch.equal(clean, dirty)
    expected = TorchBackend().decode_attention(q.cpu().clone(), vk.clone_cache(cache, "cpu"),
                                               torch.from_numpy(cache.block_table), 0,
                                               torch.tensor([5]), torch.tensor([1]), 0.2)
    torch.testing.assert_close(clean.cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not vk.SIMULATING, reason="access logging needs the simulator")
def test_access_log_of_q():
    cache = small_cache(n_kv=1, max_slots=2, layers=1)
    cache.ensure_capacity(0, 3)
    cache.ensure_capacity(1, 2)
    q = torch.randn(2, 1, 32, generator=torch.Generator().manual_seed(2))
    table = cache.device_block_table()
    with vk.log_kernel_accesses(q=q, block_table=table) as logs:
        vk.article_decode(q, cache, table, 0, [2, 3], [1, 0], 0.2)
    recs = sorted(logs["q"].records)
    assert len(recs) == 2 * q.numel()
    by_index = {}
    for _, op, index, block, thread in recs:
        by_index.setdefault(index, []).append((op, block, thread))
    for index, acc in by_index.items():
        assert [a[0] for a in acc] == ["R", "W"] and acc[0][1:] == acc[1][1:]
        assert index == acc[0][1][0] * 32 + acc[0][2]
    reads = logs["block_table"].by_block("R")
    assert reads[(0, 0)].tolist() == [cache.flat_index(1, 0, 0)]
    assert reads[(1, 0)].tolist() == [cache.flat_index(0, 0, 0)]


def test_shuffle_demos():
    rng = np.random.default_rng(3)
    values = rng.standard_normal(64).astype(np.float32)
    steps = vk.shuffle_chain(values)
    model = values.copy()
    for s, off in enumerate(vk.OFFSETS, start=1):
        model = model + vk.shfl_down_model(model, off)
        np.testing.assert_array_equal(steps[s], model)
    np.testing.assert_allclose(vk.package_warp_sum(values[:32]), values[:32].sum(), rtol=1e-5)
    ones = np.ones(128, np.float32)
    assert vk.article_two_warp_dot(ones, ones)["score"] == 64.0
    assert vk.article_two_warp_dot(ones[:64], ones[:64])["score"] == 64.0


def test_online_softmax_trace():
    rng = np.random.default_rng(4)
    scores = rng.standard_normal(50).astype(np.float32) * 3
    values = rng.standard_normal((50, 8)).astype(np.float32)
    tr = vk.online_softmax_trace(scores, values)
    assert tr["correction"][0] == 0.0
    np.testing.assert_allclose(tr["out"], vk.exact_attention(scores, values), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tr["d"][-1], np.exp(scores - scores.max()).sum(), rtol=1e-5)
    q, k = rng.standard_normal(8), rng.standard_normal((50, 8))
    np.testing.assert_allclose(vk.oracle_decode(q, k, values, 0.3),
                               vk.exact_attention(k @ q * 0.3, values), rtol=1e-5, atol=1e-6)


def test_shared_memory_races():
    article = vk.shared_memory_races("article")
    assert len(article) == 32 and {r["cell"] for r in article} == {"dot_products[0]"}
    assert {r["thread_a"] for r in article} == set(range(32, 64))
    assert vk.shared_memory_races("package") == []
    assert vk.shared_memory_races("package", num_warps=4, num_tokens=3) == []
    assert len(vk.shared_memory_races("article", num_warps=4)) == 96


WORKED = {
    "03.flat_index": 1 * 16 * 128 + 3 * 128 + 5,
    "03.v_byte_offset": 3 * 32768 + 16384 + 5 * 1024 + 2 * 128 + 20,
    "03.blocks_for_33": (3, 1),
    "04.shfl_down_8": [i + 8 if i < 24 else i for i in range(32)],
    "04.article_terms_80": 64,
    "04.shared_floats": (2, 3, 4),
    "05.corrections": [0.0, math.exp(-1.5), 1.0, math.exp(-1.0)],
    "05.denominator": sum(math.exp(s - 3.0) for s in (0.5, 2.0, 1.0, 3.0)),
    "05.q_index": 581,
}
WRONG = {"03.flat_index": 7, "03.v_byte_offset": 0, "03.blocks_for_33": (2, 1),
         "04.shfl_down_8": list(range(32)), "04.article_terms_80": 80,
         "04.shared_floats": (2, 2, 2), "05.corrections": [1, 1, 1, 1],
         "05.denominator": 10.0, "05.q_index": 0}


@pytest.mark.parametrize("name", sorted(WORKED))
def test_exercises(name, capsys):
    assert name in exercises.exercises(name[:3])
    assert exercises.check(name, WORKED[name]) is True
    assert exercises.check(name, WRONG[name]) is False
    out = capsys.readouterr().out
    assert "✔ correct" in out and "✘ not yet" in out
