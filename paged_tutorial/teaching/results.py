"""The committed benchmark results (``benchmarks/results/*.json``), found from anywhere.

    from paged_tutorial.teaching import results
    decode = results.load("decode-2026-11-30")     # the dict in decode-2026-11-30.json
    results.load("decode")                          # the newest decode-*.json
    results.find("decode-2026-11-30.png")           # a Path
    measured = results.newest("decode", how_to_make="python benchmarks/decode.py")
    print(measured.describe())     # which file, which GPU, which day -- or why there is none
    measured.data                  # the JSON object (None when missing)

``load`` and ``find`` raise when a file is missing; ``newest``, the notebooks' reader, never
does: its ``Measured`` says plainly what is missing and how to make it.  A benchmark's run is a
file whose name ends in a date (``decode-2026-11-30.json``, not ``decode-2026-11-30-quick.json``
or ``racecheck-dryrun-2026-11-30.json``); the newest date wins, so a notebook picks up a new
measurement as soon as it is committed.

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
from dataclasses import dataclass
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


@dataclass
class Measured:
    """One benchmark's newest result file, or the reason there is none."""

    name: str
    path: Path | None
    data: dict | None
    message: str

    @property
    def found(self) -> bool:
        return self.data is not None

    @property
    def file_name(self) -> str:
        """Where the file is, relative to the repository (no machine paths)."""
        return str(RESULTS_SUBDIR / (self.path.name if self.path else f"{self.name}-<date>.json"))

    def describe(self) -> str:
        return self.message

    def get(self, *keys, default=None):
        """``data[k1][k2]...``, or ``default`` when the file or a key is missing."""
        value = self.data
        for key in keys:
            if not isinstance(value, dict) or key not in value:
                return default
            value = value[key]
        return value


def newest(name: str, how_to_make: str | None = None, folder: Path | None = None,
           holding: str | None = None) -> Measured:
    """The newest ``<name>-<date>.json`` of the results folder (or ``folder``); with
    ``holding``, the newest that holds that key (a run may skip a part: the attention
    benchmark's ``--skip-prefill``).  When there is none, or it holds a ``--dry-run`` result, a
    ``Measured`` whose message says so and (``how_to_make``) which command writes a
    measurement."""
    make = f"  It is written by `{how_to_make}` on a machine with an NVIDIA GPU." \
        if how_to_make else ""
    if folder is None:
        try:
            folder = results_dir()
        except FileNotFoundError:
            return Measured(name, None, None,
                            f"The measured results are not here: this copy of the package has "
                            f"no {RESULTS_SUBDIR} folder beside it (they come with a clone of "
                            f"the repository installed with `pip install -e .`).{make}")
    files = dated_files(name, Path(folder))
    if holding is not None:
        files = [(date, path) for date, path in files
                 if json.loads(path.read_text(encoding="utf-8")).get(holding)]
    if not files:
        return Measured(name, None, None,
                        f"{RESULTS_SUBDIR / (name + '-<date>.json')} is missing: "
                        f"no {name} measurement has been committed yet.{make}")
    date, path = files[-1]
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and data.get("dry_run"):
        return Measured(name, None, None,
                        f"{RESULTS_SUBDIR / path.name} is a --dry-run result (a tiny model on a "
                        f"CPU), not a measurement.{make}")
    where = f" on {data['gpu']}" if isinstance(data, dict) and data.get("gpu") else ""
    return Measured(name, path, data, f"{RESULTS_SUBDIR / path.name}: measured{where}, {date}")
