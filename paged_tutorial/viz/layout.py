"""Figures of the paged cache's layout: one block's bytes, the block table, memory over a run.

Every function draws from the objects it is given (a ``CacheConfig``, a live
``engine.cache.block_table``, numbers measured on a run); nothing here keeps its own copy of the
layout.  matplotlib is imported inside each function, so importing the package never needs it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

FIG_DPI = 80


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _new_axes(ax, figsize):
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=figsize, dpi=FIG_DPI)
    return fig, ax


def block_rows(config) -> np.ndarray:
    """One block as memory rows: row r (0 .. 2*BLOCK_SIZE-1) starts at byte r * KV_DIM * itemsize.

    Returns an int array [2*BLOCK_SIZE, num_kv_heads] whose entry is the KV head stored in that
    part of the row (K rows first, then V rows).  Rows 0..BLOCK_SIZE-1 are the K of tokens
    0..BLOCK_SIZE-1; row BLOCK_SIZE is the first byte at ``V_OFFSET``."""
    return np.tile(np.arange(config.num_kv_heads), (2 * config.BLOCK_SIZE, 1))


def draw_block_bytes(config, *, token: int | None = None, kv_head: int | None = None, ax=None,
                     title: str | None = None):
    """Draw one physical block in memory order, ``KV_DIM * itemsize`` bytes per row.

    The block's first BLOCK_SIZE rows are K (one token per row), the next BLOCK_SIZE rows are V,
    beginning ``V_OFFSET`` bytes after the block's start.  Columns are bytes inside a row,
    split by KV head.  With ``token`` (and optionally ``kv_head``) the bytes of that token's K
    and V are outlined, at the offsets ``PagedKVCache.k_byte_offset`` / ``v_byte_offset`` give
    relative to the block's start."""
    import matplotlib.patches as patches
    from matplotlib.colors import ListedColormap

    c = config
    bs, item, hd = c.BLOCK_SIZE, c.ITEMSIZE, c.head_dim
    row_bytes = c.KV_DIM * item
    fig, ax = _new_axes(ax, (7.5, 4.2))
    heads = block_rows(c)
    # colour code: K rows blue, V rows orange; alternate heads light / dark
    cmap = ListedColormap(["#9ecae1", "#3182bd", "#fdd0a2", "#e6550d"])
    codes = heads % 2
    codes[bs:] += 2
    ax.imshow(codes, cmap=cmap, vmin=0, vmax=3, aspect="auto", interpolation="nearest",
              extent=(0, row_bytes, 2 * bs, 0))
    for r in range(1, 2 * bs):                         # one row per token
        ax.axhline(r, color="white", lw=0.3)
    ax.axhline(bs, color="black", lw=2)
    for h in range(1, c.num_kv_heads):
        ax.axvline(h * hd * item, color="white", lw=0.6)
    ax.text(row_bytes * 1.01, bs / 2, f"K\ntokens 0-{bs - 1}\nbytes 0..{c.V_OFFSET - 1}",
            va="center", fontsize=8)
    ax.text(row_bytes * 1.01, 1.5 * bs,
            f"V\ntokens 0-{bs - 1}\nbytes {c.V_OFFSET}..{c.BLOCK_BYTES - 1}", va="center",
            fontsize=8)
    ax.text(row_bytes * 1.01, bs, f"V_OFFSET = {c.V_OFFSET}", va="center", fontsize=8,
            fontweight="bold")
    for h in range(c.num_kv_heads):
        ax.text((h + 0.5) * hd * item, -0.3, f"head {h}", ha="center", va="bottom", fontsize=7)
    if token is not None:
        heads_to_mark = range(c.num_kv_heads) if kv_head is None else [kv_head]
        for h in heads_to_mark:
            for row, colour in ((token, "red"), (bs + token, "darkred")):
                ax.add_patch(patches.Rectangle((h * hd * item, row), hd * item, 1, fill=False,
                                               edgecolor=colour, lw=2))
    yt = [0, bs // 2, bs, bs + bs // 2, 2 * bs]
    ax.set_yticks(yt, [f"{y * row_bytes}" for y in yt])
    ax.set_ylabel("byte offset of the row in the block")
    ax.set_xlabel(f"byte inside the row ({c.num_kv_heads} heads x {hd} x {item} B = "
                  f"{row_bytes} B)")
    ax.set_xlim(0, row_bytes)
    ax.set_title(title or f"one block = {c.BLOCK_BYTES} bytes ({c.dtype})", fontsize=10, pad=14)
    fig.tight_layout()
    return fig


def draw_block_table(block_table, *, n_logical: int | None = None, annotate: bool = False,
                     title: str | None = None):
    """Heatmap of a block table ``[slots, layers, logical]``: one panel per slot, a row per
    layer, a column per logical block; the colour is the physical block id, and ``-1``
    (unassigned) is light grey.  ``n_logical`` limits the columns drawn (default: up to the
    last assigned one, at least 4).  With ``annotate`` the ids are written in the cells."""
    import matplotlib.pyplot as plt
    from matplotlib import colormaps

    table = np.asarray(block_table)
    n_slots, n_layers, n_cols = table.shape
    if n_logical is None:
        used = np.flatnonzero((table >= 0).any(axis=(0, 1)))
        n_logical = max(4, int(used[-1]) + 2 if used.size else 4)
    n_logical = min(n_logical, n_cols)
    shown = table[:, :, :n_logical]
    assigned = shown[shown >= 0]
    vmin, vmax = (int(assigned.min()), int(assigned.max())) if assigned.size else (0, 1)
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    fig, axes = plt.subplots(1, n_slots, figsize=(2.2 + 1.6 * n_slots + 0.25 * n_logical * n_slots,
                                                  0.9 + 0.13 * n_layers),
                             dpi=FIG_DPI, squeeze=False, sharey=True)
    image = None
    for s, ax in enumerate(axes[0]):
        data = np.ma.masked_less(shown[s].astype(float), 0)
        image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=max(vmax, vmin + 1), aspect="auto",
                          interpolation="nearest")
        ax.set_title(f"slot {s}", fontsize=9)
        ax.set_xlabel("logical block")
        ax.set_xticks(range(n_logical))
        if annotate:
            for layer in range(n_layers):
                for lb in range(n_logical):
                    v = shown[s, layer, lb]
                    ax.text(lb, layer, "-1" if v < 0 else str(v), ha="center", va="center",
                            fontsize=5, color="black" if v < 0 else "white")
    axes[0][0].set_ylabel("layer")
    fig.colorbar(image, ax=list(axes[0]), label="physical block", shrink=0.9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_kv_bytes(steps: Sequence[int], series: Mapping[str, Sequence[float]], *,
                  unit: int = 2 ** 20, unit_name: str = "MiB", logy: bool = False,
                  marks: Mapping[int, str] | None = None, title: str | None = None):
    """Line plot of byte counts per engine step (one line per entry of ``series``).
    ``marks`` puts a labelled vertical line at some steps (e.g. where a request finished)."""
    fig, ax = _new_axes(None, (7.5, 3.4))
    for label, values in series.items():
        ax.step(list(steps), np.asarray(values, dtype=float) / unit, where="post", label=label)
    if logy:
        ax.set_yscale("log")
    for step, label in (marks or {}).items():
        ax.axvline(step, color="grey", lw=0.6, ls=":")
        ax.text(step, ax.get_ylim()[1], label, rotation=90, va="top", ha="right", fontsize=7,
                color="grey")
    ax.set_xlabel("engine step")
    ax.set_ylabel(unit_name)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


# --- puzzle figure: a reader's block layout against the article's ---------------------------

def _owner_image(config, offsets):
    """RGB [2*BLOCK_SIZE, KV_DIM*ITEMSIZE] of the bytes each element covers (white: no element,
    red: two elements), and the owner (K/V, token, head, dim) of every byte (-1: none)."""
    import matplotlib.colors as mcolors

    c = config
    width = c.KV_DIM * c.ITEMSIZE
    img = np.ones((2 * c.BLOCK_SIZE, width, 3))
    owner = -np.ones((2 * c.BLOCK_SIZE * width,), dtype=np.int64)
    count = np.zeros_like(owner)
    k_colors, v_colors = ("C0", "C2", "C9", "C7"), ("C1", "C4", "C5", "C6")     # never red
    bases = {(0, h): mcolors.to_rgb(k_colors[h % 4]) for h in range(c.num_kv_heads)}
    bases.update({(1, h): mcolors.to_rgb(v_colors[h % 4]) for h in range(c.num_kv_heads)})
    flat = img.reshape(-1, 3)
    for which, t, h, d in np.ndindex(offsets.shape):
        element = np.ravel_multi_index((which, t, h, d), offsets.shape)
        shade = 0.55 + 0.45 * d / max(c.head_dim - 1, 1)
        for b in range(int(offsets[which, t, h, d]), int(offsets[which, t, h, d]) + c.ITEMSIZE):
            if 0 <= b < owner.size:
                count[b] += 1
                owner[b] = element
                flat[b] = np.array(bases[(which, h)]) * shade + (1 - shade)
    flat[count > 1] = (0.84, 0.15, 0.16)
    return img, owner, bases


def plot_block_layout(config, offsets, expected):
    """One block's bytes as 2*BLOCK_SIZE rows of KV_DIM*ITEMSIZE bytes: where the article puts
    each element (left) and where ``offsets`` put it (right).  Colour: K or V and kv head
    (darker = higher dim); red: bytes two elements share; x: a byte holding another element
    than in the article's layout.  ``offsets``/``expected``: [2, BLOCK_SIZE, heads, head_dim]
    byte offsets inside the block."""
    plt = _plt()
    c = config
    left, want_owner, bases = _owner_image(c, np.asarray(expected))
    right, got_owner, _ = _owner_image(c, np.asarray(offsets))
    width = c.KV_DIM * c.ITEMSIZE
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), dpi=FIG_DPI, sharey=True)
    for ax, img, title in ((axes[0], left, "the article's layout"), (axes[1], right, "yours")):
        ax.imshow(img, aspect="auto", interpolation="nearest")
        ax.axhline(c.BLOCK_SIZE - 0.5, color="black", lw=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"byte within a {width}-byte row", fontsize=8)
    wrong = np.flatnonzero((got_owner != want_owner) & (got_owner >= 0))
    axes[1].scatter(wrong % width, wrong // width, marker="x", s=10, color="black", lw=0.6)
    axes[0].set_yticks([c.BLOCK_SIZE / 2 - 0.5, 1.5 * c.BLOCK_SIZE - 0.5])
    axes[0].set_yticklabels(["K rows", "V rows"], fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=col, label=f"{'KV'[w]} head {h}")
               for (w, h), col in sorted(bases.items())]
    handles.append(plt.Rectangle((0, 0), 1, 1, color=(0.84, 0.15, 0.16), label="two elements"))
    handles.append(plt.Line2D([], [], marker="x", ls="", color="black", label="not the article's"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle(f"one block = {c.BLOCK_BYTES} bytes", fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return fig


def plot_placements(config, writes):
    """Where a puzzle's ``locate`` wrote each token against where the decode kernel reads it:
    one panel per layer, physical blocks across, block rows down.  ``writes``: (layer, slot,
    position, (block, row) written, (block, row) read by the kernel).  Green: written where it
    is read; red: written where nothing reads it; orange: read where nothing was written."""
    plt = _plt()
    from .addresses import READ_COLORS, UNTOUCHED

    good, missed, extra = READ_COLORS.values()
    c = config
    layers = sorted({w[0] for w in writes})
    fig, axes = plt.subplots(len(layers), 1, figsize=(max(7.5, min(2 + 0.32 * c.NUM_BLOCKS, 10)),
                                                      1.0 + 1.5 * len(layers)),
                             dpi=FIG_DPI, squeeze=False, sharex=True)
    for ax, layer in zip(axes[:, 0], layers):
        img = np.ones((c.BLOCK_SIZE, c.NUM_BLOCKS, 3)) * np.array(UNTOUCHED)
        written = {w[3] for w in writes if w[0] == layer}
        wanted = {w[4] for w in writes if w[0] == layer}
        for cells, colour in ((wanted - written, missed), (written - wanted, extra),
                              (written & wanted, good)):
            for block, row in cells:
                if 0 <= block < c.NUM_BLOCKS:
                    img[row, block] = colour
        ax.imshow(img, aspect="auto", interpolation="nearest")
        ax.set_ylabel(f"layer {layer}\nrow", fontsize=8)
    axes[-1, 0].set_xlabel("physical block", fontsize=8)
    labels = {"written where the kernel reads it": good,
              "the kernel reads here, nothing was written": missed,
              "written where the kernel never reads": extra}
    handles = [plt.Rectangle((0, 0), 1, 1, color=col, label=n) for n, col in labels.items()]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.suptitle("each token's K/V: where it was written, where the decode kernel reads it",
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    return fig
