"""The file list is the architecture: these tests keep it honest.

Serving (``engine/``, ``cache/``, ``model/``, ``loading/``, ``backends/``, ``config.py``, the CLI)
never imports ``teaching/``; the package has no import cycle, counting imports made inside
functions too; and ``import paged_tutorial`` serves a request on a machine without matplotlib.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "paged_tutorial"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every paged_tutorial module ``path`` imports, anywhere in the file."""
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the package imports absolutely)"
            base = node.module or ""
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name.startswith("paged_tutorial"):
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        # a package's own __init__ is imported with any of its modules: not an edge of its own
        graph[name] = {m for m in imports_of(path) if m != name and not name.startswith(m + ".")}
    return graph


def test_serving_never_imports_teaching():
    offenders = {m: sorted(d for d in deps if d.startswith("paged_tutorial.teaching"))
                 for m, deps in import_graph().items()
                 if not m.startswith("paged_tutorial.teaching") and m != "paged_tutorial"}
    assert not {m: d for m, d in offenders.items() if d}


def test_no_import_cycles():
    graph = import_graph()
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.slow
def test_serves_a_request_without_matplotlib():
    script = """
import sys
sys.modules['matplotlib'] = None          # as if matplotlib were not installed
sys.modules['ipywidgets'] = None
import paged_tutorial as pt
model = pt.random_model(pt.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=16, max_position_embeddings=64), seed=0)
engine = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=32)
out = engine.generate([[1, 2, 3]], pt.SamplingParams(max_tokens=3, ignore_eos=True))
assert len(out[0].token_ids) == 3, out
assert not [m for m in sys.modules if m.startswith('paged_tutorial.teaching')]
print('served')
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=PACKAGE.parent, timeout=300)
    assert run.returncode == 0 and "served" in run.stdout, run.stderr
