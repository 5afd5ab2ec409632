"""What the benchmark scripts share: their results folder, and the package's measuring helpers
(``paged_tutorial/measure/``) under the names the scripts import."""

from __future__ import annotations

from pathlib import Path

from paged_tutorial.measure import result_files
from paged_tutorial.measure.comparison import rel_err
from paged_tutorial.measure.gpu_machine import ceilings, gpu_info, setup_numba_env
from paged_tutorial.measure.gpu_timers import events_ms, graph_ms
from paged_tutorial.measure.result_files import tree_commit

RESULTS = Path(__file__).resolve().parent / "results"

__all__ = ["RESULTS", "ceilings", "events_ms", "gpu_info", "graph_ms", "rel_err",
           "setup_numba_env", "tree_commit", "write_json"]


def write_json(data: dict, stem: str, out: str | None) -> Path:
    """``result_files.write_json`` into ``out``, or into ``benchmarks/results`` without it."""
    return result_files.write_json(data, stem, out or RESULTS)
