"""What the benchmark scripts share besides ``paged_tutorial.measure``: their results folder,
and the commit of a checkout.  Imports nothing from the package at import time, so a script
comparing several checkouts (``decode_trees.py``, ``torch_backend_decode.py``) can still put
another tree's package first on the path."""

from __future__ import annotations

import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_json(data: dict, stem: str, out: str | None, indent: int = 1) -> Path:
    """``data`` as ``<stem>-<date>.json`` in the folder ``out`` (or as the file ``out`` when it
    ends in ``.json``), in ``benchmarks/results`` without it
    (``paged_tutorial.measure.result_files``)."""
    from paged_tutorial.measure.result_files import write_json as write

    return write(data, stem, out or RESULTS, indent=indent)


def tree_commit(folder: Path) -> str | None:
    """The short git commit of the checkout holding ``folder`` (None outside a git checkout)."""
    try:
        res = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return res.stdout.strip() or None
