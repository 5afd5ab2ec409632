"""The layout figures of notebooks 00-02 and of the puzzles 01.kv_offset / 02.locate (no model
needed)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np

import paged_tutorial as pt
from paged_tutorial.teaching.exercises.setups import article_cache_config, small_article_cache
from paged_tutorial.teaching.chapters.ch01_block_layout import layout


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


def test_block_table_shows_ids_and_colours_by_step():
    import matplotlib.pyplot as plt

    cache = small_article_cache(num_blocks=16 * 3)
    cache.ensure_capacity(0, 20)                  # 2 logical blocks per layer
    cache.ensure_capacity(1, 5)                   # 1
    when = np.where(cache.block_table >= 0, 0, -1)
    when[0, :, 1] = 7                             # as if slot 0's second block came in step 7
    fig = layout.draw_block_table(cache.block_table, assigned_at=when, layers=range(4))
    axes = [ax for ax in fig.axes if ax.get_title().startswith("slot")]
    assert len(axes) == 2
    img = axes[0].images[0].get_array()
    assert img.shape[:2] == (4, 3)                # 4 layers drawn; columns: the used ones + one -1
    assert np.allclose(img[0, 2], 0.87)           # -1 in grey
    assert not np.allclose(img[0, 0], img[0, 1])  # popped in different steps, different colours
    assert np.allclose(img[0, 0], img[3, 0])
    texts = [t.get_text() for t in axes[0].texts]
    assert str(int(cache.block_table[0, 0, 0])) in texts and "-1" in texts
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["popped in step 0", "popped in step 7", "-1 (no block yet)"]
    plt.close(fig)
    fig = layout.draw_block_table(cache.block_table)            # no steps: one colour for ids
    assert len(fig.legends[0].get_texts()) == 2
    plt.close(fig)


def test_table_row_draws_one_arrow_per_assigned_entry():
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    table = np.full((2, 3, 8), -1)
    table[1, 2, :3] = [40, 7, 93]
    table[0, 0, :2] = [1, 2]
    fig = layout.draw_table_row(table, slot=1, layer=2, num_blocks=100)
    ax = fig.axes[0]
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == 3
    from matplotlib.patches import Rectangle

    marks = sorted(round(r.get_x() + r.get_width() / 2, 4) for r in ax.patches
                   if isinstance(r, Rectangle) and r.get_y() == 0.0 and r.get_width() < 0.5)
    assert marks == [round((b + 0.5) / 100, 4) for b in (7, 40, 93)]   # where the arrows land
    texts = [t.get_text() for t in ax.texts]
    assert {"40", "7", "93", "-1"} <= set(texts)
    strip = ax.images[0].get_array()
    assert np.allclose(strip[0, 1], 0.75)         # a block of another row: grey
    assert np.allclose(strip[0, 50], 1.0)         # free: white
    plt.close(fig)


def test_table_row_labels_never_overlap():
    """Blocks close together in a big pool (the notebook's case), and blocks at the pool's
    right end: every text of the figure keeps clear of every other."""
    import matplotlib.pyplot as plt

    for row in ([2799, 1937, 3260, 2743, 2595], [7679, 7678, 7677, 7676, 7675],
                [0, 1, 2, 3, 4]):
        table = np.full((2, 1, 8), -1)
        table[1, 0, :5] = row
        table[0, 0, :2] = [5000, 6000]
        fig = layout.draw_table_row(table, slot=1, layer=0, num_blocks=7680)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in fig.axes[0].texts
                 if t.get_text()]
        for i, (a, box_a) in enumerate(boxes):
            for b, box_b in boxes[i + 1:]:
                assert not box_a.overlaps(box_b), (row, a, b)
        plt.close(fig)


def test_memory_use_figure():
    import matplotlib.pyplot as plt

    from paged_tutorial.teaching import memory_use as mu

    ours = {p: {"token states": 50.0, "reservation": 20.0, "internal fragmentation": 30.0}
            for p in mu.POLICIES}
    paper = {p: mu.PAPER_FIGURE_2[mu.PAPER_NAME[p]] for p in mu.POLICIES}
    fig = layout.plot_memory_use(ours, paper)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "paper: 20.4%" in texts and "paper: 96.3%" in texts and texts.count("ours: 50.0%") == 4
    widths = sorted({round(p.get_width(), 1) for p in ax.patches})
    assert 3.7 in widths                          # vLLM's remainder, drawn as "others"
    plt.close(fig)


def test_plot_kv_bytes():
    import matplotlib.pyplot as plt

    fig = layout.plot_kv_bytes([0, 1, 2], {"a": [1, 2, 3], "b": [2, 2, 2]}, logy=True,
                               marks={1: "done"})
    assert len(fig.axes[0].lines) == 3           # two series + one mark
    plt.close(fig)


def test_pt_namespace():
    assert pt.CacheConfig is type(article_cache_config())


def test_block_layout_marks_misplaced_and_shared_bytes():
    import matplotlib.pyplot as plt

    c = pt.CacheConfig(num_layers=1, num_kv_heads=2, head_dim=4, dtype="bfloat16",
                       max_slots=1, max_seq_len=16)
    shape = (2, c.BLOCK_SIZE, c.num_kv_heads, c.head_dim)
    expected = np.zeros(shape, dtype=np.int64)
    for which, t, h, d in np.ndindex(shape):
        expected[which, t, h, d] = (t * c.KV_DIM + h * c.head_dim + d) * 2 + which * c.V_OFFSET
    fig = layout.plot_block_layout(c, expected, expected)
    assert not fig.axes[1].collections[0].get_offsets().size          # nothing misplaced
    plt.close(fig)
    mine = expected.copy()
    mine[1] = mine[0]                                   # V over K: every byte shared
    fig = layout.plot_block_layout(c, mine, expected)
    img = fig.axes[1].images[0].get_array()
    assert np.allclose(img[0, 0], (0.84, 0.15, 0.16))   # shared bytes in red
    assert np.allclose(img[c.BLOCK_SIZE, 0], 1.0)       # V rows left empty
    plt.close(fig)


def test_placements_figure():
    import matplotlib.pyplot as plt

    c = pt.CacheConfig(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32",
                       kv_cache_bytes=6 * 2 * 16 * 8 * 4, max_slots=1, max_seq_len=32)
    writes = [(0, 0, 0, (2, 0), (2, 0)), (0, 0, 1, (3, 1), (2, 1)), (1, 0, 0, (4, 0), (4, 0))]
    fig = layout.plot_placements(c, writes)
    assert len(fig.axes) == 2
    img = fig.axes[0].images[0].get_array()
    assert not np.allclose(img[1, 3], img[1, 2])       # written-wrong vs missed
    plt.close(fig)
