"""The scripts in ``benchmarks/`` are thin: they call ``paged_tutorial.measure`` and the package,
and the package never loads a script by its path."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "paged_tutorial"


def test_the_package_loads_no_benchmark_script_as_a_module():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if "spec_from_file_location" in text or "sys.path.insert" in text:
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders


def test_decode_py_parses_arguments_and_calls_the_decode_ladder():
    tree = ast.parse((REPO / "benchmarks" / "decode.py").read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions == ["main"]
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "decode_ladder.run" in calls
