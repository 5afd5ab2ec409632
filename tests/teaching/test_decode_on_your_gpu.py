"""``decode_on_your_gpu``: the decode ladder timed on the reader's GPU in the notebook's
process.  Here (no GPU: the simulator) it says so and measures nothing; on a GPU (marker
``gpu``) it returns a run in the committed file's schema that notebook 08's figures draw."""

from __future__ import annotations

import ast
import inspect

import pytest

from paged_tutorial.backends.numba_cuda import SIMULATING
from paged_tutorial.measure import decode_ladder
from paged_tutorial.teaching import decode_on_your_gpu
from paged_tutorial.teaching.chapters.ch08_performance import performance


@pytest.mark.skipif(not SIMULATING, reason="the simulator's answer")
def test_without_a_gpu_it_says_so_and_measures_nothing():
    yours = decode_on_your_gpu.measure()
    assert not yours.found
    assert "No CUDA GPU" in yours.describe() and "committed" in yours.describe()


def test_not_measured_says_how_to_run_it():
    assert "RUN_ON_THIS_GPU = True" in decode_on_your_gpu.not_measured().describe()


def test_the_quick_run_times_every_rung_of_the_ladder():
    """``decode_ladder`` (whose variants cannot be built without a GPU, so read from its
    source): ``ladder_variants`` names one variant per rung of the notebook's ladder, in its
    order."""
    tree = ast.parse(inspect.getsource(decode_ladder))
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"quick_run", "ladder_variants", "time_row", "ladder"} <= set(functions)
    ladder = ast.unparse(functions["ladder"])
    variants = ast.unparse(functions["ladder_variants"])
    names = ["fast_no_graphs"] + [k for k in ("graphs_separate_mlp_no_overlap",
                                              "graphs_no_overlap") if k in ladder] + ["engine"]
    keys = ["engine_ms_per_step" if n == "engine" else f"engine_{n}_ms_per_step" for n in names]
    assert keys == [r.key for r in performance.LADDER]
    assert "fast_no_graphs" in variants and "ladder()" in variants and "engine" in variants


@pytest.mark.gpu
def test_on_a_gpu_the_quick_run_has_the_committed_schema():
    yours = decode_on_your_gpu.measure(hf=False, batches=(1,))
    assert yours.found, yours.describe()
    data = yours.data
    assert data["quick"] and data["gpu"] and data["ceilings"]["copy_bandwidth_gbs"] > 0
    (row,) = data["rows"]
    assert row["batch"] == 1 and not [k for k in row if k.endswith("_error")], row
    assert performance.has_ladder(data)
    ladder = performance.decode_ladder(data)
    assert [e["rung"].key for e in ladder] == [r.key for r in performance.LADDER]
    assert all(row["floor_ms_per_step"] < e["ms"][1] for e in ladder)
    assert ladder[1]["ms"][1] < ladder[0]["ms"][1]            # graphs beat host launches
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    committed = performance.newest_ladder_run().data
    plt.close(performance.plot_rung(committed, "engine_ms_per_step", yours=data))
