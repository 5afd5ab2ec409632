"""The scripts in ``benchmarks/`` are thin: the GPU benchmarks parse their arguments and call one
``run`` of the package; no script keeps its own CUDA-event timing loop or writes its result file
by hand; and each thin script still answers ``--help`` on a CPU."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

#: script -> the call that does its work
THIN = {"decode.py": "decode_ladder.run", "attention.py": "attention_bench.run",
        "kernel_speeds.py": "kernel_bench.run", "profile_step.py": "step_profile.run",
        "prefix_sharing.py": "prefix_sharing_bench.run", "racecheck.py": "racecheck.run"}


def calls_of(tree: ast.AST) -> set[str]:
    return {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


@pytest.mark.parametrize("script", sorted(THIN))
def test_a_thin_script_defines_only_main_and_calls_the_package(script):
    tree = ast.parse((BENCHMARKS / script).read_text())
    defined = [n.name for n in tree.body
               if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    assert defined == ["main"]
    assert THIN[script] in calls_of(tree)


def json_written_by_hand(tree: ast.AST) -> list[str]:
    """``X.write_text(json.dumps(...))`` calls: a result file written without ``write_json``."""
    return [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)
            and ast.unparse(n.func).endswith(".write_text") and n.args
            and isinstance(n.args[0], ast.Call) and ast.unparse(n.args[0].func) == "json.dumps"]


def test_no_script_times_with_its_own_cuda_events_or_writes_json_by_hand():
    offenders = {}
    for path in BENCHMARKS.glob("*.py"):
        tree = ast.parse(path.read_text())
        own = sorted(c for c in calls_of(tree) if c.endswith("cuda.Event"))
        # torch_backend_decode.py's child hands its measurement to the parent through a file;
        # the parent writes the result with write_json
        if path.name != "torch_backend_decode.py":
            own += json_written_by_hand(tree)
        if own:
            offenders[path.name] = own
    assert not offenders, offenders


def test_the_hand_written_json_check_catches_one():
    tree = ast.parse('path.write_text(json.dumps(data, indent=1))\nlog.write_text(text)\n')
    assert json_written_by_hand(tree) == ["path.write_text(json.dumps(data, indent=1))"]


def test_no_script_imports_another_script():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - {"common"}
    offenders = {}
    for path in BENCHMARKS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in scripts:
                offenders[path.name] = node.module
            elif isinstance(node, ast.Import):
                offenders.update({path.name: a.name for a in node.names if a.name in scripts})
    assert not offenders, offenders


@pytest.mark.parametrize("script", sorted(THIN))
def test_a_thin_script_answers_help_without_a_gpu(script):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script}")
