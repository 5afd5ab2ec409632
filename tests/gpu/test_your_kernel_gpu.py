"""``your_kernel()`` on a GPU (marker ``gpu``): the kernel built from the worked solutions
answers the decode attention of every layer and every head of a SmolLM2-shaped random model
through ``KernelRouter`` around the numba backend, and generates the stock numba engine's
tokens; a kv-group launch (q and the cache handed over from that group's first element) agrees
with the torch backend."""

from __future__ import annotations

import pytest
import torch

import paged_tutorial as pt
import paged_tutorial.teaching.exercises as ex
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig
from paged_tutorial.teaching.kernel_router import KernelRouter

pytestmark = pytest.mark.gpu

#: SmolLM2-135M's attention shapes (9 q heads over 3 kv heads, head_dim 64), fewer layers
SMOLLM2_SHAPED = pt.ModelConfig(vocab_size=2048, hidden_size=576, intermediate_size=1536,
                                num_hidden_layers=4, num_attention_heads=9,
                                num_key_value_heads=3, head_dim=64)


def test_your_kernel_serves_every_layer_and_head_like_the_stock_engine():
    model = pt.random_model(SMOLLM2_SHAPED, dtype="float32", seed=0, device="cuda")
    prompts = [list(range(5, 45)), list(range(100, 117))]
    stock = pt.Engine(model, backend="numba", max_slots=2).generate(
        prompts, max_tokens=12, temperature=0.0)
    router = KernelRouter(ex.your_kernel(use_solutions=True), inner="numba")
    mine = pt.Engine(model, backend=router, max_slots=2).generate(
        prompts, max_tokens=12, temperature=0.0)
    assert [r.token_ids for r in mine] == [r.token_ids for r in stock]
    layers = {c.layer for c in router.routed}
    assert layers == set(range(SMOLLM2_SHAPED.num_hidden_layers))
    assert all(c.kv_groups == (0, 1, 2) for c in router.routed)
    assert max(c.max_abs_diff for c in router.routed) < 1e-4


def test_kv_group_launch_on_the_gpu():
    config = CacheConfig(num_layers=2, num_kv_heads=3, head_dim=64, dtype="float32",
                         kv_cache_bytes=40 * 2 * 16 * 3 * 64 * 4, max_slots=2, max_seq_len=256)
    cache = PagedKVCache(config, torch.device("cuda"))
    cache.free_blocks = list(torch.randperm(cache.NUM_BLOCKS, generator=torch.Generator()
                                            .manual_seed(0)).tolist())
    lens = [200, 37]
    for slot, n in enumerate(lens):
        cache.ensure_capacity(slot, n)
    g = torch.Generator(device="cuda").manual_seed(0)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g, device="cuda"))
    q = torch.randn(2, 9, 64, generator=g, device="cuda")
    table = cache.device_block_table()
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    slots_t = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    reference = TorchBackend("cuda").decode_attention(q.clone(), cache, table, 1, lens_t,
                                                      slots_t, 0.125)
    kernel = ex.your_kernel(use_solutions=True)
    for g_ in range(3):
        out = q.clone()
        kernel.decode_attention(out, cache, table, 1, lens_t, slots_t, 0.125, kv_group=g_)
        torch.cuda.synchronize()
        heads = slice(3 * g_, 3 * g_ + 3)
        torch.testing.assert_close(out[:, heads], reference[:, heads], rtol=1e-4, atol=1e-5)
