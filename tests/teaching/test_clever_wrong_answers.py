"""Every family of clever wrong answer is refused: a named constant replaced by today's value,
state kept across calls, reductions and guards hard-coded to what a check draws, approximations
that ride the tolerance, work done behind the engine's back, and the sharing rule's shortcuts
(``helpers/clever_answers.py``).  Each verdict must say what went wrong."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import paged_tutorial.teaching.exercises as ex  # noqa: E402
from helpers.clever_answers import CLEVER  # noqa: E402
from helpers.on_this_device import RECORDED, SIMULATOR_ONLY, expected  # noqa: E402

CASES = [(name, what) for name, answers in CLEVER.items() for what in answers]


@pytest.mark.parametrize("name,what", CASES, ids=[f"{n}-{w}" for n, w in CASES])
def test_clever_wrong_answer_is_refused(name, what):
    answer, text = CLEVER[name][what]
    verdict = ex.grade(name, answer)
    assert verdict.status == "wrong", verdict.message
    assert text in verdict.message, verdict.message


def test_state_and_reaching_around_are_named_before_the_answer_runs():
    import functools

    from paged_tutorial.teaching.exercises.solutions import solution_of
    from paged_tutorial.teaching.chapters import PUZZLES
    from paged_tutorial.teaching.harness import kept_state

    for p in PUZZLES:                       # every worked solution computes from its arguments
        assert kept_state.refusal(solution_of(p.name)) is None, p.name
    counter = 0

    def assigns_a_global(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
        global COUNTER
        COUNTER = slot
        return slot

    @functools.lru_cache(maxsize=None)
    def memoized(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
        return slot

    def mutable_default(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE, *,
                        seen=[]):          # noqa: B006
        return slot

    def frames(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
        import inspect
        return inspect.currentframe().f_back.f_locals["want"]

    def dunder_by_name(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
        return getattr(object, "__subclasses__")()

    def closure_list(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
        return len(calls) + counter

    def memo_on_a_module(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
        import math
        try:
            memo = math._table_memo
        except AttributeError:
            memo = {}
            math._table_memo = memo
        return memo.setdefault(slot, slot)

    def private_module_attribute(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
        return np._parked.get(slot, slot)

    calls: list = []
    expected = {assigns_a_global: "global COUNTER", memoized: "memoized",
                mutable_default: "default argument", frames: "imports inspect",
                dunder_by_name: "'__subclasses__'", closure_list: "`calls` (a list)",
                memo_on_a_module: "`math._table_memo`",
                private_module_attribute: "`np._parked`"}
    for answer, text in expected.items():
        message = kept_state.refusal(answer)
        assert message is not None and text in message, (answer.__name__, message)


def can_share_chains_by_content(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    """The chains compared by their tokens all the way to the first block, not the parent by
    identity: right on every record the cache can hold (two records that hold the same tokens
    from the start have one key, so they are one record)."""
    if (logical_block + 1) * BLOCK_SIZE >= n_tokens or tuple(found.tokens) != tuple(tokens):
        return False
    a, b = found.parent, previous
    while a is not None and b is not None:
        if a is not b and tuple(a.tokens) != tuple(b.tokens):
            return False
        a, b = a.parent, b.parent
    return a is None and b is None


def test_a_sharing_rule_that_compares_the_chains_by_content_is_right():
    for _ in range(3):                   # the probe and the scenarios are drawn afresh
        verdict = ex.grade("09.can_share", can_share_chains_by_content)
        assert verdict.status == "correct", verdict.message


def test_a_walk_may_call_a_table_index_of_her_own_under_the_parts_name():
    """Her 02.table_index answer, defined in her namespace as block_table_index (with its own
    signature), is the one her walk calls: the build does not swap in the engine's."""
    source = '''
def block_table_index(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
    row = (MAX_SEQ_LEN + BLOCK_SIZE - 1) // BLOCK_SIZE
    return slot * N_LAYERS * row + layer * row + logical_block


def walk_blocks(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id, owns_dim,
                q_val, scale, dot_products, score):
    current_max, d, acc = float32(-math.inf), float32(0.0), float32(0.0)
    for lb in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        block = block_table[block_table_index(slot, layer, lb, N_LAYERS,
                                              MAX_BLOCKS_PER_SEQ * BLOCK_SIZE, BLOCK_SIZE)]
        for token in range(min(seq_len - lb * BLOCK_SIZE, BLOCK_SIZE)):
            k_elem = block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM + thread_id
            k = float32(0.0)
            v = float32(0.0)
            if owns_dim:
                k = load(kv_cache, k_elem)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            if owns_dim:
                v = load(kv_cache, k_elem + V_OFFSET_ELEMS)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc
'''
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<her notebook>", "exec"), namespace)
    verdict = ex.grade("03.walk_blocks", namespace["walk_blocks"])
    assert verdict.status == "correct", verdict.message


# --- guards and memos tuned to shapes a check once never varied -----------------------------

def _kv_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM, ITEMSIZE):
    offset = (token_in_block * KV_DIM + kv_head * HEAD_DIM + dim) * ITEMSIZE
    return offset + (BLOCK_SIZE * KV_DIM * ITEMSIZE if is_value else 0)


def test_kv_offset_right_only_for_the_chapters_bf16_shape_is_refused():
    def itemsize_from_head_dim(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM,
                               HEAD_DIM, ITEMSIZE):
        return _kv_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                          2 if HEAD_DIM == 8 else 4)

    def chapter_kv_dim_for_bf16(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM,
                                HEAD_DIM, ITEMSIZE):
        if ITEMSIZE == 2:
            KV_DIM, HEAD_DIM = 16, 8
        return _kv_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                          ITEMSIZE)

    for answer in (itemsize_from_head_dim, chapter_kv_dim_for_bf16):
        verdict = ex.grade("01.kv_offset", answer)
        assert verdict.status == "wrong", verdict.message
        assert "[bfloat16" in verdict.message and "KV head(s) x" in verdict.message


class _KvOffsetMemo:
    """Offsets remembered by element and ITEMSIZE, not by layout, on a callable object."""

    def __init__(self):
        self.seen = {}

    def __call__(self, token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                 ITEMSIZE):
        return self.seen.setdefault((token_in_block, kv_head, dim, is_value, ITEMSIZE),
                                    _kv_offset(token_in_block, kv_head, dim, is_value,
                                               BLOCK_SIZE, KV_DIM, HEAD_DIM, ITEMSIZE))


class _LocateMemo:
    """Physical blocks remembered by (slot, layer, logical block), on a callable object."""

    def __init__(self):
        self.seen = {}

    def __call__(self, block_table, slot, layer, position, BLOCK_SIZE):
        key = (slot, layer, position // BLOCK_SIZE)
        return self.seen.setdefault(key, int(block_table[key])), position % BLOCK_SIZE


def _refused_for_staleness(verdict, effect: str) -> bool:
    """A remembered answer is wrong either for the stale value it returns (``effect``) or,
    where the scan sees the state, for keeping it."""
    return verdict.status == "wrong" and (effect in verdict.message
                                          or "keeps state between calls" in verdict.message)


def test_an_offset_remembered_across_layouts_of_one_dtype_is_refused():
    verdict = ex.grade("01.kv_offset", _KvOffsetMemo())
    assert any(_refused_for_staleness(verdict, text)
               for text in ("reads it at byte", "overlap", "outside its")), verdict.message


def _locate(block_table, slot, layer, position, BLOCK_SIZE):
    return int(block_table[slot, layer, position // BLOCK_SIZE]), position % BLOCK_SIZE


def test_locate_folding_slots_or_layers_onto_the_old_counts_is_refused():
    def slot_mod_2(block_table, slot, layer, position, BLOCK_SIZE):
        return _locate(block_table, slot % 2, layer, position, BLOCK_SIZE)

    def layer_mod_4(block_table, slot, layer, position, BLOCK_SIZE):
        return _locate(block_table, slot, layer % 4, position, BLOCK_SIZE)

    for answer in (slot_mod_2, layer_mod_4):
        verdict = ex.grade("02.locate", answer)
        assert verdict.status == "wrong", verdict.message
        assert "slots x" in verdict.message, verdict.message


def test_locate_remembering_blocks_of_a_reused_slot_is_refused():
    verdict = ex.grade("02.locate", _LocateMemo())
    assert _refused_for_staleness(verdict, "the decode kernel looks for it in block_table"), \
        verdict.message


def test_table_sync_sending_ids_in_16_bits_is_refused_naming_the_cut():
    def as_int16(host_table, device_table, changed):
        for i in changed:
            device_table[i] = int(np.int16(host_table[i]))

    def as_uint16(host_table, device_table, changed):
        for i in changed:
            device_table[i] = int(np.uint16(host_table[i]))

    for answer in (as_int16, as_uint16):
        verdict = ex.grade("06.table_sync", answer)
        assert verdict.status == "wrong", verdict.message
        assert "cut to 16 bits" in verdict.message, verdict.message


# --- 04.token_score: wide heads, and a verdict that names the mistake --------------------------
# flake8: noqa: F821  (kernel parts' names are bound by attention.compile_parts)

def score_eight_warps_at_most(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(min(NUM_WARPS, 8)):
            total += dot_products[w]
        score[0] = total * scale
    cuda.syncthreads()
    return score[0]


def score_own_sqrt(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total / math.sqrt(HEAD_DIM)
    cuda.syncthreads()
    return score[0]


def score_added_into_the_cell(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id == 0:
        score[0] += qk * scale
    cuda.syncthreads()
    s = score[0]
    cuda.syncthreads()
    return s


def _bar():
    cuda.syncthreads()


def score_barrier_in_both_branches(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total * scale
        _bar()
    else:
        _bar()
    return score[0]


def _one_warp_case(head_dim=32):
    from paged_tutorial.teaching.harness import shapes

    rng, seed = shapes.fresh_rng()
    return shapes.case(rng, seed, head_dim=head_dim, gqa=(1, 1), lens=[4], max_slots=1,
                       slots=[0], **shapes.drawn_constants(rng, head_dim))


def test_token_score_draws_a_head_past_eight_warps_every_check():
    from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction import score_handoff

    for _ in range(10):
        assert max(c.head_dim for c in score_handoff.cases()) > 256
    verdict = ex.grade("04.token_score", score_eight_warps_at_most)
    assert verdict.status == "wrong", verdict.message
    assert expected("thread 0 combined dot_products[0, 1, 2, 3, 4, 5, 6, 7]",
                    "differ from the torch oracle") in verdict.message, verdict.message


@pytest.mark.parametrize("answer,text,not_text", [
    (score_own_sqrt, "does not follow `scale`", "shuffle tree"),
    (score_added_into_the_cell, "read score[0] (line", "shuffle tree"),
    (score_barrier_in_both_branches, "called from", None)])
def test_token_score_verdict_names_the_mistake_made(answer, text, not_text):
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction import score_handoff

    verdict = score_handoff.run_parts(attention.ARTICLE_PARTS.replace(token_score=answer),
                                      _one_warp_case())
    if not RECORDED and answer is score_barrier_in_both_branches:
        # a barrier in both branches runs on a GPU of this age; the verdict says that only
        # the simulator checks barriers
        assert verdict.status == "correct" and SIMULATOR_ONLY in verdict.message, verdict.message
        return
    assert verdict.status == "wrong", verdict.message
    assert expected(text, "differ from the torch oracle") in verdict.message, verdict.message
    assert not_text is None or not_text not in verdict.message, verdict.message
