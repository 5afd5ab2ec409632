"""The layout figures and the exercise checkers of notebooks 00-02 (no model needed)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.exercises import check, exercises
from paged_tutorial.exercises.ch01 import article_cache_config, small_article_cache
from paged_tutorial.viz import layout


def test_article_cache_config_is_the_articles():
    assert article_cache_config().summary() == {
        "BLOCK_SIZE": 16, "KV_DIM": 512, "V_OFFSET": 16384, "BLOCK_BYTES": 32768,
        "NUM_BLOCKS": 65536, "MAX_BLOCKS_PER_SEQ": 128}
    small = small_article_cache(num_blocks=3)
    assert small.block_table.shape == (2, 16, 128) and small.NUM_BLOCKS == 3
    assert small.V_OFFSET == 16384


def test_block_rows_and_drawing():
    import matplotlib.pyplot as plt

    c = article_cache_config()
    rows = layout.block_rows(c)
    assert rows.shape == (2 * c.BLOCK_SIZE, c.num_kv_heads)
    # row r starts at byte r * KV_DIM * itemsize: row BLOCK_SIZE is V_OFFSET
    assert c.BLOCK_SIZE * c.KV_DIM * c.ITEMSIZE == c.V_OFFSET
    fig = layout.draw_block_bytes(c, token=5, kv_head=2)
    assert len(fig.axes[0].patches) == 2          # K and V of one head outlined
    plt.close(fig)
    fig = layout.draw_block_bytes(c, token=0)
    assert len(fig.axes[0].patches) == 2 * c.num_kv_heads
    plt.close(fig)


def test_block_table_heatmap_masks_unassigned():
    import matplotlib.pyplot as plt

    cache = small_article_cache(num_blocks=16 * 3)
    cache.ensure_capacity(0, 20)                  # 2 logical blocks per layer
    cache.ensure_capacity(1, 5)                   # 1
    fig = layout.draw_block_table(cache.block_table)
    axes = [ax for ax in fig.axes if ax.get_title().startswith("slot")]
    assert len(axes) == 2
    data = axes[0].images[0].get_array()
    assert data.shape == (16, 4)                  # default: at least 4 logical blocks drawn
    assert data.mask[:, 2:].all() and not data.mask[:, :2].any()
    plt.close(fig)


def test_plot_kv_bytes():
    import matplotlib.pyplot as plt

    fig = layout.plot_kv_bytes([0, 1, 2], {"a": [1, 2, 3], "b": [2, 2, 2]}, logy=True,
                               marks={1: "done"})
    assert len(fig.axes[0].lines) == 3           # two series + one mark
    plt.close(fig)


REFERENCE_ANSWERS = {
    # computed here independently of the checkers, from the package's config
    "00.kv_bytes_per_token": lambda c: c.num_layers * 2 * c.KV_DIM * c.ITEMSIZE,
    "00.decode_read_bytes": lambda c: 1000 * c.num_layers * 2 * c.KV_DIM * c.ITEMSIZE,
    "00.contiguous_vs_paged_waste": lambda c: (
        (c.max_seq_len - 100) * c.num_layers * 2 * c.KV_DIM * c.ITEMSIZE,
        (112 - 100) * c.num_layers * 2 * c.KV_DIM * c.ITEMSIZE),
    "01.float32_constants": lambda c: (2 * c.V_OFFSET, 2 * c.BLOCK_BYTES, c.NUM_BLOCKS // 2),
    "01.v_byte_offset": lambda c: (1000 * c.BLOCK_BYTES + 5 * c.KV_DIM * 2 + 5 * 64 * 2 + 10 * 2
                                   + c.V_OFFSET),
    "01.smollm2_block32": lambda c: (192, 32 * 192 * 2, 64),
    "02.flat_index": lambda c: 1 * 16 * 128 + 5 * 128 + 3,
    "02.unravel": lambda c: (1, 7, 56),
    "02.entries_used": lambda c: (7 + 2) * 16,
}


@pytest.mark.parametrize("name", sorted(REFERENCE_ANSWERS))
def test_checkers_accept_right_and_reject_wrong(name, capsys):
    answer = REFERENCE_ANSWERS[name](article_cache_config())
    assert check(name, answer)
    assert "✔ correct" in capsys.readouterr().out
    wrong = tuple(np.asarray(answer) + 1) if isinstance(answer, tuple) else answer + 1
    assert not check(name, wrong)
    assert "✘ not yet" in capsys.readouterr().out
    assert not check(name, "not a number")


def test_chapter_exercise_names():
    for prefix in ("00.", "01.", "02."):
        names = exercises(prefix)
        assert len(names) == 3 and set(names) <= set(REFERENCE_ANSWERS)


def test_checkers_accept_numpy_integers():
    assert check("02.flat_index", np.int64(2691))
    assert check("02.unravel", np.unravel_index(3000, (2, 16, 128)))
    assert not check("02.flat_index", True)


def test_pt_namespace():
    assert pt.CacheConfig is type(article_cache_config())
