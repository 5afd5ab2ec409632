"""``viz.performance``: notebook 08's ladder, attention and profile views, from the committed
GPU results and from smaller files like a later run may write (fewer variants, no nan)."""

from __future__ import annotations

import copy
import json

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from paged_tutorial.teaching import results  # noqa: E402
from paged_tutorial.teaching.chapters.ch08_performance import performance  # noqa: E402
from paged_tutorial.teaching.results import newest  # noqa: E402


def committed(name):
    result = newest(name)
    assert result.found, result.describe()
    return result.data


#: the fusion-ladder run of 2026-12-01 and the full run of that day, which predates the ladder:
#: the numbers below are theirs (a newer committed run changes what the notebook reads, not them)
FUSIONS_RUN = "decode-fusions-2026-12-01"
FULL_RUN = "decode-2026-12-01"


def without_middle_rungs(decode: dict) -> dict:
    """A decode run as one made before the ladder: only its two ends timed."""
    middle = {r.key for r in performance.LADDER[1:-1]}
    middle |= {k.replace("_ms_per_step", "_gpu_ms_per_step") for k in middle}
    return {**decode, "rows": [{k: v for k, v in row.items() if k not in middle}
                               for row in decode["rows"]]}


def ladder_run():
    return results.load(FUSIONS_RUN)


def test_the_notebook_reads_the_newest_run_that_has_the_ladder(tmp_path):
    chosen = performance.newest_ladder_run()
    assert chosen.found and performance.has_ladder(chosen.data), chosen.describe()
    folder = results.results_dir()
    dates = [date for name in performance.DECODE_RUNS
             for date, path in results.dated_files(name, folder)
             if performance.has_ladder(json.loads(path.read_text()))]
    assert chosen.path.name.endswith(f"-{max(dates)}.json")
    # a full run made before the ladder, beside a fusion-ladder run of the same date
    full = without_middle_rungs(results.load(FULL_RUN))
    ladder = results.load(FUSIONS_RUN)
    assert not performance.has_ladder(full) and performance.has_ladder(ladder)
    assert performance.has_ladder(results.load(FULL_RUN))
    (tmp_path / "decode-2026-12-01.json").write_text(json.dumps(full))
    assert performance.newest_ladder_run(tmp_path).path.name == "decode-2026-12-01.json"
    (tmp_path / "decode-fusions-2026-12-01.json").write_text(json.dumps(ladder))
    assert performance.newest_ladder_run(tmp_path).path.name == "decode-fusions-2026-12-01.json"
    # a later full run of decode.py with the ladder wins, and on one date the full run wins
    later = {**ladder, "date": "2026-12-02"}
    (tmp_path / "decode-2026-12-02.json").write_text(json.dumps(later))
    assert performance.newest_ladder_run(tmp_path).path.name == "decode-2026-12-02.json"
    (tmp_path / "decode-fusions-2026-12-02.json").write_text(json.dumps(later))
    assert performance.newest_ladder_run(tmp_path).path.name == "decode-2026-12-02.json"
    # a quick run of a reader's GPU is not a committed run
    (tmp_path / "decode-quick-2026-12-03.json").write_text(json.dumps(later))
    assert performance.newest_ladder_run(tmp_path).path.name == "decode-2026-12-02.json"
    assert not performance.newest_ladder_run(tmp_path / "none").found


def test_each_rung_is_compared_with_the_one_before_in_the_json():
    decode = ladder_run()
    rows = {r["batch"]: r for r in decode["rows"]}
    ladder = performance.decode_ladder(decode)
    assert [e["rung"].key for e in ladder] == [r.key for r in performance.LADDER]
    for before, entry in zip(ladder, ladder[1:]):
        for b in (1, 64):
            was, now = rows[b][before["rung"].key], rows[b][entry["rung"].key]
            assert entry["before"][b] == (before["rung"].label, was)
            assert entry["saved_ms"][b] == pytest.approx(was - now)
            assert entry["change_pct"][b] == pytest.approx(100 * (now - was) / was)
    assert ladder[0]["before"] == {}
    # the engine's rung at batch 1: 1.152 ms after 1.229 ms, the GPU part 1.024 ms
    engine = ladder[-1]
    assert performance.step_label(engine, 1) == "1.15 ms\n-0.08 ms (-6.3 %)"
    assert performance.step_label(ladder[0], 1) == f"{rows[1][ladder[0]['rung'].key]:.2f} ms"
    assert engine["gpu_ms"][1] == rows[1]["engine_gpu_ms_per_step"]
    text = performance.describe_rung(decode, "engine_graphs_no_overlap_ms_per_step")
    assert "batch 64: 1.86 ms per step, 0.19 ms lost against 'CUDA graph' (+11.4 %)" in text
    assert performance.missing_rungs(decode) == []


def test_reference_lines_are_the_floor_and_the_two_bandwidth_shares():
    row = ladder_run()["rows"][0]
    floor = row["floor_ms_per_step"]
    lines = performance.reference_lines(row)
    assert [ms for ms, _ in lines] == pytest.approx([floor, floor / 0.78, floor / 0.5])
    assert performance.bandwidth_share(row) == pytest.approx(floor / row["engine_ms_per_step"])
    assert 0.5 < performance.bandwidth_share(row) < 0.6          # 0.617 / 1.152 ms
    assert performance.reference_lines({"batch": 1}) == []


def texts(ax):
    return [t.get_text() for t in ax.texts]


def test_one_figure_per_rung_shows_what_the_json_holds():
    decode = ladder_run()
    rows = {r["batch"]: r for r in decode["rows"]}
    ladder = performance.decode_ladder(decode)
    for i, entry in enumerate(ladder):
        fig = performance.plot_rung(decode, entry["rung"].key)
        assert len(fig.axes) == 2
        for ax, b in zip(fig.axes, (1, 64)):
            assert performance.step_label(entry, b) in texts(ax)
            heights = [p.get_height() for p in ax.patches]
            assert heights[-1] == pytest.approx(rows[b][entry["rung"].key])
            assert len(heights) == (2 if entry["before"] else 1)
            lines = sorted(line.get_ydata()[0] for line in ax.lines
                           if line.get_xdata()[0] == 0 and line.get_xdata()[1] == 1)
            assert lines == pytest.approx(sorted(ms for ms, _ in
                                                 performance.reference_lines(rows[b])))
            assert f"{rows[b]['floor_ms_per_step'] / 0.78:.2f}" in texts(ax)
            ticks = [line.get_ydata()[0] for line in ax.lines
                     if not (line.get_xdata()[0] == 0 and line.get_xdata()[1] == 1)]
            keys = ([ladder[i - 1]["rung"].key] if entry["before"] else []) + [entry["rung"].key]
            gpu = [rows[b][k.replace("_ms_per_step", "_gpu_ms_per_step")] for k in keys
                   if k.replace("_ms_per_step", "_gpu_ms_per_step") in rows[b]]
            assert ticks == pytest.approx(gpu)                # the GPU's part of each bar
        plt.close(fig)


def test_a_run_of_the_readers_gpu_is_drawn_beside_the_committed_one():
    decode = ladder_run()
    yours = copy.deepcopy(decode)
    yours.update(gpu="NVIDIA L4", quick=True)
    for row in yours["rows"]:
        for key in list(row):
            if key.endswith("ms_per_step"):
                row[key] *= 3
    fig = performance.plot_rung(decode, "engine_ms_per_step", yours=yours)
    assert len(fig.axes) == 4
    engine = performance.decode_ladder(yours)[-1]
    assert performance.step_label(engine, 64) in texts(fig.axes[3])
    assert "NVIDIA L4 (quick run)" in fig.axes[2].get_ylabel()
    plt.close(fig)
    fig = performance.plot_decode_ladder(decode, yours=yours)
    assert len(fig.axes) == 4
    plt.close(fig)


def test_the_full_runs_rungs_and_comparisons():
    decode = without_middle_rungs(results.load(FULL_RUN))     # no rungs between the ends
    ladder = performance.decode_ladder(decode)
    assert [e["rung"].label for e in ladder] == ["launched from Python",
                                                 "+ overlapped launches (the engine)"]
    assert ladder[1]["before"][1][0] == "launched from Python"
    assert len(performance.missing_rungs(decode)) == 2
    timed = [c["rung"].key for c in performance.comparisons(decode)]
    assert timed == [r.key for r in performance.COMPARISONS          # those the run timed
                     if any(row.get(r.key) is not None for row in decode["rows"])]
    assert len(timed) >= 3
    fig = performance.plot_decode_ladder(decode)
    assert len(fig.axes[0].get_yticklabels()) == len(ladder) + len(timed)
    plt.close(fig)
    fig = performance.plot_rung(decode, "engine_graphs_no_overlap_ms_per_step")
    assert all("not timed" in texts(ax) for ax in fig.axes)
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


def test_profile_groups_against_their_part_of_the_floor():
    profile = results.load("profile-2026-12-01")
    row = next(r for r in ladder_run()["rows"] if r["batch"] == 1)
    groups = {g["group"]: g for g in performance.profile_groups(profile, "decode_graph_b1", row)}
    kernels = {k["name"]: k for k in profile["decode_graph_b1"]["by_kernel"]}
    matrix = groups["matrix products (weights)"]
    assert matrix["us"] == pytest.approx(kernels["numba:gemv"]["total_us"]
                                         + kernels["numba:qkv_rope_write_kv"]["total_us"])
    assert matrix["floor_us"] == pytest.approx(1e3 * row["weight_floor_ms_per_step"])
    assert groups["attention"]["us"] == kernels["numba:paged_attention_fast_kernel"]["total_us"]
    assert groups["attention"]["pct_of_floor"] < 5           # short contexts: latency
    assert groups["RMSNorms"]["calls"] == 33 and groups["RMSNorms"]["floor_us"] is None
    total = sum(k["total_us"] for k in kernels.values())
    assert sum(g["us"] for g in groups.values()) == pytest.approx(total)
    b64 = performance.profile_groups(profile, "decode_graph_b64")
    assert b64[0]["group"] == "matrix products (weights)"     # cuBLAS at batch 64
    assert b64[0]["pct_of_floor"] is None                     # no row given: no floor
