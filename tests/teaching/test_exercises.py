"""The checker of every notebook exercise: each worked solution (solutions.py) passes, each
perturbed one fails, and answers are never coerced (a float or a string for an integer is
wrong, a bool is not an integer, real numbers count to 4 significant digits)."""

from __future__ import annotations

import ast
import re
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.exercises import answers
from paged_tutorial.teaching.exercises.registry import Exercise
from paged_tutorial.teaching.exercises.setups import article_cache_config
from paged_tutorial.teaching.exercises import solutions

PACKAGE = Path(__file__).resolve().parents[2] / "paged_tutorial"
EXERCISES = [n for n in ex.names() if isinstance(ex.get(n), Exercise)]


def perturbed(value):
    """The solution made wrong by the smallest change the checker must notice."""
    if isinstance(value, tuple):
        return (perturbed(value[0]),) + value[1:]
    if isinstance(value, int):
        return value + 1
    return value * (1 + 1e-2) + 1e-2


def test_every_name_has_a_solution_and_back():
    assert sorted(ex.names()) == solutions.solved()
    assert len(ex.names()) == len(set(ex.names()))
    for name in ex.names():
        assert name[:2].isdigit() and name[2] == "."
    assert ex.names("03.") == [n for n in ex.names() if n.startswith("03.")]


@pytest.mark.parametrize("name", EXERCISES)
def test_solution_passes_and_perturbed_fails(name, capsys):
    solution = ex.reveal(name)
    assert ex.expected_answer(name) == pytest.approx(solution, rel=1e-4)
    assert ex.check(name, solution) is True
    assert f"✔ correct [{name}]" in capsys.readouterr().out
    assert ex.check(name, perturbed(solution)) is False
    assert f"✘ not yet [{name}]" in capsys.readouterr().out


@pytest.mark.parametrize("name", EXERCISES)
def test_types_are_not_coerced(name):
    solution = ex.reveal(name)
    assert ex.grade(name, str(solution)).status == "wrong"
    assert ex.grade(name, ...).status == "unsolved"
    assert ex.grade(name, None).status == "unsolved"
    if isinstance(solution, int):
        assert not ex.grade(name, float(solution)).ok
        assert not ex.grade(name, np.float64(solution)).ok
        assert ex.grade(name, np.int64(solution)).ok        # a NumPy integer is an integer
    if isinstance(solution, tuple) and isinstance(solution[0], int):
        assert not ex.grade(name, tuple(float(x) for x in solution)).ok
        assert ex.grade(name, list(solution)).ok
        assert ex.grade(name, np.array(solution)).ok
        assert not ex.grade(name, solution[:-1]).ok
        assert not ex.grade(name, solution + (0,)).ok


def test_lenient_answers_are_refused():
    """Wrong answers a lenient checker would accept are refused, with the reason."""
    v = ex.grade("05.q_index", 581.9)
    assert not v.ok and "float" in v.message and "integer" in v.message
    assert not ex.grade("05.q_index", 581.0).ok
    v = ex.grade("03.blocks_for_33", "31")
    assert not v.ok and "str" in v.message
    v = ex.grade("03.blocks_for_48", (3, 48 % 16))
    assert not v.ok and "last block is full" in v.message
    # a hand-computed correction to 4 significant digits is right
    assert ex.grade("05.corrections", [0, 0.2231, 1, 0.3679]).ok
    v = ex.grade("05.corrections", [0, 0.2231, 1, 0.3670])
    assert not v.ok and "step 3 wrong" in v.message
    assert not ex.grade("02.flat_index", True).ok
    assert "bool" in ex.grade("02.flat_index", True).message


def test_known_mistakes_get_their_own_message():
    c = article_cache_config()
    v = ex.grade("00.kv_bytes_per_token", c.num_layers * c.KV_DIM * c.ITEMSIZE)
    assert "both K and V" in v.message
    v = ex.grade("02.flat_index", 5 * 2 * 128 + 1 * 128 + 3)
    assert "swapped" in v.message
    v = ex.grade("04.shared_floats", (2, 2, 4))
    assert "rounds down" in v.message
    v = ex.grade("05.denominator", float(np.exp([0.5, 2.0, 1.0, 3.0]).sum()))
    assert "running max" in v.message


def test_real_numbers_to_four_significant_digits():
    assert answers.agrees_to_digits(0.2231, 0.22313016)
    assert answers.agrees_to_digits(0.2232, 0.22316)            # rounded
    assert answers.agrees_to_digits(0.2231, 0.22316)            # truncated
    assert not answers.agrees_to_digits(0.2233, 0.22313016)
    assert answers.agrees_to_digits(1585.0, 1585.3)
    assert not answers.agrees_to_digits(1587, 1585.3)
    assert answers.agrees_to_digits(0.0, 0.0)
    assert not answers.agrees_to_digits(1e-3, 0.0)
    assert not answers.agrees_to_digits(math.nan, 1.0)
    real = answers.Real()
    assert real.type_problem(3) is None and real.type_problem(np.float32(0.5)) is None
    assert real.type_problem(True) and real.type_problem("0.5") and real.type_problem(math.nan)


def test_integer_kind_messages():
    kind = answers.Integer()
    assert kind.type_problem(7) is None and kind.type_problem(np.int32(7)) is None
    for bad, word in ((7.0, "float"), ("7", "str"), (True, "bool"), (np.bool_(True), "bool"),
                      ([7], "list"), (None, "NoneType")):
        assert word in kind.type_problem(bad)
    seq = answers.Numbers(answers.Integer(), 2, ("a", "b"))
    assert "2 integers (a, b)" in seq.what
    assert "b: " in seq.type_problem((1, 2.5))
    assert seq.wrong_parts((1, 3), (1, 2)) == ["b"]


def test_check_prints_one_line_and_unknown_names_are_named(capsys):
    assert ex.check("00.kv_bytes_per_token", ...) is False
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "✘ not solved yet [00.kv_bytes_per_token]" in out
    with pytest.raises(KeyError, match="known: 00.contiguous"):
        ex.check("99.nothing", 1)
    with pytest.raises(TypeError, match="puzzle"):
        ex.expected_answer("03.k_index")


def test_revealing_an_exercise_imports_no_kernel():
    script = """
import sys
import paged_tutorial.teaching.exercises as ex
assert ex.reveal("00.kv_bytes_per_token") == 16 * 2 * 512 * 2
assert "numba" not in sys.modules, "revealing an exercise imported numba"
ex.reveal("04.token_score")               # the kernel's own part: now the kernel is imported
assert "paged_tutorial.backends.numba_cuda.kernels.attention" in sys.modules
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=PACKAGE.parent, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr


def test_no_grader_imports_the_solutions():
    """Puzzles and the chapters' exercises take their rules from the package and the article's
    constants, never from the worked solutions."""
    graders = sorted((PACKAGE / "teaching" / "chapters").rglob("*.py")) + \
        sorted((PACKAGE / "teaching" / "harness").glob("*.py"))
    assert len(graders) > 10
    offenders = []
    for path in graders:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any("solutions" in n for n in names):
                    offenders.append(path.name)
    assert not offenders


def test_flat_index_hint_does_not_give_the_formula_away():
    verdict = ex.grade("02.flat_index", 7)
    assert verdict.status == "wrong"
    assert "MAX_BLOCKS_PER_SEQ + layer" not in verdict.message
    assert not re.search(r"slot\s*\*\s*N_LAYERS", verdict.message), verdict.message
