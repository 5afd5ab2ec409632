"""The committed benchmark results (``benchmarks/results/*.json``), found from anywhere.

    from paged_tutorial.teaching import results
    decode = results.load("decode-2026-11-30")     # the dict in decode-2026-11-30.json
    results.load("decode")                          # the newest decode-*.json
    results.find("decode-2026-11-30.png")           # a Path

The files stay where the benchmarks write them, ``benchmarks/results/`` of the repository.  They
are looked for, in this order:

1. the folder named by ``PAGED_TUTORIAL_RESULTS``;
2. ``benchmarks/results`` next to the package: a clone installed with ``pip install -e .``
   (the README's install, and the Colab cell's), wherever the notebook or script runs;
3. ``benchmarks/results`` in the working directory or one of its parents (a clone installed
   without ``-e``, used from inside it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

RESULTS_ENV = "PAGED_TUTORIAL_RESULTS"
RESULTS_SUBDIR = Path("benchmarks") / "results"
#: a result file of one run: ``<benchmark>-<YYYY-MM-DD>.json`` (not ``...-quick.json``)
DATED = re.compile(r"^(?P<name>.+)-(?P<date>\d{4}-\d{2}-\d{2})\.json$")


def candidate_dirs(cwd: Path | None = None) -> list[Path]:
    """Where results are looked for, in order (see the module doc)."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    dirs = []
    if os.environ.get(RESULTS_ENV):
        dirs.append(Path(os.environ[RESULTS_ENV]).expanduser())
    dirs.append(Path(__file__).resolve().parents[2] / RESULTS_SUBDIR)
    dirs += [folder / RESULTS_SUBDIR for folder in [cwd, *cwd.parents]]
    return list(dict.fromkeys(dirs))


def results_dir(cwd: Path | None = None) -> Path:
    """The first existing results folder; FileNotFoundError saying where it looked and how to
    get the files otherwise."""
    dirs = candidate_dirs(cwd)
    for folder in dirs:
        if folder.is_dir():
            return folder
    raise FileNotFoundError(
        "the benchmark results (benchmarks/results/*.json of the paged-tutorial repository) are "
        f"not here: looked in {', '.join(str(d) for d in dirs[:3])} and the parents of the "
        "working directory.  They are not part of an installed wheel: clone the repository and "
        f"install it with `pip install -e .`, or set {RESULTS_ENV} to a folder holding them")


def dated_files(name: str, folder: Path) -> list[tuple[str, Path]]:
    """(date, path) of every ``<name>-<date>.json`` in ``folder``, oldest first; files with
    anything after the date (``decode-2026-11-30-quick.json``) are not runs of ``name``."""
    found = []
    for path in folder.glob(f"{name}-*.json"):
        m = DATED.match(path.name)
        if m and m.group("name") == name:
            found.append((m.group("date"), path))
    return sorted(found)


def find(name: str, cwd: Path | None = None) -> Path:
    """The path of result file ``name``: a full file name (``decode-2026-11-30.png``), a stem
    (``decode-2026-11-30``, meaning .json), or a benchmark name (``decode``: the newest
    ``decode-*.json``, by the date in its name)."""
    folder = results_dir(cwd)
    exact = folder / name
    if exact.is_file():
        return exact
    if (folder / f"{name}.json").is_file():
        return folder / f"{name}.json"
    dated = dated_files(name, folder)
    if dated:
        return dated[-1][1]
    available = sorted(p.name for p in folder.iterdir() if p.is_file())
    raise FileNotFoundError(f"no result {name!r} in {folder}; available: {', '.join(available)}")


def load(name: str, cwd: Path | None = None) -> dict:
    """The JSON object of result ``name`` (see ``find`` for the accepted names)."""
    path = find(name, cwd)
    if path.suffix != ".json":
        raise ValueError(f"{path} is not a JSON result file: use results.find() for its path")
    return json.loads(path.read_text(encoding="utf-8"))
