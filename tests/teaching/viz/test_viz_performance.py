"""``viz.performance``: notebook 08's ladder, attention and profile views, from the committed
GPU results and from smaller files like a later run may write (fewer variants, no nan)."""

from __future__ import annotations

import copy

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from paged_tutorial.teaching import results  # noqa: E402
from paged_tutorial.teaching.viz import performance  # noqa: E402
from paged_tutorial.teaching.results import newest  # noqa: E402


def committed(name):
    result = newest(name)
    assert result.found, result.describe()
    return result.data


def test_ladder_from_the_committed_decode_run():
    decode = committed("decode")
    ladder = performance.decode_ladder(decode)
    assert [e["rung"].key for e in ladder] == [r.key for r in performance.LADDER]
    assert all(set(e["ms"]) == {1, 64} for e in ladder)
    assert performance.missing_rungs(decode) == []
    fig = performance.plot_decode_ladder(decode)
    assert len(fig.axes) == 2 and all(ax.patches for ax in fig.axes)
    plt.close(fig)


def test_a_run_with_fewer_variants_draws_what_it_has():
    decode = copy.deepcopy(committed("decode"))
    for row in decode["rows"]:
        for key in ("engine_article_no_graphs_ms_per_step", "engine_article_graphs_ms_per_step",
                    "hf_static_ms_per_step"):
            row.pop(key, None)
    ladder = performance.decode_ladder(decode)
    assert len(ladder) == len(performance.LADDER) - 2
    assert len(performance.missing_rungs(decode)) == 2
    fig = performance.plot_decode_ladder(decode)
    assert len(fig.axes[0].get_yticklabels()) == len(ladder)
    plt.close(fig)


def test_attention_rows_hold_only_what_was_timed():
    attn = committed("attention")
    rows = performance.attention_rows(attn)
    assert all(set(r["us"]) <= set(performance.KERNELS) for r in rows)
    assert sum("article" in r["us"] for r in rows) == 2              # timed at two points only
    assert all(0 < p <= 150 for r in rows for p in r["pct"].values())
    # the run of 2026-11-30 timed both load widths (the attention sweep); later runs time the
    # committed variant only
    widths = performance.load_width_comparison(results.load("attention-2026-11-30"))
    assert widths["16-byte loads"] < widths["8-byte loads"]
    assert performance.load_width_comparison(attn, batch=3) is None
    fig = performance.plot_attention(attn)
    assert fig.axes[0].patches
    plt.close(fig)


def test_profile_rows_and_figure():
    profile = {"decode_graph_b1": {"kernels": 4, "kernel_ms": 0.05, "other_kernels_us": 1.0,
                                   "by_kernel": [
                                       {"name": "numba:gemv", "calls": 3, "total_us": 30.0},
                                       {"name": "nvjet_sm90_tst_128x64", "calls": 1, "total_us": 9.0},
                                       {"name": "numba:paged_attention_fast_kernel", "calls": 1,
                                        "total_us": 8.0}]}}
    rows = performance.profile_rows(profile, "decode_graph_b1", top=2)
    assert [r["name"] for r in rows] == ["gemv", "cuBLAS matmul", "everything else"]
    assert rows[-1]["total_us"] == 9.0
    fig = performance.plot_profile(profile)
    assert fig.axes[0].patches
    plt.close(fig)
