"""``viz.addresses``: the chapter-03 figures and the puzzles' read maps, drawn from the kernel's
NumPy replay and from a recorded launch."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import paged_tutorial as pt  # noqa: E402
from paged_tutorial.teaching import oracles  # noqa: E402
from paged_tutorial.teaching.harness import addresses  # noqa: E402


def cache_with_two_slots():
    cfg = pt.CacheConfig(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32",
                         kv_cache_bytes=8 * 2 * 16 * 16 * 4, max_slots=2, max_seq_len=48)
    cache = pt.PagedKVCache(cfg)
    cache.free_blocks = [6, 1, 4, 0, 7, 2, 5, 3]
    cache.ensure_capacity(0, 20)
    cache.ensure_capacity(1, 5)
    return cache


def test_buffer_and_address_figures():
    cache = cache_with_two_slots()
    traces = [oracles.kernel_read_trace(cache, 1, s, n, 3, 2) for s, n in ((0, 20), (1, 5))]
    fig = addresses.plot_buffer_reads(cache, traces)
    assert len([ax for ax in fig.axes if ax.images]) == cache.NUM_BLOCKS
    plt.close(fig)
    fig = addresses.plot_address_by_token(cache, traces[0])
    assert fig.axes[0].lines
    plt.close(fig)


def test_read_maps_colour_right_missed_and_wrong():
    cache = cache_with_two_slots()
    c = cache.config
    tr = oracles.kernel_read_trace(cache, 0, 0, 20, 0, 1)
    expected = tr.k_index.ravel()
    reads = np.concatenate([expected[8:], [tr.v_index[0, 0]]])   # 8 missed, 1 extra
    fig = addresses.plot_block_reads(c, expected, reads, title="t")
    colours = {tuple(px) for ax in fig.axes for px in ax.images[0].get_array().reshape(-1, 3)}
    assert set(addresses.READ_COLORS.values()) <= colours
    plt.close(fig)
    fig = addresses.plot_table_reads(c, tr.table_index, [tr.table_index[0], 40])
    assert "outside the table" in fig.axes[0].get_title()
    plt.close(fig)


def test_buffer_figure_colour_bars_show_the_tiles_colours():
    """Issue 10: the legend showed one middle shade while the tiles ran through a gradient.
    Each trace now has a colour bar whose ends are the colours of its first and last token."""
    cache = cache_with_two_slots()
    c = cache.config
    trace = oracles.kernel_read_trace(cache, 1, 0, 20, 3, 2)
    fig = addresses.plot_buffer_reads(cache, [trace], ["slot 0"])
    bars = [ax for ax in fig.axes if ax.get_xlabel() == "slot 0: token position"]
    assert len(bars) == 1
    bar = bars[0]._colorbar                            # matplotlib's Colorbar of that axes
    for t in (0, trace.seq_len - 1):
        e = trace.k_index[t, 0]
        block, (row, col) = e // c.BLOCK_ELEMS, divmod(e % c.BLOCK_ELEMS, c.KV_DIM)
        tile = next(ax for ax in fig.axes if ax.get_title().startswith(f"phys {block}:"))
        pixel = tile.images[0].get_array()[row, col]
        np.testing.assert_allclose(pixel, bar.cmap(bar.norm(t)), atol=1e-6)
    plt.close(fig)


def test_thread_map_from_a_trace_and_from_a_recorded_launch():
    cache = cache_with_two_slots()
    trace = oracles.kernel_read_trace(cache, 0, 0, 20, 1, 2)
    reads = addresses.thread_reads(trace)
    assert sorted(reads) == list(range(cache.config.head_dim))
    assert all(len(ix) == 2 * 20 for ix in reads.values())
    fig = addresses.plot_thread_reads(cache.config, reads, title="t")
    tiles = [ax for ax in fig.axes if ax.images]
    assert len(tiles) == trace.num_blocks
    plt.close(fig)
    shared = {0: [5, 6], 1: [6]}                       # element 6 read by two threads: black
    fig = addresses.plot_thread_reads(cache.config, shared)
    assert (fig.axes[0].images[0].get_array()[0, 6] == 0).all()
    plt.close(fig)
