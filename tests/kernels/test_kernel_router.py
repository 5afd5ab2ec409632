"""``YourKernel.decode_attention`` (all heads, or the heads of one kv group) against the torch
backend, and ``KernelRouter`` sending exactly the chosen (layer, kv group) calls to it."""

from __future__ import annotations

import pytest
import torch

from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig
import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.kernel_router import KernelRouter
from paged_tutorial.teaching.oracles import kernel_device

N_KV, PER_KV, D = 3, 2, 32
LENS, SLOTS = [21, 5], [1, 0]


@pytest.fixture(scope="module")
def case():
    config = CacheConfig(num_layers=2, num_kv_heads=N_KV, head_dim=D, dtype="float32",
                         kv_cache_bytes=12 * 2 * 16 * N_KV * D * 4, max_slots=2, max_seq_len=48)
    dev = kernel_device()                    # the CPU in the simulator, else the GPU
    cache = PagedKVCache(config, dev)
    cache.free_blocks = [7, 2, 9, 0, 11, 4, 1, 8, 3, 10, 5, 6]
    for slot, n in zip(SLOTS, LENS):
        cache.ensure_capacity(slot, n)
    g = torch.Generator().manual_seed(0)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g).to(dev))
    q = torch.randn(len(LENS), N_KV * PER_KV, D, generator=g).to(dev)
    table = cache.device_block_table()
    lens = torch.tensor(LENS, dtype=torch.int32, device=dev)
    slots = torch.tensor(SLOTS, dtype=torch.int32, device=dev)
    reference = TorchBackend(dev).decode_attention(q.clone(), cache, table, 1, lens, slots, 0.2)
    return cache, q, table, lens, slots, reference


def test_all_heads_and_each_kv_group_match_the_torch_backend(case):
    cache, q, table, lens, slots, reference = case
    kernel = ex.your_kernel(use_solutions=True)
    out = kernel.decode_attention(q.clone(), cache, table, 1, lens, slots, 0.2)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    for g in range(N_KV):
        out = q.clone()
        kernel.decode_attention(out, cache, table, 1, lens, slots, 0.2, kv_group=g)
        heads = slice(g * PER_KV, (g + 1) * PER_KV)
        torch.testing.assert_close(out[:, heads], reference[:, heads], rtol=1e-5, atol=1e-6)
        others = torch.ones(N_KV * PER_KV, dtype=torch.bool)
        others[heads] = False
        assert torch.equal(out[:, others], q[:, others])       # untouched


def test_router_sends_only_the_chosen_calls_to_the_kernel(case):
    cache, q, table, lens, slots, reference = case

    class Marked:
        """A kernel whose output is recognisable: every routed head becomes 7."""
        label = "marked"

        def __init__(self):
            self.groups = []

        def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                             kv_group=None):
            self.groups.append(kv_group)
            heads = slice(None) if kv_group is None else \
                slice(kv_group * PER_KV, (kv_group + 1) * PER_KV)
            q[:, heads] = 7.0
            return q

    marked = Marked()
    router = KernelRouter(marked, TorchBackend(cache.device), layers=[1], kv_groups=[2])
    out = router.decode_attention(q.clone(), cache, table, 0, lens, slots, 0.2)
    assert marked.groups == [] and not router.routed            # layer 0 is not routed
    out = router.decode_attention(q.clone(), cache, table, 1, lens, slots, 0.2)
    assert marked.groups == [2]
    assert (out[:, 4:] == 7.0).all()
    torch.testing.assert_close(out[:, :4], reference[:, :4])
    (call,) = router.routed
    assert (call.layer, call.kv_groups, call.seq_lens) == (1, (2,), tuple(LENS))
    assert call.max_abs_diff > 1.0                              # 7 is far from the reference
    everything = KernelRouter(marked, TorchBackend(cache.device))
    out = everything.decode_attention(q.clone(), cache, table, 0, lens, slots, 0.2)
    assert marked.groups[-1] is None and (out == 7.0).all()     # one launch for every head
    with pytest.raises(ValueError, match="kv group"):
        KernelRouter(marked, TorchBackend(cache.device), kv_groups=[3]).decode_attention(
            q.clone(), cache, table, 0, lens, slots, 0.2)
    with pytest.raises(TypeError, match="decode_attention"):
        KernelRouter(object(), "torch")


def test_each_layer_may_have_its_own_kv_groups(case):
    """Three layers spread over a model, one kv group each: as much simulated work as one
    layer's groups, and the kernel still answers in every one of them."""
    cache, q, table, lens, slots, reference = case
    seen = []

    class Marked:
        label = "marked"

        def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                             kv_group=None):
            seen.append((layer, kv_group))
            return q

    router = KernelRouter(Marked(), TorchBackend(cache.device), kv_groups={0: [2], 1: [0, 1]})
    assert router.layers == {0, 1}
    assert "layer 0 (kv group(s) 2)" in router.describe()
    for layer in (0, 1):
        router.decode_attention(q.clone(), cache, table, layer, lens, slots, 0.2)
    assert seen == [(0, 2), (1, 0), (1, 1)]
    assert [call.kv_groups for call in router.routed] == [(2,), (0, 1)]
    with pytest.raises(ValueError, match="no kv groups"):
        KernelRouter(Marked(), TorchBackend(cache.device), layers=[0, 1], kv_groups={0: [1]})
