"""Nothing on the page is what she is about to write: no notebook's markdown or stored output,
and no puzzle's docstring or hint (English or Korean), holds a line of a puzzle's worked
solution (spacing, comments and the case of names ignored: ``answer_lines``); before the cell
that checks her answer, no notebook's markdown, output or code holds a shape of it (the same
formula with other names or constants, ``answer_shapes``) or names the engine function it is;
no hint states a formula; and no notebook shows an exercise's expected value before the cell
that checks her answer."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.answer_lines import found_in, puzzle_answer_lines
from paged_tutorial.teaching.answer_shapes import Shape, formulas_in, gives_away, shapes_in, \
    shapes_of
from paged_tutorial.teaching.exercises.registry import Exercise
from paged_tutorial.teaching.language import pinned
from paged_tutorial.teaching.chapters import PUZZLES

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))

#: (exercise, how the value is written) that the page may show before the check, and why
ALLOWED_VALUES = {
    # Llama-3.2-1B's K and V of one token over its 16 layers take as many bytes as one block of
    # 16 tokens in one layer: 00 prints BLOCK_BYTES, the article's constant, before the question
    ("00.kv_bytes_per_token", "32768"),
}
#: values this small are everywhere on a page (a head_dim, a layer count, a block number): not
#: scanned (a heading or a sentence that gives one away is fixed by hand)
SMALLEST_SCANNED = 100
#: (puzzle, reduced line) a page may show, and why
ALLOWED_LINES = {
    # the one-thread-writes idiom and the running max's start, taught in 03's primer on
    # threads and barriers and in 05's reading of kernels.cu:473-476; the puzzles ask for the
    # whole hand-off and the whole walk around them
    ("04.token_score", "if thread_id == 0 :"),
    ("03.walk_blocks", "float32 ( - math . inf )"),
    # the article's own publish line (kernels.cu:494-502), which 04's and 05's race reports must
    # name as one side of the race the puzzle asks her to remove
    ("04.token_score", "dot_products [ thread_id // warp_size ] = qk"),
}


#: (puzzle, shape) a page may show before she answers, and why
ALLOWED_SHAPES = {
    # a thread's warp and lane, taught in 03's primer on threads and warps and named in 04's
    # race reports (the article's publish line, kernels.cu:494-502); the puzzle asks for the
    # hand-off around them
    ("04.token_score", Shape("division", ("//", "thread_id"))),
    ("04.token_score", Shape("division", ("%", "thread_id"))),
}


def _texts(cell) -> list[str]:
    """A cell's markdown, or its stored outputs as text."""
    if cell["cell_type"] == "markdown":
        return ["".join(cell["source"])]
    out = []
    for output in cell.get("outputs", []):
        if "text" in output:
            out.append("".join(output["text"]))
        plain = output.get("data", {}).get("text/plain")
        if plain:
            out.append("".join(plain))
    return out


def _notebook(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


@pytest.fixture(scope="module")
def answers():
    return {name: {line for line in lines if (name, line) not in ALLOWED_LINES}
            for name, lines in puzzle_answer_lines().items()}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_shows_a_worked_solutions_line(path, answers):
    leaks = []
    for number, cell in enumerate(_notebook(path)):
        for text in _texts(cell):
            for name, lines in answers.items():
                leaks += [(number, name, line) for line in found_in(text, lines)]
    assert not leaks, "\n".join(f"cell {n}: {name}: {line}" for n, name, line in leaks)


@pytest.fixture(scope="module")
def shapes():
    return {p.name: {s for s in shapes_of(ex.reveal(p.name).source)
                     if (p.name, s) not in ALLOWED_SHAPES} for p in PUZZLES}


def _chapter(name: str) -> str:
    return name.split(".")[0].split("_")[0]


def _before_she_answers(path: Path, puzzle: str) -> list[tuple[int, str, bool]]:
    """(cell number, text, whether it is code) of every cell of ``path`` she reads before the
    cell that checks ``puzzle``: all of an earlier chapter's notebook, none of a later one's."""
    if _chapter(path.stem) > _chapter(puzzle):
        return []
    cells = _notebook(path)
    checked = next((i for i, c in enumerate(cells)
                    if f'exercises.check("{puzzle}"' in "".join(c["source"])), len(cells))
    shown = []
    for number, cell in enumerate(cells[:checked]):
        if cell["cell_type"] == "code":
            shown.append((number, "".join(cell["source"]), True))
        shown += [(number, text, False) for text in _texts(cell)]
    return shown


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_shows_a_worked_solutions_shape_before_she_answers(path, shapes):
    leaks = []
    for puzzle, solution in shapes.items():
        for number, text, is_code in _before_she_answers(path, puzzle):
            leaks += [(number, puzzle, s.describe())
                      for s in gives_away(shapes_in(text, is_code), solution)]
    assert not leaks, "\n".join(f"cell {n}: {name}: {shape}" for n, name, shape in leaks)


def _engine_function(puzzle) -> str | None:
    """The name of the package function whose source is ``puzzle``'s worked solution, when it
    is the engine's own (its docstring then says what the puzzle asks for)."""
    solution = ex.reveal(puzzle.name)
    found = re.search(r"^(?:def|class) (\w+)", solution.source, re.M)
    if found is None:
        return None
    module = getattr(solution.code, "__module__", "") or ""
    return None if "teaching" in module else found.group(1)


@pytest.mark.parametrize("puzzle", PUZZLES, ids=lambda p: p.name)
def test_no_page_points_at_the_engine_function_she_writes(puzzle):
    """``help(prefix_cache.may_share)`` would print the rule 09.can_share asks for."""
    name = _engine_function(puzzle)
    if name is None:
        pytest.skip(f"{puzzle.name}'s worked solution is not an engine function")
    named = re.compile(rf"[A-Za-z_]\w*\.{name}(?!\w)")
    for code in ("en", "ko"):
        with pinned(code):
            assert not named.search(puzzle.describe()), (puzzle.name, code)
    leaks = [(path.stem, number) for path in NOTEBOOKS
             for number, text, _ in _before_she_answers(path, puzzle.name)
             if named.search(text)]
    assert not leaks, f"{puzzle.name}: the page names the engine's {name} at {leaks}"


@pytest.mark.parametrize("puzzle", PUZZLES, ids=lambda p: p.name)
def test_no_docstring_or_hint_holds_a_worked_solutions_shape(puzzle, shapes):
    for text in (puzzle.docstring, puzzle.hint, puzzle.title):
        for code in ("en", "ko"):
            page = shapes_in(text.in_language(code))
            given = [(name, s.describe()) for name, solution in shapes.items()
                     for s in gives_away(page, solution)]
            assert not given, (puzzle.name, code, given)


@pytest.mark.parametrize("puzzle", PUZZLES, ids=lambda p: p.name)
def test_no_hint_states_a_formula(puzzle):
    """A hint asks a question or names a quantity; a formula in it (``p % BLOCK_SIZE == 0``)
    is a line she would copy."""
    for code in ("en", "ko"):
        assert not formulas_in(puzzle.hint.in_language(code)), \
            (puzzle.name, code, formulas_in(puzzle.hint.in_language(code)))


@pytest.mark.parametrize("puzzle", PUZZLES, ids=lambda p: p.name)
def test_no_docstring_or_hint_holds_a_worked_solutions_line(puzzle, answers):
    lines = set().union(*answers.values())
    for text in (puzzle.docstring, puzzle.hint, puzzle.title):
        for code in ("en", "ko"):
            shown = text.in_language(code)
            assert not found_in(shown, lines), (puzzle.name, code, shown)
            assert not found_in(shown.replace("``", "`"), lines), (puzzle.name, code, shown)


def _written(value) -> set[str]:
    """The ways a page would print ``value``."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        if abs(value) < SMALLEST_SCANNED:
            return set()
        return {str(value), f"{value:,}", f"{value:_}"}
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) < 1e-9 or float(value).is_integer():
            return _written(int(value)) if math.isfinite(value) else set()
        return {f"{value:.3f}", f"{value:.4f}", repr(value)}
    if isinstance(value, tuple) and value:
        return {"(" + ", ".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")"}
    return set()


def _exercises():
    return [ex.get(n) for n in ex.names() if isinstance(ex.get(n), Exercise)]


def _shown(text: str, written: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(written)}(?![\w]|\.\d)", text) is not None


@pytest.mark.slow
@pytest.mark.parametrize("exercise", _exercises(), ids=lambda e: e.name)
def test_no_exercise_value_is_shown_before_she_answers(exercise):
    chapter = exercise.name.split(".")[0]
    path = next((p for p in NOTEBOOKS if p.name.startswith(chapter + "_")), None)
    if path is None:
        pytest.skip(f"no notebook for chapter {chapter}")
    cells = _notebook(path)
    checked = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"
                    and f'"{exercise.name}"' in "".join(c["source"])), len(cells))
    shown = []
    for written in _written(exercise.right_answer()):
        if (exercise.name, written) in ALLOWED_VALUES:
            continue
        for number, cell in enumerate(cells[:checked]):
            if any(_shown(text, written) for text in _texts(cell)):
                shown.append((number, written))
    assert not shown, f"{exercise.name} = {exercise.right_answer()!r} is on the page before " \
                      f"cell {checked}, which checks it: {shown}"
