"""Results measured on a GPU, as the notebooks read them: the newest dated JSON file of a
benchmark, ``benchmarks/results/<name>-<YYYY-MM-DD>.json``.

    from paged_tutorial.teaching.viz.measured import load_newest
    decode = load_newest("decode")
    print(decode.describe())        # which file, which GPU, which day -- or why there is none
    decode.data                     # the JSON object (None when missing)

The results live in the repository's ``benchmarks/results`` folder, not inside the package; it is
found by ``paged_tutorial.teaching.results`` (next to the package for a clone installed with
``pip install -e .``, the README's install).  Only names that end in a date are
read (``decode-2026-11-30.json``, not ``decode-2026-11-30-quick.json`` or
``racecheck-dryrun-2026-11-30.json``), and the newest date wins, so a notebook picks up a new
measurement as soon as it is committed.  A missing folder or file is not an error: the result
says plainly what is missing and how to make it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from paged_tutorial.teaching import results
from paged_tutorial.teaching.results import RESULTS_SUBDIR


def results_folder() -> Path | None:
    """The repository's ``benchmarks/results`` folder (``paged_tutorial.teaching.results``), or None
    when it cannot be found."""
    try:
        return results.results_dir()
    except FileNotFoundError:
        return None


def dated_files(name: str, folder: Path | None = None) -> list[tuple[str, Path]]:
    """(date, path) of every ``<name>-<date>.json`` in the results folder, oldest first."""
    folder = results_folder() if folder is None else folder
    return [] if folder is None else results.dated_files(name, folder)


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


def load_newest(name: str, how_to_make: str | None = None,
                folder: Path | None = None) -> Measured:
    """The newest ``<name>-<date>.json``; when there is none, a ``Measured`` whose message says
    what is missing and (``how_to_make``) which command writes it."""
    make = f"  It is written by `{how_to_make}` on a machine with an NVIDIA GPU." \
        if how_to_make else ""
    folder = results_folder() if folder is None else folder
    if folder is None:
        return Measured(name, None, None,
                        f"The measured results are not here: this copy of the package has no "
                        f"{RESULTS_SUBDIR} folder beside it (they come with a clone of the "
                        f"repository installed with `pip install -e .`).{make}")
    files = dated_files(name, folder)
    if not files:
        return Measured(name, None, None,
                        f"{RESULTS_SUBDIR / (name + '-<date>.json')} is missing: "
                        f"no {name} measurement has been committed yet.{make}")
    date, path = files[-1]
    data = json.loads(path.read_text(encoding="utf-8"))
    where = f" on {data['gpu']}" if isinstance(data, dict) and data.get("gpu") else ""
    return Measured(name, path, data, f"{RESULTS_SUBDIR / path.name}: measured{where}, {date}")
