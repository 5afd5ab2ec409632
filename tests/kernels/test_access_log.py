"""``backends.numba_cuda.runtime.access_log``: kernels launched inside ``record_kernel_accesses`` read
and write through recording stand-ins (the simulator only); outside, nothing changes."""

from __future__ import annotations

import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.backends.numba_cuda.runtime import access_log, launch
from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.teaching.oracles import kernel_device

pytestmark = pytest.mark.skipif(not access_log.AVAILABLE,
                                reason="recording accesses needs the simulator")


def small_cache():
    cfg = pt.CacheConfig(num_layers=1, num_kv_heads=1, head_dim=32, dtype="float32",
                         kv_cache_bytes=8 * 2 * 16 * 32 * 4, max_slots=2, max_seq_len=64)
    cache = pt.PagedKVCache(cfg, kernel_device())
    cache.buffer.normal_(generator=torch.Generator().manual_seed(0))
    return cache


def test_q_is_read_then_written_by_one_thread_and_the_table_per_block():
    cache = small_cache()
    cache.ensure_capacity(0, 3)
    cache.ensure_capacity(1, 2)
    q = torch.randn(2, 1, 32, generator=torch.Generator().manual_seed(2))
    table = cache.device_block_table()
    with access_log.record_kernel_accesses(q=q, block_table=table, kv_cache=cache.buffer) as logs:
        attention.decode(q, cache, table, 0, [2, 3], [1, 0], 0.2)
    recs = sorted(logs["q"].records)
    assert len(recs) == 2 * q.numel()
    by_index = {}
    for rec in recs:
        by_index.setdefault(rec.index, []).append((rec.op, rec.block, rec.thread))
    for index, acc in by_index.items():
        assert [a[0] for a in acc] == ["R", "W"] and acc[0][1:] == acc[1][1:]
        assert index == acc[0][1][0] * 32 + acc[0][2]
    reads = logs["block_table"].by_block("R")
    assert reads[(0, 0)].tolist() == [cache.flat_index(1, 0, 0)]
    assert reads[(1, 0)].tolist() == [cache.flat_index(0, 0, 0)]
    k_reads = logs["kv_cache"].by_thread((0, 0), "R")
    assert sorted(k_reads) == list(range(32))            # every thread reads its own column
    assert logs["kv_cache"].outside() == [] and not logs["kv_cache"].writes().size
    assert "reads" in repr(logs["kv_cache"])


def test_outside_a_recording_nothing_is_wrapped():
    t = torch.zeros(4)
    assert not isinstance(launch.as_kernel_array(t), access_log.AccessLog)
    with access_log.record_kernel_accesses(other=torch.zeros(3)):
        assert not isinstance(launch.as_kernel_array(t), access_log.AccessLog)
        assert isinstance(launch.as_kernel_array(torch.zeros(3)), access_log.AccessLog) is False
    with pytest.raises(TypeError, match="torch tensor"):
        with access_log.record_kernel_accesses(x=[1, 2]):
            pass


def test_a_flat_view_is_recognised_and_nested_recordings_stack():
    t = torch.arange(6.0).reshape(2, 3)
    with access_log.record_kernel_accesses(outer=t) as outer:
        with access_log.record_kernel_accesses(inner=t) as inner:
            arr = launch.flat(t)
            assert arr is inner["inner"]
        assert launch.flat(t) is outer["outer"]
        assert arr[4] == 4.0 and inner["inner"].reads().tolist() == [4]
        arr[5] = 7.0
    assert t[1, 2] == 7.0 and inner["inner"].writes().tolist() == [5]


# --- shared memory ---------------------------------------------------------------------------

def shared_run(parts, head_dim=64, n=3, failing=False):
    cfg = pt.CacheConfig(num_layers=1, num_kv_heads=1, head_dim=head_dim, dtype="float32",
                         kv_cache_bytes=2 * 2 * 16 * head_dim * 4, max_slots=1, max_seq_len=32)
    cache = pt.PagedKVCache(cfg, kernel_device())
    cache.buffer.normal_(generator=torch.Generator().manual_seed(0))
    cache.ensure_capacity(0, n)
    q = torch.randn(1, 1, head_dim, generator=torch.Generator().manual_seed(1))
    with access_log.record_shared_accesses() as log:
        try:
            attention.decode(q, cache, cache.device_block_table(), 0, [n], [0], 0.125, parts)
        except RuntimeError:
            if not failing:
                raise
    return log


def test_shared_accesses_carry_the_barrier_epoch_and_the_port_has_no_race():
    log = shared_run(attention.ARTICLE_PARTS)
    publishes = [a for a in log.records if a.op == "W" and a.array == "dot_products"]
    # lanes 0 and 32 publish once per token, before that token's first barrier
    assert sorted((a.thread, a.epoch) for a in publishes) == [(0, 0), (0, 2), (0, 4),
                                                              (32, 0), (32, 2), (32, 4)]
    scores = [a for a in log.records if a.array == "score"]
    assert {a.epoch for a in scores if a.op == "W"} == {1, 3, 5}
    assert {a.epoch for a in scores if a.op == "R"} == {2, 4, 6}
    assert len([b for b in log.barriers if b.thread == 5]) == 6       # two per token
    assert log.races() == [] and log.divergence() is None


def test_the_articles_hand_off_races_on_dot_products_0():
    races = shared_run(attention.ARTICLE_LAYOUT_PARTS).races()
    assert len(races) == 2                             # between token t's read and t+1's publish
    first = races[0]
    assert first.cell == "dot_products[0]" and first.write.thread == 0
    assert first.other.op == "R" and first.other.thread == 1 and first.write.epoch == 2
    assert "dot_products[thread_id // WARP_SIZE] = qk" in first.write.site.code()


def test_a_barrier_in_a_divergent_branch_is_found():
    def split_barrier(q_val, k, thread_id, scale, dot_products, score):
        qk = q_val * k
        for off in (16, 8, 4, 2, 1):
            qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)     # noqa: F821
        if thread_id == 0:
            score[0] = qk * scale
            cuda.syncthreads()                                       # noqa: F821
        cuda.syncthreads()                                           # noqa: F821
        return score[0]
    # the simulator releases a barrier once every live thread waits at *some* barrier, so the
    # block does not hang; the shuffle emulation may then fail, and the log still tells why
    log = shared_run(attention.ARTICLE_PARTS.replace(token_score=split_barrier), 32, 2,
                     failing=True)
    divergence = log.divergence()
    assert divergence is not None and divergence.round == 0
    lines = {site.line if site else None: threads for site, threads in divergence.at.items()}
    assert sorted(len(t) for t in lines.values()) == [1, 31]


def test_a_shared_index_out_of_range_is_refused_with_its_name():
    def reads_cell_1(q_val, k, thread_id, scale, dot_products, score):
        cuda.syncthreads()                                           # noqa: F821
        return dot_products[1]
    with pytest.raises(IndexError, match=r"dot_products\[1\] read by thread \d+ .* 1 cell"):
        shared_run(attention.ARTICLE_PARTS.replace(token_score=reads_cell_1), 32, 1)


def test_the_fast_kernel_reads_each_k_and_v_element_once_for_a_whole_gqa_group():
    """Four query heads per KV head, bf16 through 16-byte loads (recorded as int32 words), the
    sequences split over two blocks each: every K and V word the step needs is read exactly
    once, and nothing else is (the article's kernel reads each one once per query head)."""
    from paged_tutorial.backends.numba_cuda.kernels import attention_fast

    cfg = pt.CacheConfig(num_layers=1, num_kv_heads=2, head_dim=64, dtype="bfloat16",
                         kv_cache_bytes=12 * 2 * 16 * 2 * 64 * 2, max_slots=2, max_seq_len=128)
    cache = pt.PagedKVCache(cfg, kernel_device())
    g = torch.Generator().manual_seed(0)
    cache.buffer.copy_(torch.randn(cache.buffer.shape, generator=g).to(cache.buffer.dtype))
    lens = [37, 20]
    for slot, n in enumerate(lens):
        cache.ensure_capacity(slot, n)
    table = cache.device_block_table()
    q = torch.randn(2, 8, 64, generator=g).to(torch.bfloat16)
    with access_log.record_kernel_accesses(kv_words=cache.buffer.view(torch.int32)) as logs:
        attention_fast.decode_attention_fast(q, cache, table, 0,
                                             torch.tensor(lens, dtype=torch.int32),
                                             torch.tensor([0, 1], dtype=torch.int32), 0.125)
    want = set()
    for slot, n in enumerate(lens):
        for t in range(n):
            phys = int(cache.block_table[slot, 0, t // cfg.BLOCK_SIZE])
            for h in range(cfg.num_kv_heads):
                k0 = phys * cfg.BLOCK_ELEMS + (t % cfg.BLOCK_SIZE) * cfg.KV_DIM + h * cfg.head_dim
                for e in range(k0, k0 + cfg.head_dim, 2):
                    want.update({e // 2, (e + cfg.V_OFFSET_ELEMS) // 2})
    reads = logs["kv_words"].reads()
    assert reads.size == len(want) == len(set(reads.tolist()))
    assert set(reads.tolist()) == want
