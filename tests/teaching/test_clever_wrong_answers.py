"""Every family of clever wrong answer is refused: a named constant replaced by today's value,
state kept across calls, reductions and guards hard-coded to what a check draws, approximations
that ride the tolerance, work done behind the engine's back, and the sharing rule's shortcuts
(``helpers/clever_answers.py``).  Each verdict must say what went wrong."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import paged_tutorial.teaching.exercises as ex  # noqa: E402
from helpers.clever_answers import CLEVER  # noqa: E402

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
