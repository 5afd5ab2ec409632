"""A script run puts its own folder first on ``sys.path``, so a file in ``benchmarks/`` named like
an importable module hides that module from everything the script imports (a ``kernels.py``
there once hid the ``kernels`` package that transformers imports, and the CPU benchmark
crashed).  No script may carry such a name, and transformers' model and generation path imports
from the benchmarks folder as a script run would."""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"


def shadowed_modules(folder: Path) -> dict[str, str]:
    """script name -> what it would hide: a standard-library module, or a module found on
    ``sys.path`` without ``folder``."""
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() != folder.resolve()]
    hidden = {}
    for script in sorted(folder.glob("*.py")):
        name = script.stem
        if name in sys.stdlib_module_names or name in sys.builtin_module_names:
            hidden[script.name] = f"the standard library's {name}"
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        if spec is not None:
            hidden[script.name] = spec.origin or str(spec.submodule_search_locations)
    return hidden


def test_no_benchmark_script_is_named_like_an_importable_module():
    assert shadowed_modules(BENCHMARKS) == {}, (
        "rename these scripts: run from benchmarks/, each hides the module named beside it")


def test_the_check_finds_a_script_that_hides_an_installed_package(tmp_path):
    (tmp_path / "transformers.py").write_text("")
    (tmp_path / "json.py").write_text("")
    (tmp_path / "my_bench.py").write_text("")
    assert sorted(shadowed_modules(tmp_path)) == ["json.py", "transformers.py"]


def test_transformers_generation_imports_from_the_benchmarks_folder():
    """``python -c`` run in benchmarks/ has ``''`` (that folder) first on sys.path, as
    ``python benchmarks/x.py`` has benchmarks/."""
    code = ("import sys; assert sys.path[0] in ('', '.')\n"
            "from transformers import LlamaForCausalLM\n"
            "import transformers.generation.utils\n"
            "import transformers.integrations.hub_kernels\n"
            "print('imported')")
    done = subprocess.run([sys.executable, "-c", code], cwd=BENCHMARKS, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "imported"
