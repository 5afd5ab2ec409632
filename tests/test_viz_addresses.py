"""``viz.addresses``: the chapter-03 figures and the puzzles' read maps, drawn from the kernel's
NumPy replay and from a recorded launch."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import paged_tutorial as pt  # noqa: E402
from paged_tutorial import oracles  # noqa: E402
from paged_tutorial.viz import addresses  # noqa: E402


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
