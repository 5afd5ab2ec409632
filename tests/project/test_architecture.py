"""The file list is the architecture: these tests keep it honest.

Serving (``engine/``, ``cache/``, ``model/``, ``loading/``, ``backends/``, ``config.py``, the CLI)
and measuring (``measure/``) never import ``teaching/``; in ``teaching/``, the shared
``harness/`` imports no chapter and a chapter (``chapters/chNN_<name>/``) no later one; the
package has no import cycle, counting imports made inside functions too; every import points
down the layers (``LAYERS``); no module uses another's private (``_x``) names; the request path
of ``docs/architecture.md`` names functions that exist and are called in that order; and
``import paged_tutorial`` serves a request on a machine without matplotlib.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "paged_tutorial"
DOCS = PACKAGE.parent / "docs"


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
    """Nothing outside ``teaching/`` (serving, measuring) imports it."""
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


CHAPTERS = "paged_tutorial.teaching.chapters"
HARNESS = "paged_tutorial.teaching.harness"


def chapter_of(module: str) -> int | None:
    """NN of a module in ``teaching/chapters/chNN_<name>/``, else None."""
    found = re.match(re.escape(CHAPTERS) + r"\.ch(\d\d)_", module)
    return int(found[1]) if found else None


def test_teaching_chapters_stand_on_the_shared_harness():
    """The harness imports no chapter; a chapter imports the harness and earlier chapters only."""
    wrong = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
                   if d.startswith(CHAPTERS + ".") and (
                       m.startswith(HARNESS) or
                       (chapter_of(m) is not None and chapter_of(d) > chapter_of(m))))
    assert not wrong, "imports between chapters and the harness that point up:\n" + \
        "\n".join(wrong)


#: the layers, bottom first: a module may import its own layer and the layers below it.
#: (the package's root and the command line sit on top with teaching/)
LAYERS = (
    # contracts: they import nothing above them (the model families: tensor names, shapes and
    # forward differences; which devices exist; how many CPU threads torch uses)
    ("paged_tutorial.config", "paged_tutorial.step_inputs", "paged_tutorial.families",
     "paged_tutorial.devices", "paged_tutorial.threads"),
    ("paged_tutorial.cache",),
    ("paged_tutorial.loading",),
    ("paged_tutorial.backends",),
    ("paged_tutorial.model",),
    ("paged_tutorial.engine",),
    ("paged_tutorial", "paged_tutorial.__main__", "paged_tutorial.teaching"),
)

#: private names reached across modules on purpose: (file, name), each with its reason
PRIVATE_ALLOWED = {
    # the simulator's block manager (Numba's BlockManager, or sim_block.LockstepBlock standing
    # in for it under Numba's attribute names) knows a block's shape; access_log.py asks it
    ("backends/numba_cuda/runtime/access_log.py", "_block_dim"),
}


def layer_of(module: str) -> int:
    best = max((p for layer in LAYERS for p in layer
                if module == p or module.startswith(p + ".")), key=len)
    return next(i for i, layer in enumerate(LAYERS) if best in layer)


def test_imports_point_down_the_layers():
    upward = {(m, d) for m, deps in import_graph().items() for d in deps
              if layer_of(d) > layer_of(m)}
    assert not upward, "imports that point up the layers:\n" + "\n".join(
        f"{m} -> {d}" for m, d in sorted(upward))


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names_defined(tree: ast.AST) -> set[str]:
    """Private functions, classes, attributes and variables a module defines."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias) and node.asname:
            names.add(node.asname)
    return {n for n in names if is_private(n)}


def private_uses_across_modules() -> set[tuple[str, str]]:
    """(file, name): a private name another module defines, imported from it or reached as an
    attribute of anything but ``self`` / ``cls``."""
    trees = {p: ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    defined = {p: private_names_defined(t) for p, t in trees.items()}
    anywhere = set().union(*defined.values())
    found = set()
    for path, tree in trees.items():
        where = path.relative_to(PACKAGE).as_posix()
        # modules from outside the package (``os._exit`` is the standard library's own name)
        outside = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
                   if isinstance(node, ast.Import) for a in node.names
                   if not a.name.startswith("paged_tutorial")}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "paged_tutorial"):
                found |= {(where, a.name) for a in node.names if is_private(a.name)}
            elif isinstance(node, ast.Attribute) and is_private(node.attr) \
                    and node.attr in anywhere and node.attr not in defined[path] \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self",
                                                                                    "cls")) \
                    and not (isinstance(node.value, ast.Name) and node.value.id in outside):
                found.add((where, node.attr))
    return found


def test_no_private_name_is_used_across_modules():
    found = private_uses_across_modules()
    assert found <= PRIVATE_ALLOWED, "private names used across modules (give the owner a " \
        "public method or attribute):\n" + "\n".join(f"{f}: {n}" for f, n in
                                                     sorted(found - PRIVATE_ALLOWED))
    assert PRIVATE_ALLOWED <= found, f"fixed, remove from PRIVATE_ALLOWED: {PRIVATE_ALLOWED - found}"


def test_the_private_name_check_catches_a_reach_into_another_module(tmp_path, monkeypatch):
    """The check itself fails on the kind of reach it exists for."""
    fake = tmp_path / "paged_tutorial"
    (fake / "engine").mkdir(parents=True)
    (fake / "engine" / "core.py").write_text("class Core:\n    def _cancel(self):\n"
                                             "        pass\n")
    (fake / "engine" / "stream.py").write_text("class Stream:\n    def close(self):\n"
                                               "        self.engine._cancel()\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert private_uses_across_modules() == {("engine/stream.py", "_cancel")}


# --- the request path of docs/architecture.md --------------------------------------------------
def documented_hops() -> list[tuple[str, str]]:
    """(Class.function, file) of each hop of the request path in docs/architecture.md."""
    text = (DOCS / "architecture.md").read_text()
    block = text.split("## One request's path", 1)[1].split("```")[1]
    return re.findall(r"^\s+([A-Z]\w*\.\w+)\s+((?:\w+/)*\w+\.py)\b", block, re.M)


def test_the_documented_request_path_names_functions_that_exist():
    hops = documented_hops()
    assert len(hops) >= 15, hops
    for qualname, file in hops:
        source = PACKAGE / file
        assert source.exists(), f"docs/architecture.md names {file}, which does not exist"
        cls, func = qualname.split(".")
        tree = ast.parse(source.read_text())
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        assert classes, f"docs/architecture.md: {file} defines no class {cls}"
        assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in classes[0].body), \
            f"docs/architecture.md: {file}'s {cls} has no method {func}"


def test_a_request_walks_the_documented_path_in_order():
    import paged_tutorial as pt
    model = pt.random_model(pt.ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=64), dtype="float32", seed=0)
    engine = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=32)
    calls = []

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            path = Path(code.co_filename)
            if PACKAGE in path.parents:
                calls.append((code.co_qualname, path.relative_to(PACKAGE).as_posix()))

    sys.setprofile(profile)
    try:
        request = engine.add_request([1, 2, 3], max_tokens=1, on_token=lambda *a: None)
        engine.step()
        result = engine.pop_result(request.request_id)
    finally:
        sys.setprofile(None)
    assert result.finish_reason == "length" and len(result.token_ids) == 1
    hops = documented_hops()
    position = 0
    for hop in hops:
        try:
            position = calls.index(hop, position) + 1
        except ValueError:
            earlier = hop in calls[:position]
            raise AssertionError(
                f"{hop[0]} ({hop[1]}) is " + ("called before the hop the doc puts ahead of it"
                                               if earlier else "never called") +
                "; calls after the previous hop: " + ", ".join(
                    q for q, _ in calls[position:position + 40])) from None


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


def script_path_uses(tree: ast.AST, scripts: set[str]) -> list[str]:
    """What in a module's code loads a file by its path or names a ``benchmarks/`` script as a
    path: runpy, ``spec_from_file_location``, ``sys.path`` edits, a script's file name used as
    a path (joined with ``/``, in a command list, passed to a call) and a ``benchmarks/...py``
    path anywhere outside docstrings."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    # constants used as a path or a command's part: a ``/`` operand, a list item, an argument
    as_paths = {id(c) for node in ast.walk(tree) for c in (
        [node.left, node.right] if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
        else node.elts if isinstance(node, (ast.List, ast.Tuple))
        else node.args if isinstance(node, ast.Call) else [])}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            found += [f"imports {n}" for n in names if n.split(".")[0] == "runpy"]
        elif isinstance(node, ast.Attribute) and node.attr in ("spec_from_file_location",
                                                               "run_path"):
            found.append(node.attr)
        elif isinstance(node, ast.Attribute) and node.attr in ("insert", "append", "extend") \
                and ast.unparse(node.value) == "sys.path":
            found.append(f"sys.path.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            text = node.value.strip()
            if (text in scripts and id(node) in as_paths) \
                    or re.fullmatch(r"(\S*/)?benchmarks/\S+\.py", text):
                found.append(repr(node.value))
    return found


def test_the_package_loads_no_file_by_path_and_no_benchmark_script():
    scripts = {p.name for p in (PACKAGE.parent / "benchmarks").glob("*.py")}
    offenders = {p.relative_to(PACKAGE).as_posix(): uses for p in PACKAGE.rglob("*.py")
                 if (uses := script_path_uses(ast.parse(p.read_text()), scripts))}
    assert not offenders, offenders


def test_the_script_path_check_catches_a_script_run_by_path():
    scripts = {"racecheck.py"}
    caught = script_path_uses(ast.parse(
        'import runpy, sys\n'
        'sys.path.insert(0, "x")\n'
        'script = results_dir().parent / "racecheck.py"\n'
        'run(["python", "benchmarks/decode.py"])\n'
        'named = "racecheck.py" in text\n'), scripts)
    assert sorted(caught) == sorted(["imports runpy", "sys.path.insert", "'racecheck.py'",
                                     "'benchmarks/decode.py'"])
    shown = 'COMMAND = "python benchmarks/decode.py --quick"\n'
    assert script_path_uses(ast.parse('"""Run benchmarks/decode.py."""\n' + shown), scripts) == []
