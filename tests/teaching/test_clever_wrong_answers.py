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
