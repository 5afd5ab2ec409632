"""``viz.races``: the racecheck result in words and as a figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from paged_tutorial.teaching.chapters.ch05_online_softmax import races  # noqa: E402

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
