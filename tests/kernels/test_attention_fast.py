"""``kernels.attention_fast``, the engine's decode attention: against a float32 torch reference
at shapes that reach every path of the kernel (head_dim 64 and 128, GQA groups of 1, 3, 4 and
8, lengths that end mid-block, a batch of mixed lengths, one split and several, one warp and
two, bf16 / fp16 / fp32 caches), the K/V reads counted from the access log (each element read
once, however many query heads share it), and the launch policy's arithmetic.

The simulator has no bf16 type: bf16 caches travel as their 16-bit patterns and the kernel
unpacks them itself, so the same source runs here and on the GPU.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers.paged_caches import assign, float32_twin, make_cache, rel_err
from paged_tutorial.backends.numba_cuda import NumbaBackend
from paged_tutorial.backends.numba_cuda.kernels import attention_fast
from paged_tutorial.backends.numba_cuda.runtime import access_log
from paged_tutorial.backends.torch_ref import TorchBackend

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-3, "float16": 1e-3}


@pytest.fixture(scope="module")
def device():
    return NumbaBackend().device


def run_case(device, dtype, head_dim, n_kv, qpk, lens, n_splits, num_warps=None, seed=0,
             max_seq_len=64):
    """Fast kernel and torch reference on one random cache; returns (out, want, cache)."""
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(g, dtype, n_kv=n_kv, head_dim=head_dim, max_seq_len=max_seq_len,
                       device=device)
    assign(g, cache, lens)
    n_q, layer = n_kv * qpk, 1
    q = torch.randn(len(lens), n_q, head_dim, generator=g).to(DTYPES[dtype])
    slots = torch.tensor(list(lens), dtype=torch.int32)
    seq_lens = torch.tensor(list(lens.values()), dtype=torch.int32)
    scale = 1.0 / math.sqrt(head_dim)
    want = q.float().clone()
    twin = float32_twin(cache)
    TorchBackend("cpu").decode_attention(want, twin, twin.device_block_table(), layer, seq_lens,
                                         slots, scale)
    out = attention_fast.decode_attention_fast(
        q.to(device), cache, cache.device_block_table(), layer, seq_lens.to(device),
        slots.to(device), scale, num_warps=num_warps, n_splits=n_splits)
    return out, want, cache


CASES = [
    # dtype, head_dim, n_kv, q per kv head, {slot: seq_len}, splits, warps
    pytest.param("bfloat16", 64, 2, 4, {1: 64, 3: 37, 0: 5}, 1, None,
                 id="bf16-d64-gqa4-mixed-1split"),        # 4 blocks per warp: the prefetch chain
    pytest.param("bfloat16", 64, 1, 4, {2: 61, 0: 17}, 3, None, id="bf16-d64-gqa4-3splits"),
    pytest.param("bfloat16", 64, 1, 8, {0: 50, 1: 33}, 2, 2, id="bf16-d64-gqa8-2warps"),
    pytest.param("bfloat16", 128, 1, 3, {3: 45, 1: 2}, 2, None, id="bf16-d128-gqa3"),
    pytest.param("float16", 64, 2, 1, {0: 29, 2: 48}, 1, None, id="fp16-d64-gqa1"),
    pytest.param("float32", 128, 1, 4, {1: 40}, 4, None, id="fp32-d128-gqa4-4splits"),
]


@pytest.mark.parametrize("dtype,head_dim,n_kv,qpk,lens,n_splits,num_warps", CASES)
def test_matches_the_torch_reference(device, dtype, head_dim, n_kv, qpk, lens, n_splits,
                                     num_warps):
    out, want, _ = run_case(device, dtype, head_dim, n_kv, qpk, lens, n_splits, num_warps)
    assert rel_err(out, want) < TOLERANCE[dtype]
    # rows one at a time too: a mixed batch must not leak between its sequences
    for row in range(len(lens)):
        assert rel_err(out[row], want[row]) < 3 * TOLERANCE[dtype], f"row {row}"


def expected_word_reads(cache, lens, layer):
    """{word index: (row of the batch, kv head)} for every K and V word of the live tokens:
    a bf16 cache read as int32 words, two elements each."""
    c = cache.config
    owner = {}
    for row, (slot, n) in enumerate(lens.items()):
        for t in range(n):
            phys = int(cache.block_table[slot, layer, t // c.BLOCK_SIZE])
            for h in range(c.num_kv_heads):
                for offset in (cache.k_byte_offset(phys, t % c.BLOCK_SIZE, h),
                               cache.v_byte_offset(phys, t % c.BLOCK_SIZE, h)):
                    first = offset // 4
                    for w in range(first, first + c.head_dim // 2):
                        owner[w] = (row, h)
    return owner


@pytest.mark.skipif(not access_log.AVAILABLE, reason="recording accesses needs the simulator")
@pytest.mark.parametrize("n_splits", [1, 3])
def test_each_kv_element_is_read_once_per_sequence_and_kv_head(n_splits):
    """GQA reuse, counted: with 4 query heads per KV head, every K/V element of a sequence is
    read exactly once (by the thread blocks of its (sequence, KV head)), not once per query
    head; nothing else in the cache is read."""
    g = torch.Generator().manual_seed(3)
    cache = make_cache(g, "bfloat16", n_kv=2, head_dim=64, device="cpu")
    lens = {2: 37, 0: 16, 3: 5}
    assign(g, cache, lens)
    layer = 1
    q = torch.randn(len(lens), 8, 64, generator=g).to(torch.bfloat16)
    seq_lens = torch.tensor(list(lens.values()), dtype=torch.int32)
    slots = torch.tensor(list(lens), dtype=torch.int32)
    words = cache.buffer.reshape(-1).view(torch.int32)        # what the 16-byte loads read
    with access_log.record_kernel_accesses(kv=words) as logs:
        attention_fast.decode_attention_fast(q, cache, cache.device_block_table(), layer,
                                             seq_lens, slots, 0.125, n_splits=n_splits)
    log = logs["kv"]
    owner = expected_word_reads(cache, lens, layer)
    counts = log.read_counts()
    want = np.zeros_like(counts)
    want[list(owner)] = 1
    assert counts.max() == 1, f"a word was read {counts.max()} times"
    assert np.array_equal(counts, want), "reads must be exactly the live tokens' K and V"
    for rec in log.records:
        assert rec.op == "R" and rec.block == owner[rec.index]


def test_prefetch_needs_whole_blocks():
    with pytest.raises(ValueError, match="prefetch=False"):
        attention_fast.KernelShape(load_passes=2)
    assert attention_fast.KernelShape(load_passes=2, prefetch=False).load_passes == 2


@pytest.mark.parametrize("batch,ctx", [(1, 1024), (1, 2048), (8, 1024), (16, 2048),
                                       (32, 2048), (64, 512), (64, 2048), (256, 2048)])
def test_launch_plan_fills_one_wave(batch, ctx):
    """The plan for 8 KV heads on 132 SMs: enough blocks to fill the GPU's resident slots
    (or every pair once, when the pairs alone fill it), never more than one wave unless the
    pairs alone overflow it, and at least one logical block per warp of each split."""
    n_kv, sms, block_size = 8, 132, 16
    warps, splits = attention_fast.launch_plan(batch, n_kv, ctx // block_size, sms)
    pairs = batch * n_kv
    resident_warps = sms * attention_fast.RESIDENT_BLOCKS_PER_SM * 4
    assert warps in (2, 4) and 1 <= splits <= attention_fast.MAX_SPLITS
    assert splits * warps <= ctx // block_size
    if pairs * 2 <= resident_warps:
        assert pairs * splits * warps <= resident_warps
    if splits == 1 and pairs * warps < resident_warps // 2:
        pytest.fail("a small batch left unsplit")
    assert attention_fast.launch_plan(1, 8, 64, 132) == (4, 16)
    assert attention_fast.launch_plan(64, 8, 128, 132) == (2, 1)
