"""``viz.thread_block``: the figure notebook 03 draws before its puzzles."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from paged_tutorial.teaching.chapters.ch03_address_arithmetic import thread_block  # noqa: E402


def test_block_layout_counts_warps_and_padding_lanes():
    assert thread_block.block_layout(40) == {"head_dim": 40, "threads": 64, "warps": 2,
                                             "padding": 24, "lane0": [0, 32]}
    assert thread_block.block_layout(64)["padding"] == 0
    assert thread_block.block_layout(80)["warps"] == 3


def test_the_figure_draws_every_thread_and_shared_cell():
    fig = thread_block.plot_thread_block(40)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "dot_products[0]" in texts and "dot_products[1]" in texts and "score[0]" in texts
    assert any("owns_dim" in t for t in texts)
    plt.close(fig)
