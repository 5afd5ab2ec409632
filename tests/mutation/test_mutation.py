"""The graders, measured by mutants of the worked solutions (``python -m tests.mutation`` runs
them all; here a seeded sample per puzzle, and the checks that keep the committed list of
equivalent mutants and the committed report honest)."""

from __future__ import annotations

import json

import matplotlib
import pytest

matplotlib.use("Agg")

from helpers.on_this_device import RECORDED, SIMULATOR_ONLY  # noqa: E402
from tests.mutation.operators import mutants  # noqa: E402
from tests.mutation.run import (EQUIVALENT_FILE, REPORT_FILE, equivalent_list, grade,  # noqa: E402
                                mutants_of, sample)
from tests.mutation.targets import TARGETS  # noqa: E402

#: mutants graded per puzzle in the test suite (the whole set: ``python -m tests.mutation``)
SAMPLE_PER_PUZZLE = 3
#: the sample's seed: the same mutants every run, so a failure is reproducible
SAMPLE_SEED = 39


@pytest.mark.parametrize("puzzle", sorted(TARGETS))
def test_a_seeded_sample_of_mutants_is_refused_by_the_check(puzzle):
    listed = equivalent_list().get(puzzle, {})
    picked = [m for m in sample(puzzle, SAMPLE_PER_PUZZLE + len(listed), SAMPLE_SEED)
              if m.key not in listed][:SAMPLE_PER_PUZZLE]
    assert picked
    for mutant in picked:
        answer, verdict = grade(puzzle, mutant)
        if answer is None:
            continue
        if not RECORDED and verdict.status == "correct":
            # a GPU grades outputs and store places: a mutant whose only fault is a read, a
            # race or a mask passes there, and the verdict says what was not checked
            assert SIMULATOR_ONLY in verdict.message, verdict.message
            continue
        assert verdict.status != "correct", (
            f"{puzzle}: the check passed the mutant {mutant.key} (not listed as equivalent):\n"
            f"{mutant.source}")


def test_every_listed_equivalent_mutant_exists_and_passes_the_deep_oracle():
    listed = equivalent_list()
    assert set(listed) <= set(TARGETS)
    for puzzle, entries in listed.items():
        made = {m.key: m for m in mutants_of(puzzle)}
        for key, reason in entries.items():
            assert key in made, f"{puzzle}: the listed mutant {key} is no longer made"
            assert len(reason) > 20, f"{puzzle}: {key} needs a reason"
            target = TARGETS[puzzle]
            problem = target.deep_oracle(target.build(made[key].source))
            assert problem is None, f"{puzzle}: {key} is listed as equivalent, yet {problem}"


def test_the_committed_report_covers_every_puzzle_with_no_hole():
    report = json.loads(REPORT_FILE.read_text())
    listed = equivalent_list()
    for puzzle in TARGETS:
        row = report["puzzles"][puzzle]
        assert row["made"] == len(mutants_of(puzzle)), (
            f"{puzzle}: the report is older than the worked solution: run python -m "
            "tests.mutation " + puzzle)
        assert row["hole"] == 0 and row["unlisted"] == 0, (puzzle, row["holes_found"],
                                                           row["passing_both"])
        assert sorted(row["passing_both"]) == sorted(listed.get(puzzle, {})), puzzle
        assert row["refused"] + row["equivalent"] == row["made"]


def test_the_operators_make_the_mutants_the_puzzles_need():
    source = """
def part(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 16)
    if thread_id == 0:
        score[0] = min(qk, dot_products[thread_id // WARP_SIZE]) * scale
    cuda.syncthreads()
    for w in range(NUM_WARPS):
        qk += dot_products[w] + BLOCK_SIZE
    return score[0]
"""
    made = mutants(source)
    operators = {m.operator for m in made}
    assert {"barrier", "delete", "constant", "literal", "binop", "compare", "drop_term",
            "swap_args", "range", "minmax"} <= operators
    descriptions = [m.description for m in made]
    assert "BLOCK_SIZE -> 16" in descriptions and "WARP_SIZE -> 32" in descriptions
    assert "16 -> 8" in descriptions and "16 -> 32" in descriptions     # shuffle offsets
    assert len({m.key for m in made}) == len(made)
    assert EQUIVALENT_FILE.exists()
