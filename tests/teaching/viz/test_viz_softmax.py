"""``viz.softmax``: the chapter-05 figures, drawn from the recurrence in ``oracles``."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from paged_tutorial.teaching import oracles  # noqa: E402
from paged_tutorial.teaching.chapters.ch05_online_softmax import softmax  # noqa: E402


def test_trace_and_error_figures():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(40).astype(np.float32)
    values = rng.standard_normal((40, 4)).astype(np.float32)
    trace = oracles.online_softmax_trace(scores, values)
    fig = softmax.plot_online_softmax_trace(trace, trace["out"], dims=(0, 1), block_size=16)
    assert len(fig.axes) == 3
    plt.close(fig)
    fig = softmax.plot_softmax_error([2, 8], {"a": [1e-7, 2e-7]}, {"m": ([8], [1e-7])})
    assert fig.axes
    plt.close(fig)


def test_replay_figure_handles_a_run_that_stops_early():
    scores = np.array([0.5, 2.0, 1.0])
    article = np.array([[0.5, 1.0, 0.1], [2.0, 1.2, 0.3], [2.0, 1.6, 0.5]])
    mine = np.array([[0.5, 1.0, 0.1], [0.5, np.inf, np.inf]])
    fig = softmax.plot_softmax_replay(scores, mine, article, title="t")
    assert len(fig.axes) == 2 and len(fig.axes[1].lines) >= 2
    plt.close(fig)
