"""``kernels.attention_fast`` on a GPU at Llama-3.2-1B attention shapes (32 query / 8 KV heads,
head_dim 64, bf16; marker ``gpu``, skipped in the simulator): every kernel shape the benchmark
times, with every warps count and split count the launch policy can pick, against a float32
reference over scattered blocks and lengths that end mid-block; the launch plan at batch 1 and
64; and CUDA-graph capture (the split scratch preallocated, one captured graph serving new
lengths).  Timings live in ``benchmarks/attention.py``."""

from __future__ import annotations

import math

import pytest
import torch

from paged_tutorial.backends.numba_cuda.kernels import attention_fast
from paged_tutorial.backends.numba_cuda.runtime import launch
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig

pytestmark = pytest.mark.gpu

N_Q, N_KV, D, BS = 32, 8, 64, 16
SCALE = 1.0 / math.sqrt(D)
LENGTHS = [2048, 977, 513, 2000, 31, 1500, 16, 1100]


def cache_for(batch: int, max_seq_len: int = 2048, seed: int = 0) -> PagedKVCache:
    """Two layers, ``batch`` slots of ``LENGTHS`` (cycled), blocks in random order."""
    cfg = CacheConfig(num_layers=2, num_kv_heads=N_KV, head_dim=D, dtype="bfloat16",
                      max_slots=batch, max_seq_len=max_seq_len, block_size=BS,
                      kv_cache_bytes=2 * batch * max_seq_len * 2 * N_KV * D * 2)
    cache = PagedKVCache(cfg, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(seed)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g, device="cuda")
                       .to(torch.bfloat16))
    perm = torch.randperm(len(cache.free_blocks), generator=torch.Generator().manual_seed(seed))
    cache.free_blocks = [cache.free_blocks[i] for i in perm.tolist()]
    for slot in range(batch):
        cache.ensure_capacity(slot, LENGTHS[slot % len(LENGTHS)])
    return cache


def reference(q, cache, layer, lens, slots):
    """float32 attention over K/V gathered through the block table, masked to each length."""
    c = cache.config
    table = cache.device_block_table()[slots.long(), layer].long()
    kv = cache.buffer.view(c.NUM_BLOCKS, 2, BS, N_KV, D)[table]
    k = kv[:, :, 0].reshape(q.shape[0], -1, N_KV, D).float()
    v = kv[:, :, 1].reshape(q.shape[0], -1, N_KV, D).float()
    qf = q.float().view(q.shape[0], N_KV, N_Q // N_KV, D)
    s = torch.einsum("bhgd,bthd->bhgt", qf, k) * SCALE
    t = torch.arange(k.shape[1], device=q.device)
    s = s.masked_fill(t[None, None, None, :] >= lens.long()[:, None, None, None], float("-inf"))
    return torch.einsum("bhgt,bthd->bhgd", torch.softmax(s, -1), v).reshape(q.shape)


def rel_err(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def inputs(batch, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, N_Q, D, generator=g, device="cuda").to(torch.bfloat16)
    slots = torch.randperm(batch, generator=torch.Generator().manual_seed(seed)).to(
        torch.int32).cuda()
    lens = torch.tensor([LENGTHS[int(s) % len(LENGTHS)] for s in slots.tolist()],
                        dtype=torch.int32, device="cuda")
    return q, slots, lens


SHAPES = [pytest.param(attention_fast.KernelShape(), id="default"),
          pytest.param(attention_fast.KernelShape(max_registers=0), id="no-register-cap"),
          pytest.param(attention_fast.KernelShape(prefetch=False), id="no-prefetch"),
          pytest.param(attention_fast.KernelShape(wide=False), id="8-byte-loads")]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_warps", [2, 4, 8])
@pytest.mark.parametrize("n_splits", [None, 1, 3, 32])
def test_every_shape_warps_and_splits_against_the_reference(shape, num_warps, n_splits):
    cache = cache_for(8)
    q, slots, lens = inputs(8)
    want = reference(q, cache, 1, lens, slots)
    got = attention_fast.decode_attention_fast(q.clone(), cache, cache.device_block_table(), 1,
                                               lens, slots, SCALE, num_warps=num_warps,
                                               n_splits=n_splits, shape=shape)
    assert rel_err(got, want) < 5e-3
    tickets = launch.persistent_buffer("cuda", attention_fast.TICKETS, 1, torch.int32)
    assert int(tickets.abs().sum()) == 0, "the merging blocks must leave the tickets at zero"


@pytest.mark.parametrize("batch", [1, 64])
def test_the_launch_plan_at_batch_1_and_64(batch):
    """The plan the package picks (batch 1: 4 warps, many splits; batch 64: 2 warps, one
    split) computes the same function."""
    cache = cache_for(batch)
    q, slots, lens = inputs(batch)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    warps, splits = attention_fast.launch_plan(batch, N_KV, cache.config.MAX_BLOCKS_PER_SEQ, sms)
    assert (warps, splits > 1) == ((4, True) if batch == 1 else (2, False))
    got = attention_fast.decode_attention_fast(q.clone(), cache, cache.device_block_table(), 0,
                                               lens, slots, SCALE)
    assert rel_err(got, reference(q, cache, 0, lens, slots)) < 5e-3


@pytest.mark.parametrize("batch", [1, 64])
def test_one_captured_graph_serves_new_lengths(batch):
    """Captured once (after one eager launch sized the split scratch), replayed with other
    lengths written into the same length tensor: every replay matches the reference."""
    cache = cache_for(batch)
    q, slots, lens = inputs(batch)
    bt = cache.device_block_table()
    static_q = q.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                        # compile, size the scratch
        attention_fast.decode_attention_fast(static_q, cache, bt, 1, lens, slots, SCALE)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_q.copy_(q)
        attention_fast.decode_attention_fast(static_q, cache, bt, 1, lens, slots, SCALE)
    for shrink in (0, 7, 600):                           # shorter sequences, same graph
        lens.copy_(torch.clamp(lens - shrink, min=1))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(static_q, reference(q, cache, 1, lens, slots)) < 5e-3, shrink
