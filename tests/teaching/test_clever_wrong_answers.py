"""Every family of clever wrong answer is refused: a named constant replaced by today's value,
state kept across calls, reductions and guards hard-coded to what a check draws, approximations
that ride the tolerance, work done behind the engine's back, and the sharing rule's shortcuts
(``helpers/clever_answers.py``).  Each verdict must say what went wrong."""

from __future__ import annotations

import matplotlib
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
