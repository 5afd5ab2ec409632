"""``viz.measured`` (the newest dated benchmark JSON, or a plain message) and ``viz.races`` (the
racecheck result in words and as a figure)."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from paged_tutorial.teaching.viz import measured, races  # noqa: E402

RACECHECK = {
    "date": "2026-12-01", "gpu": "NVIDIA H200", "dry_run": False,
    "case": {"head_dim": 64, "num_kv_heads": 8, "n_q_heads": 32, "dtype": "bfloat16",
             "rows": [{"slot": 1, "seq_len": 100}, {"slot": 0, "seq_len": 37}]},
    "layouts": {
        "article": {"hazards": 256, "by_cell": {"dot_products[0]": 256},
                    "agrees_with_oracle": True,
                    "races": [{"hazards": 256,
                               "first": {"op": "Write", "line": 309,
                                         "code": "dot_products[thread_id // WARP_SIZE] = qk"},
                               "second": {"op": "Read", "line": 321,
                                          "code": "dot_product = dot_products[0]"}}]},
        "port": {"hazards": 0, "by_cell": {}, "races": [], "agrees_with_oracle": True},
    },
}


def test_newest_dated_file_wins_and_other_names_are_ignored(tmp_path):
    for name in ("decode-2026-11-30.json", "decode-2026-12-02.json",
                 "decode-2026-12-09-quick.json", "decode_extra-2026-12-10.json",
                 "racecheck-dryrun-2026-12-05.json"):
        (tmp_path / name).write_text(json.dumps({"gpu": "G", "name": name}))
    got = measured.load_newest("decode", folder=tmp_path)
    assert got.found and got.data["name"] == "decode-2026-12-02.json"
    assert got.describe() == "benchmarks/results/decode-2026-12-02.json: measured on G, 2026-12-02"
    assert got.get("gpu") == "G" and got.get("missing", "x", default=3) == 3
    assert [d for d, _ in measured.dated_files("decode", tmp_path)] == ["2026-11-30", "2026-12-02"]
    assert not measured.load_newest("racecheck", folder=tmp_path).found   # the dry run is not it


def test_missing_results_say_so_plainly(tmp_path):
    got = measured.load_newest("profile", how_to_make="python benchmarks/profile_step.py",
                               folder=tmp_path)
    assert not got.found and got.data is None and got.get("x") is None
    assert "profile-<date>.json is missing" in got.describe()
    assert "python benchmarks/profile_step.py" in got.describe()
    assert str(tmp_path) not in got.describe()            # no machine paths in a notebook


def test_the_repository_results_are_found():
    folder = measured.results_folder()
    assert folder is not None and folder.name == "results" and folder.parent.name == "benchmarks"
    assert measured.load_newest("decode").found


def test_racecheck_summary_and_figure():
    text = races.summary(RACECHECK)
    assert "256 hazards (256 on dot_products[0])" in text
    assert "the port's layout (the score in its own shared cell): 0 hazards" in text
    assert "attention.py:321 `dot_product = dot_products[0]`" in text
    fig = races.plot_hazards(RACECHECK)
    assert fig.axes[0].patches
    plt.close(fig)
    failed = {"layouts": {"article": {"error": "no RACECHECK SUMMARY line"}}}
    assert "not measured (no RACECHECK SUMMARY line)" in races.summary(failed)


def test_rerun_is_refused_in_the_simulator():
    from paged_tutorial.backends.numba_cuda import SIMULATING

    data, message = races.rerun_racecheck()
    if SIMULATING:
        assert data is None and "simulator" in message
