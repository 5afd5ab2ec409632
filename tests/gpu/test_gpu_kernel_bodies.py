"""The kernel's body parts written as a reader writes them (puzzles 03.walk_blocks,
04.token_score, 05.write_output), on a GPU (marker ``gpu``): ``compile_parts`` compiles a
notebook-style function (no imports; cuda, float32, load, store and the constants bound by the
factory) for the real target, the worked solutions grade correct there, and the wrong answers
that stay inside memory on a GPU grade wrong by their output alone (the access and shared-memory
logs exist only in the simulator; a barrier in a divergent branch and a store past q are left
out: on a GPU they hang the block or fault the context)."""

from __future__ import annotations

import pytest

import paged_tutorial.teaching.exercises as ex
from helpers.kernel_bodies import WRONG_BODIES

pytestmark = pytest.mark.gpu

SAFE_ON_A_GPU = {
    "03.walk_blocks": ("wrong table index (slot and layer strides swapped)",
                       "every block read as full"),
    "04.token_score": ("a shuffle offset sequence that skips 4", "the scale never applied"),
    "05.write_output": ("acc not divided by d",),
}


@pytest.mark.parametrize("name", sorted(SAFE_ON_A_GPU))
def test_worked_solution_grades_correct_on_the_gpu(name):
    verdict = ex.grade(name, ex.reveal(name))
    assert verdict.status == "correct", verdict.message


@pytest.mark.parametrize("name,what", [(n, w) for n, ws in SAFE_ON_A_GPU.items() for w in ws])
def test_wrong_body_grades_wrong_on_the_gpu(name, what):
    fn, _ = WRONG_BODIES[name][what]
    verdict = ex.grade(name, fn)
    assert verdict.status == "wrong", verdict.message
    assert "torch oracle" in verdict.message
