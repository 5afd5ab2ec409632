"""environment.yml and pyproject.toml say the same thing: every conda-forge package listed has
pyproject's version range, Python's range is requires-python, the pip step installs the package
with the README's extras, and triton (Linux + CUDA only) is not required everywhere.

Whether each OS resolves is checked against the package index by tools/check_platforms.sh,
which CI runs (.ci/run)."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ImportError:                       # Python 3.10: pytest brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CONDA_TO_PIP = {"pytorch": "torch", "matplotlib-base": "matplotlib"}
_REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*([^;]*?)\s*(?:;\s*(.*))?$")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pyproject_requirements() -> dict[str, list[tuple[str, str | None]]]:
    """name -> [(specifier, marker)] over the dependencies and every extra."""
    project = pyproject()
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    out: dict[str, list] = {}
    for line in lines:
        name, spec, marker = _REQ.match(line).groups()
        if normalize(name) != "paged-tutorial":
            out.setdefault(normalize(name), []).append((spec.replace(" ", ""), marker))
    return out


def environment():
    """(conda specs {name: spec}, pip lines) of environment.yml (a flat list: no YAML library
    needed)."""
    conda, pip_lines, in_pip, in_dependencies = {}, [], False, False
    for raw in (ROOT / "environment.yml").read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if re.match(r"^\S", line):                 # a top-level key
            in_dependencies = line.startswith("dependencies:")
            continue
        if not in_dependencies:
            continue
        if line.strip() == "- pip:":
            in_pip = True
            continue
        match = re.match(r"^(\s*)- (.+)$", line)
        if not match:
            continue
        if in_pip and len(match.group(1)) > 2:
            pip_lines.append(match.group(2).strip())
        else:
            in_pip = False
            name, spec = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", match.group(2)).groups()
            conda[normalize(name)] = spec.replace(" ", "")
    return conda, pip_lines


def test_every_conda_range_is_pyprojects():
    conda, _ = environment()
    requirements = pyproject_requirements()
    assert conda.pop("python") == pyproject()["requires-python"].replace(" ", "")
    assert conda.pop("pip") == ""
    for name, spec in conda.items():
        pip_name = normalize(CONDA_TO_PIP.get(name, name))
        assert pip_name in requirements, f"{name} is in environment.yml, not in pyproject.toml"
        specs = {s for s, _marker in requirements[pip_name]}
        assert specs == {spec}, f"{name}: environment.yml {spec}, pyproject.toml {specs}"


def test_pip_step_installs_the_package_with_the_readme_extras():
    _, pip_lines = environment()
    assert pip_lines == ["-e .[dev]"]
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[dev]"' in readme


def test_triton_and_numba_cuda_only_where_they_exist():
    conda, _ = environment()
    assert "triton" not in conda and "numba-cuda" not in conda
    requirements = pyproject_requirements()
    assert [marker for _, marker in requirements["triton"]] == ["sys_platform == 'linux'"]
    by_marker = {marker: spec for spec, marker in requirements["numba-cuda"]}
    assert by_marker["sys_platform == 'darwin'"] == "==0.20.1"
    assert by_marker["sys_platform != 'darwin'"] == ">=0.30,<0.31"
