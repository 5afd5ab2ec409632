"""The kernel puzzles' shapes are drawn afresh for every check, cover what a hard-coded answer
would get wrong, and a failing verdict names the shape; the allocator puzzle's base class gives
nothing to inherit."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from paged_tutorial.backends.numba_cuda.runtime import access_log

from paged_tutorial.cache import CacheFullError
from paged_tutorial.config import CacheConfig
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.teaching.chapters.ch06_block_lifetime import allocator
from paged_tutorial.teaching.chapters.ch03_address_arithmetic import block_walk
from paged_tutorial.teaching.chapters.ch02_block_table import kernel_addresses
from paged_tutorial.teaching.chapters.ch05_online_softmax import online_softmax, output_store
from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction import score_handoff
from paged_tutorial.teaching.harness import shapes

DRAWS = {"03.walk_blocks": block_walk.cases, "02.table_index": kernel_addresses.table_cases,
         "03.k_index": kernel_addresses.k_cases, "04.token_score": score_handoff.cases,
         "05.write_output": output_store.cases, "05.softmax_update": online_softmax.cases}


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_every_check_draws_new_shapes_and_names_them(name):
    first, second = DRAWS[name](), DRAWS[name]()
    assert [c.seed for c in first] != [c.seed for c in second]
    for case in first:
        assert f"seed {case.seed}" in case.label and f"head_dim {case.head_dim}" in case.label


def test_the_drawn_shapes_differ_where_a_constant_would_be_wrong():
    for _ in range(20):
        walk = block_walk.cases()
        assert all(c.head_dim % 32 for c in walk)                    # partly used last warps
        assert len({c.head_dim for c in walk}) == 2
        assert all(c.n_q_heads // c.num_kv_heads != 4 for c in walk)
        assert any(c.num_kv_heads > 1 for c in walk)        # token and KV head strides differ
        assert len({(c.num_layers, c.config.MAX_BLOCKS_PER_SEQ) for c in walk}) == 2
        assert len({c.block_size for c in walk}) == 2                 # BLOCK_SIZE drawn
        assert any(c.block_size & (c.block_size - 1) for c in walk)   # no shift
        assert any(n % c.block_size for c in walk for _, n in c.rows)    # a partly filled block
        assert any(n % c.block_size == 0 for c in walk for _, n in c.rows)   # a full last one
        assert any(n > 2 * c.block_size for c in walk for _, n in c.rows)    # past two blocks
        assert walk[0].rows[0][0] != 0                                # row 0 is not slot 0
        # no constant layer, and not the last layer's row, reads the right entries
        assert len({c.layer for c in walk}) == 2 and all(c.layer > 0 for c in walk)
        assert 0 < walk[0].layer < walk[0].num_layers - 1
        assert any(slot >= 2 for c in walk for slot, _ in c.rows)    # no slot folded onto 2
        assert any(-(-n // c.block_size) > 8 for c in walk for _, n in c.rows)   # past 8 blocks
        assert any(c.score_band is not None and c.score_band[1] < -200 for c in walk)
        # tokens more than 9 (to 30) below a peak, weighing together as much as it
        assert any(c.far_below_peak is not None and c.far_below_peak[0] > 9
                   and c.far_below_peak[1] >= 30 for c in walk)
        table = kernel_addresses.table_cases()
        assert len({c.max_slots for c in table}) == len({c.num_layers for c in table}) == 2
        assert len({c.max_seq_len for c in table}) == 2 and all(c.layer > 0 for c in table)
        assert all(c.config.MAX_BLOCKS_PER_SEQ != c.num_layers for c in table)
        assert sum(c.max_seq_len % c.block_size != 0 for c in table) == 1   # one rounded up
        # ... one token past whole blocks of 12 or 24 (round(), + 0.9 and shifts are short);
        # the other an odd number of whole blocks (banker's round(k + 0.5) is k + 1)
        assert [c.max_seq_len % c.block_size for c in table
                if c.block_size in shapes.UNEVEN_BLOCK_SIZES and c.max_seq_len % c.block_size]\
            == [1]
        assert [c.config.MAX_BLOCKS_PER_SEQ % 2 for c in table
                if c.max_seq_len % c.block_size == 0] == [1]
        assert len({c.block_size for c in table}) == 2
        assert all(n <= c.max_seq_len for c in table for _, n in c.rows)
        k = kernel_addresses.k_cases()
        assert len({c.head_dim for c in k}) == 2 and len({c.num_kv_heads for c in k}) == 2
        assert len({c.n_q_heads // c.num_kv_heads for c in k}) == 2          # two GQA ratios
        assert all(c.num_kv_heads >= 2 for c in k)          # the KV head a q head reads shows
        assert any(c.num_kv_heads >= 4 for c in k)          # no wrap modulo 2 or 3 passes
        ratios = [c.n_q_heads // c.num_kv_heads for c in k]
        assert any(r & (r - 1) for r in ratios) and max(ratios) >= 4  # no shift, large groups
        store = output_store.cases()
        assert len({c.head_dim for c in store}) == 3
        assert sorted(c.head_dim % 32 == 0 for c in store) == [False, False, True]
        assert max(c.head_dim for c in store) > 96 and max(c.head_dim for c in store) % 32
        assert min(c.head_dim for c in store) < 64          # a narrow partly used last warp
        assert any(c.zero_v_dims for c in store)             # an output that is exactly 0
        assert any(len(c.rows) >= 3 for c in store)         # a row past the first two
        assert any(c.large_v_dims and c.large_v > 65504 for c in store)  # past float16's range
        dims = sorted(c.head_dim for c in score_handoff.cases())
        assert dims[0] == 32 and 64 < dims[1] < 96 and dims[2] > 256     # 1, 3 and 9+ warps
        for c in walk + table + k + store:                   # constants no answer may assume
            assert c.scale is not None and abs(c.softmax_scale * c.head_dim ** 0.5 - 1) > 0.1
            assert c.q_row_stride > c.n_q_heads * c.head_dim


def test_the_store_check_has_outputs_past_float16s_range_and_rows_past_two():
    for _ in range(3):
        store = output_store.cases()
        large = [c for c in store if c.large_v_dims]
        assert len(large) == 1 and f"|V| >= {large[0].large_v:.3g}" in large[0].label
        case = large[0]
        reference = online_softmax.prepare(case).reference
        dims = slice(case.head_dim - case.large_v_dims, None)
        assert float(reference[..., dims].abs().min()) >= case.large_v > 65504
        assert float(reference[..., :dims.start].abs().max()) < 100      # the rest as before
        assert sorted(len(c.rows) for c in store)[-1] in (3, 4)


def _starts_over_after(margin):
    def update(current_max, d, acc, score, v):
        if score > current_max + margin:
            return score, 1.0, v
        new_max = max(current_max, score)
        return (new_max, d * math.exp(current_max - new_max) + math.exp(score - new_max),
                acc * math.exp(current_max - new_max) + math.exp(score - new_max) * v)
    return update


def test_the_jump_probe_refuses_an_update_that_starts_over_at_any_margin_up_to_14():
    from paged_tutorial.teaching.harness.base import Wrong

    def ties_move_the_max(current_max, d, acc, score, v):
        new_max = score if score >= current_max else current_max
        correction, e = math.exp(current_max - new_max), math.exp(score - new_max)
        return new_max, d * correction + e, acc * correction + e * v

    rng = np.random.default_rng()
    for _ in range(5):
        base = float(rng.uniform(-50, 50))
        for margin in (6.0, 10.0, 12.0, 14.0):
            with pytest.raises(Wrong, match="however far the max jumps"):
                online_softmax.check_jump(_starts_over_after(margin), rng, base)
        for right in (online_softmax.article_update, ties_move_the_max):
            online_softmax.check_jump(right, rng, base)


def test_the_wide_softmax_case_overflows_a_double_without_the_running_max():
    wide = online_softmax.cases()[1]
    scores, _ = online_softmax._scores_and_values(online_softmax.prepare(wide))
    assert scores.max() > online_softmax.WIDE_SCORE > math.log(np.finfo(np.float64).max)
    assert scores.max() - scores[0] > online_softmax.RISE


def test_the_long_walk_puts_every_score_far_below_zero():
    """The walk's second launch: every score of every q head and token lies in the drawn band,
    where exp(score) is 0 in float32, so a softmax whose running max starts at 0 (or at any
    value above the scores) is left with d = 0."""
    from paged_tutorial.teaching.harness.kernel_harness import prepare

    for _ in range(3):
        case = block_walk.cases()[1]
        prep = prepare(case)
        keys = prep.cache.buffer.cpu().double().numpy()
        low, high = case.score_band
        for (row, h), trace in prep.traces.items():
            scores = keys[trace.k_index] @ prep.q[row, h].double().numpy() * prep.scale
            assert len(scores) > 8 * case.block_size
            assert low - 1e-2 < scores.min() and scores.max() < high + 1e-2, (low, high)
            assert high - low > 10 and np.all(np.exp(scores.astype(np.float32)) == 0)
        assert f"every score between {low:.0f} and {high:.0f}" in case.label


def test_the_first_walk_launch_puts_every_token_but_one_far_below_it_and_weighing_as_much():
    """The walk's first launch: in every row and q head one token of the first block scores
    the highest and every other token 9.5 to 30 below it, and their V is scaled up so that
    together they move the output by one to three times the peak's V: a walk that leaves out
    tokens some margin below the running max is off by about that much."""
    from paged_tutorial.teaching.harness.kernel_harness import prepare

    for _ in range(3):
        case = block_walk.cases()[0]
        prep = prepare(case)
        low, high = case.far_below_peak
        buffer = prep.cache.buffer.cpu().double().numpy()
        for (row, h), trace in prep.traces.items():
            scores = buffer[trace.k_index] @ prep.q[row, h].double().numpy() * prep.scale
            values = buffer[trace.v_index]
            peak = int(np.argmax(scores))
            gaps = np.delete(scores[peak] - scores, peak)
            assert peak < case.block_size
            assert low - 1e-3 < gaps.min() and gaps.max() < high + 1e-3, (low, high)
            far = np.delete(np.exp(scores - scores[peak])[:, None] * values, peak, axis=0)
            together = far.sum(axis=0) / -values[peak]
            assert np.allclose(together, together[0]) and 1.0 <= together[0] <= 3.0
        assert f"{low:g}-{high:g} above the rest" in case.label


def _allocator(cls, num_layers=2, blocks=6):
    config = CacheConfig(num_layers=num_layers, num_kv_heads=1, head_dim=8, dtype="float32",
                         kv_cache_bytes=blocks * 2 * 16 * 8 * 4, max_slots=2, max_seq_len=64)
    return PagedKVCache(config, "cpu", allocator=cls).allocator


def test_allocator_base_gives_no_block_moves_to_inherit():
    class Empty(allocator.AllocatorBase):
        pass
    alloc = _allocator(Empty)
    with pytest.raises(NotImplementedError, match="write ensure_capacity"):
        alloc.ensure_capacity(0, 5)
    with pytest.raises(NotImplementedError, match="write release"):
        alloc.release(0)
    assert not issubclass(allocator.AllocatorBase, allocator.FreeListAllocator)
    assert alloc.num_free == 6 and alloc.can_grow(0, 16)     # the accounting is there


def test_a_refused_call_must_change_nothing_the_allocator_holds():
    from helpers.wrong_allocators import ArticleAllocator
    from paged_tutorial.teaching.harness.base import Wrong

    class CountsRefusals(ArticleAllocator):
        """Right table and free list, but a refused call still bumps its own counter."""
        refused = 0

        def ensure_capacity(self, slot, new_len):
            try:
                super().ensure_capacity(slot, new_len)
            except CacheFullError:
                self.refused += 1
                raise
    assert "needs" in allocator.probe_full(ArticleAllocator)
    with pytest.raises(Wrong, match="change nothing"):
        allocator.probe_full(CountsRefusals)


def test_shape_labels_can_rebuild_a_case():
    rng = np.random.default_rng(0)
    case = shapes.case(rng, 0, head_dim=40, gqa=(1, 3), lens=[20, 5], num_layers=3)
    again = shapes.case(np.random.default_rng(0), 0, head_dim=40, gqa=(1, 3), lens=[20, 5],
                        num_layers=3)
    assert case == again and case.n_q_heads == 3 and case.rows == ((1, 20), (0, 5))


def test_idle_threads_that_leave_the_buffer_are_named_not_reported_as_a_crash(monkeypatch):
    """At this draw (head_dim 24: threads 24-31 own no dimension) a walk that lets them read
    runs past the cache's end on the last token; the verdict still names the idle reads."""
    from helpers.kernel_bodies import WRONG_BODIES
    from paged_tutorial.teaching import exercises as ex

    seed = 574544877
    monkeypatch.setattr(shapes, "fresh_rng", lambda: (np.random.default_rng(seed), seed))
    fn = WRONG_BODIES["03.walk_blocks"]["owns_dim ignored: threads past head_dim read too"][0]
    verdict = ex.grade("03.walk_blocks", fn)
    assert verdict.status == "wrong"
    assert "head_dim 24" in verdict.message and "own no dimension" in verdict.message
    assert "IndexError" not in verdict.message
    if access_log.AVAILABLE:          # the simulator logs the reads: the idle ones are named
        assert re.search(r"thread (2[4-9]|3[01]) read element", verdict.message)
    else:                             # a GPU logs none (idle reads there return NaN)
        assert "The reads were the article's" not in verdict.message


def test_without_a_read_log_a_wrong_output_does_not_claim_the_reads_were_right(monkeypatch):
    """On a GPU no access is logged: a NaN output is reported with what to check, the idle
    threads of a partly used warp named, never as 'the reads were the article's'."""
    import torch

    from helpers.kernel_bodies import WRONG_BODIES
    from paged_tutorial.teaching import exercises as ex
    from paged_tutorial.teaching.harness.kernel_harness import BodyRun

    seed = 574544877
    monkeypatch.setattr(shapes, "fresh_rng", lambda: (np.random.default_rng(seed), seed))
    monkeypatch.setattr(block_walk, "run_body", lambda prep, parts: BodyRun(
        torch.full_like(prep.reference, float("nan")), None, None, [(0, 0)], None))
    fn = WRONG_BODIES["03.walk_blocks"]["owns_dim ignored: threads past head_dim read too"][0]
    message = ex.grade("03.walk_blocks", fn).message
    assert "NaN" in message and "A GPU logs no reads" in message
    assert "threads 24-31 own no dimension" in message
    assert "The reads were the article's" not in message


def test_on_a_gpu_the_store_puzzle_reads_what_the_stores_left(monkeypatch):
    """Without the simulator's log (a GPU), write_output is graded by what its stores left in
    q: a store in the padding between rows, an element still holding its q, the output; the
    verdict that passes says which checks only the simulator makes."""
    import paged_tutorial.teaching.exercises as ex
    from helpers.clever_answers import CLEVER

    monkeypatch.setattr(access_log, "AVAILABLE", False)
    answers = CLEVER["05.write_output"]
    # (the simulator stops a store past the end of the kernel's flat view of q, which on a
    # GPU lands in the warp's width of NaN after the last row)
    for what, texts in [("guard open for head_dims past 96", ("in the padding between rows",
                                                              "is out of bounds")),
                        ("idle lanes taken as HEAD_DIM % 32", ("0 time(s)",)),
                        ("store guarded by acc != 0", ("still holds the q value",)),
                        ("row stride right for two rows only", ("(row 2, q head",)),
                        ("output kept within float16's range", ("whatever its value",))]:
        verdict = ex.grade("05.write_output", answers[what][0])
        assert verdict.status == "wrong", (what, verdict.message)
        assert any(text in verdict.message for text in texts), (what, verdict.message)
    import sys

    worked = ex.reveal("05.write_output")
    space = {**vars(sys.modules[worked.code.__module__]), "__name__": "her_cell"}
    exec(compile(worked.source, "<her cell>", "exec"), space)
    verdict = ex.grade("05.write_output", space[worked.code.__name__])
    assert verdict.ok and "in the simulator only" in verdict.message, verdict.message
