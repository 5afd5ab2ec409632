"""``docs/puzzles.md`` is generated from the code and the tests, so it cannot drift: per puzzle,
what each check draws (the docstring of the function that draws it, and where the grader runs
the answer), the wrong answers the tests reject (by test name) and how many lines the worked
solution's body takes.  When this test fails, regenerate the page:

    PYTHONPATH=. python tests/teaching/test_puzzles_doc.py
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import sys
import textwrap

HERE = pathlib.Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from paged_tutorial.teaching.exercises import solutions  # noqa: E402
from paged_tutorial.teaching.chapters import PUZZLES
from paged_tutorial.teaching.chapters.ch06_block_lifetime import allocator, table_sync
from paged_tutorial.teaching.chapters.ch01_block_layout import block_layout
from paged_tutorial.teaching.chapters.ch02_block_table import block_table, kernel_addresses
from paged_tutorial.teaching.chapters.ch03_address_arithmetic import block_walk
from paged_tutorial.teaching.chapters.ch05_online_softmax import online_softmax, output_store
from paged_tutorial.teaching.chapters.ch09_prefix_sharing import prefix_sharing
from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction import score_handoff

DOC = HERE.parents[2] / "docs" / "puzzles.md"

#: puzzle -> the function that draws what one check runs
DRAWS = {
    "01.kv_offset": block_layout.shapes_to_run,
    "02.locate": block_table.draw_run,
    "02.table_index": kernel_addresses.table_cases,
    "03.k_index": kernel_addresses.k_cases,
    "03.walk_blocks": block_walk.cases,
    "04.token_score": score_handoff.cases,
    "05.softmax_update": online_softmax.cases,
    "05.write_output": output_store.cases,
    "06.allocator": allocator.draw_scenario,
    "06.table_sync": table_sync.draw_scenario,
    "09.can_share": prefix_sharing.draw_scenarios,
}

#: tests beside test_wrong_answer_fails that reject answers to one puzzle: test file -> names
NAMED_TESTS = {
    "01.kv_offset": [
        "test_clever_wrong_answers.py::test_kv_offset_right_only_for_the_chapters_bf16_shape_is_"
        "refused",
        "test_clever_wrong_answers.py::test_an_offset_remembered_across_layouts_of_one_dtype_is_"
        "refused"],
    "02.locate": [
        "test_clever_wrong_answers.py::test_locate_folding_slots_or_layers_onto_the_old_counts_"
        "is_refused",
        "test_clever_wrong_answers.py::test_locate_remembering_blocks_of_a_reused_slot_is_refused"],
    "03.walk_blocks": [],
    "04.token_score": [
        "test_clever_wrong_answers.py::test_token_score_draws_a_head_past_eight_warps_every_check",
        "test_clever_wrong_answers.py::test_token_score_verdict_names_the_mistake_made"],
    "05.softmax_update": [
        "test_puzzle_shapes.py::test_the_wide_softmax_case_overflows_a_double_without_the_"
        "running_max",
        "test_puzzle_shapes.py::test_the_jump_probe_refuses_an_update_that_starts_over_at_any_"
        "margin_up_to_14"],
    "06.allocator": [
        "test_puzzle_shapes.py::test_allocator_base_gives_no_block_moves_to_inherit",
        "test_puzzle_shapes.py::test_a_refused_call_must_change_nothing_the_allocator_holds",
        "test_drawn_scenarios.py::test_allocator_draws_a_stream_that_runs_short_of_blocks_but_"
        "not_out",
        "test_drawn_scenarios.py::test_an_allocator_hard_coded_to_the_old_run_names_the_drawn_"
        "layout"],
    "06.table_sync": [
        "test_clever_wrong_answers.py::test_table_sync_sending_ids_in_16_bits_is_refused_naming_"
        "the_cut",
        "test_drawn_scenarios.py::test_a_table_sync_that_replays_the_entries_one_check_copied_"
        "is_refused"],
    "09.can_share": [
        "test_puzzles.py::test_can_share_tells_tokens_only_from_tokens_and_parent",
        "test_puzzles.py::test_can_share_that_compares_nothing_is_not_said_to_compare_the_"
        "tokens",
        "test_drawn_scenarios.py::test_a_share_rule_that_remembers_one_checks_chains_is_"
        "refused"],
}
#: tests that hold for every puzzle
EVERY_PUZZLE = [
    "test_learner_tools.py::test_an_answer_calling_the_engines_kernels_or_the_worked_"
    "solutions_is_refused",
    "test_learner_tools.py::test_an_answer_that_exits_is_refused_on_every_puzzle",
    "test_learner_tools_properties.py::test_a_hostile_answer_to_any_puzzle_gets_a_verdict",
    "test_learner_tools_properties.py::test_any_value_as_an_answer_gets_a_verdict",
    "test_puzzles.py::test_stub_is_not_solved_and_signature_is_checked",
]


def body_lines(obj) -> int:
    """Lines of code in the body of a function (or of every method of a class), without its
    docstring, comments and blank lines."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    lines = set()
    for fn in functions:
        body = fn.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        for statement in body:
            for node in ast.walk(statement):
                if hasattr(node, "lineno") and not isinstance(node, ast.FunctionDef):
                    lines.update(range(node.lineno, getattr(node, "end_lineno", node.lineno) + 1))
    source = textwrap.dedent(inspect.getsource(obj)).splitlines()
    return sum(1 for n in lines if source[n - 1].strip() and
               not source[n - 1].strip().startswith("#"))


def wrong_answers(name: str) -> list[str]:
    from test_puzzles import WRONG
    return list(WRONG[name])


def clever_answers(name: str) -> list[str]:
    from helpers.clever_answers import CLEVER
    return list(CLEVER.get(name, {}))


MUTATION_REPORT = HERE.parents[1] / "mutation" / "report.json"


def mutation_line(name: str) -> str:
    """Mutants made / refused / equivalent / holes for ``name``, from the committed report."""
    import json

    report = json.loads(MUTATION_REPORT.read_text()) if MUTATION_REPORT.exists() else {}
    row = report.get("puzzles", {}).get(name)
    if row is None:
        return "- **Mutants of the worked solution:** not in the report yet"
    holes = row["hole"] + row["unlisted"]
    return (f"- **Mutants of the worked solution** (`python -m tests.mutation`, "
            f"{report.get('date', '?')}): {row['made']} made, {row['refused']} refused by the "
            f"check, {row['equivalent']} equivalent (listed with reasons in "
            f"`tests/mutation/equivalent.json`), {holes} hole(s)")


def render() -> str:
    out = [
        "# The puzzles: what each check runs, what it rejects",
        "",
        "Generated from the code and the tests by `tests/teaching/test_puzzles_doc.py` (which "
        "fails when this page",
        "is out of date; `PYTHONPATH=. python tests/teaching/test_puzzles_doc.py` rewrites it).",
        "",
        "Every check draws its shapes or scenarios afresh from a seed taken from `os.urandom` "
        "(`harness/shapes.py`);",
        "a wrong verdict names what it ran and the seed.  Rejected answers are tests in "
        "`tests/teaching/`: the",
        "classic mistakes and the hard-coded, half-done and shortcut answers are ids of "
        "`test_puzzles.py::test_wrong_answer_fails`.",
        "For every puzzle, also: " + ", ".join(f"`{t}`" for t in EVERY_PUZZLE) + ".",
        "",
        "\"Lines\" counts the statements' lines in the worked solution's body (no docstring, "
        "comment or blank line):",
        "what a right answer takes.",
        "",
        "Mutants: `python -m tests.mutation` makes every mutant of each worked solution (a named "
        "constant replaced by",
        "today's value or a neighbour, an operator or comparison swapped, an index term dropped, "
        "arguments swapped,",
        "a loop bound moved by one, a statement or a barrier deleted, a shuffle offset changed, "
        "min/max swapped),",
        "grades each with the puzzle's check, and runs every one the check passes through a deep "
        "oracle (`tests/mutation/deep.py`:",
        "BLOCK_SIZE 8/16/32, up to eleven blocks, head_dims of four and five warps, GQA 5 and 7, "
        "strided q rows, drawn",
        "scales, scores spanning +-1000 or all far below 0, regrading on fresh draws).  A mutant "
        "the check passes and the oracle refuses is a hole.",
        "",
        "On a GPU the kernel's parts run compiled: a check there sees the outputs and where the "
        "stores landed",
        "(q's padding and one warp's width after it hold NaN), not who read or wrote what.  The "
        "reads, races,",
        "barriers and shuffle masks are recorded in the simulator only, and a verdict that passes "
        "on a GPU says so",
        "(\"... checked in the simulator only: grade it on a CPU\").  The mutation report is made "
        "in the simulator.",
        "",
    ]
    for p in PUZZLES:
        draw = inspect.getdoc(DRAWS[p.name]) or ""
        lines = body_lines(solutions.solution_of(p.name))
        out += [f"## {p.name}: {p.title.en}", "",
                f"- **Runs in:** {p.runs_in.en} (replaces `{p.article}`).",
                f"- **Drawn for each check** (`{DRAWS[p.name].__module__.split('.')[-1]}."
                f"{DRAWS[p.name].__name__}`): " + " ".join(draw.split()),
                f"- **Lines in a right answer:** {lines}",
                "- **Wrong answers rejected** (`test_wrong_answer_fails[{0}-...]`):".format(
                    p.name)]
        out += [f"  - {what}" for what in wrong_answers(p.name)]
        for test in NAMED_TESTS.get(p.name, []):
            out.append(f"  - `{test}`")
        clever = clever_answers(p.name)
        if clever:
            out.append("- **Clever wrong answers rejected** (`test_clever_wrong_answers.py::"
                       f"test_clever_wrong_answer_is_refused[{p.name}-...]`):")
            out += [f"  - {what}" for what in clever]
        out.append(mutation_line(p.name))
        out.append("")
    return "\n".join(out)


def test_every_registered_puzzle_has_a_section_and_a_draw():
    assert sorted(DRAWS) == sorted(p.name for p in PUZZLES)
    for p in PUZZLES:
        assert f"## {p.name}:" in DOC.read_text(encoding="utf-8")


def test_named_tests_exist():
    for test in [t for ts in NAMED_TESTS.values() for t in ts] + EVERY_PUZZLE:
        file, name = test.split("::")
        assert f"def {name}(" in (HERE.parent / file).read_text(encoding="utf-8"), test


def test_the_page_is_current():
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/puzzles.md is out of date: run PYTHONPATH=. python tests/teaching/"
        "test_puzzles_doc.py")


if __name__ == "__main__":
    DOC.write_text(render(), encoding="utf-8")
    print(f"wrote {DOC}")
