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


def draw_block_table(block_table, *, assigned_at=None, layers=None, n_logical: int | None = None,
                     annotate: bool = True, title: str | None = None):
    """A block table ``[slots, layers, logical]`` as one panel per slot: a row per layer, a
    column per logical block, each cell holding its physical block id (``-1``, unassigned, in
    light grey).  Shuffled ids as colours would read as noise, so the colour says *when* the
    entry got its block: ``assigned_at`` (same shape, the engine step of each entry's pop, -1
    where none) gives one colour per step, named in the legend; without it every assigned entry
    has one colour.  ``layers`` picks the rows drawn (default all), ``n_logical`` the columns
    (default: up to the last assigned one, plus one)."""
    import matplotlib.pyplot as plt
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    table = np.asarray(block_table)
    n_slots, n_layers, n_cols = table.shape
    layers = list(range(n_layers)) if layers is None else list(layers)
    if n_logical is None:
        used = np.flatnonzero((table >= 0).any(axis=(0, 1)))
        n_logical = int(used[-1]) + 2 if used.size else 4
    n_logical = min(n_logical, n_cols)
    shown = table[:, layers, :n_logical]
    when = None if assigned_at is None else np.asarray(assigned_at)[:, layers, :n_logical]
    unassigned = np.array([0.87, 0.87, 0.87])
    if when is None:
        steps, palette = [], {}
    else:
        steps = sorted({int(s) for s in when[shown >= 0]})
        cmap = colormaps["tab10"]
        palette = {s: np.array(cmap(i % 10)[:3]) for i, s in enumerate(steps)}
    one_colour = np.array(colormaps["tab10"](0)[:3])
    fig, axes = plt.subplots(1, n_slots, figsize=(1.2 + (0.42 * n_logical + 0.9) * n_slots,
                                                  1.3 + 0.24 * len(layers)),
                             dpi=FIG_DPI, squeeze=False, sharey=True)
    for s, ax in enumerate(axes[0]):
        img = np.tile(unassigned, (len(layers), n_logical, 1))
        for r, c in zip(*np.nonzero(shown[s] >= 0)):
            img[r, c] = one_colour if when is None else palette[int(when[s, r, c])]
        ax.imshow(img, aspect="auto", interpolation="nearest")
        ax.set_xticks(np.arange(-0.5, n_logical, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, len(layers), 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
        ax.set_title(f"slot {s}", fontsize=9)
        ax.set_xlabel("logical block")
        ax.set_xticks(range(n_logical))
        if annotate:
            for r in range(len(layers)):
                for c in range(n_logical):
                    v = int(shown[s, r, c])
                    ax.text(c, r, str(v), ha="center", va="center", fontsize=6.5,
                            color="dimgray" if v < 0 else "white")
    axes[0][0].set_yticks(range(len(layers)))
    axes[0][0].set_yticklabels([str(layer) for layer in layers], fontsize=7)
    axes[0][0].set_ylabel("layer")
    handles = [Patch(color=unassigned, label="-1 (no block yet)")]
    if when is None:
        handles.insert(0, Patch(color=one_colour, label="physical block id (written in the cell)"))
    else:
        handles = [Patch(color=palette[s], label=f"popped in step {s}") for s in steps] + handles
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=7,
               frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.02 * (len(handles) > 5), 1, 0.95 if title else 1))
    return fig


def draw_table_row(block_table, slot: int, layer: int, num_blocks: int, *,
                   n_logical: int | None = None, title: str | None = None):
    """One (slot, layer) row of the block table drawn as arrows into the pool of physical
    blocks: the logical blocks across the top, each holding its entry; beneath, all
    ``num_blocks`` physical blocks as a strip, where this row's blocks are coloured, blocks that
    belong to other rows are grey and free ones white; an arrow goes from each logical block to
    the physical block its entry names.  -1 entries get no arrow."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

    table = np.asarray(block_table)
    row = table[slot, layer]
    used = np.flatnonzero(row >= 0)
    if n_logical is None:
        n_logical = int(used[-1]) + 2 if used.size else 4
    n_logical = min(n_logical, row.size)
    owned_elsewhere = np.zeros(num_blocks, dtype=bool)
    others = table[table >= 0]
    owned_elsewhere[others[others < num_blocks]] = True
    mine = [(lb, int(row[lb])) for lb in range(n_logical) if row[lb] >= 0]
    owned_elsewhere[[b for _, b in mine]] = False

    fig, ax = plt.subplots(figsize=(9.0, 3.6), dpi=FIG_DPI)
    ax.set_xlim(-0.07, 1.07)
    ax.set_ylim(-0.42, 1.1)
    ax.axis("off")
    box_w = min(0.09, 0.9 / n_logical)
    x0 = 0.5 - n_logical * box_w / 2
    colors = plt.get_cmap("tab10")
    for lb in range(n_logical):
        entry = int(row[lb])
        color = colors(lb % 10) if entry >= 0 else (0.87, 0.87, 0.87)
        ax.add_patch(Rectangle((x0 + lb * box_w, 0.78), box_w * 0.92, 0.2, facecolor=color,
                               edgecolor="dimgray", alpha=0.85 if entry >= 0 else 1.0))
        ax.text(x0 + (lb + 0.46) * box_w, 0.93, f"logical {lb}", ha="center", va="center",
                fontsize=6.5, color="white" if entry >= 0 else "dimgray")
        ax.text(x0 + (lb + 0.46) * box_w, 0.84, str(entry), ha="center", va="center",
                fontsize=8, fontweight="bold", color="white" if entry >= 0 else "dimgray")
    ax.text(x0 - 0.01, 0.88, f"block_table[{slot}, {layer}, :]", ha="right", va="center",
            fontsize=8, family="monospace")
    # the pool: one thin cell per physical block, its two ends numbered at its sides
    strip = np.ones((1, num_blocks, 3))
    strip[0, owned_elsewhere] = (0.75, 0.75, 0.75)
    for lb, b in mine:
        strip[0, b] = colors(lb % 10)[:3]
    ax.imshow(strip, extent=(0.0, 1.0, 0.0, 0.12), aspect="auto", interpolation="nearest")
    ax.add_patch(Rectangle((0.0, 0.0), 1.0, 0.12, fill=False, edgecolor="dimgray", lw=0.8))
    ax.text(-0.01, 0.06, "0", ha="right", va="center", fontsize=7)
    ax.text(1.01, 0.06, str(num_blocks - 1), ha="left", va="center", fontsize=7)
    ax.text(0.5, -0.17, f"the pool: physical blocks 0 .. {num_blocks - 1} of the cache buffer",
            ha="center", va="top", fontsize=8)
    width = max(1.0 / num_blocks, 0.004)          # this row's blocks stay visible in a big pool
    # each block's number beneath the pool, spread apart so that none overlaps another, with a
    # leader line up to the block it names
    placed = sorted(mine, key=lambda m: m[1])
    gap = 0.055
    spots = []
    for _, b in placed:
        x = (b + 0.5) / num_blocks
        spots.append(max(x, spots[-1] + gap) if spots else x)
    for i in range(len(spots) - 1, -1, -1):       # pull back what ran past the right end
        limit = 1.0 if i == len(spots) - 1 else spots[i + 1] - gap
        spots[i] = min(spots[i], limit)
    label_x = {lb: x for (lb, _), x in zip(placed, spots)}
    for lb, b in mine:
        x_pool = (b + 0.5) / num_blocks
        ax.add_patch(Rectangle((x_pool - width / 2, 0.0), width, 0.12, color=colors(lb % 10)))
        ax.add_patch(FancyArrowPatch((x0 + (lb + 0.46) * box_w, 0.78), (x_pool, 0.125),
                                     arrowstyle="-|>", mutation_scale=10, lw=1.1,
                                     color=colors(lb % 10)))
        ax.plot([x_pool, label_x[lb]], [0.0, -0.05], color=colors(lb % 10), lw=0.7)
        ax.text(label_x[lb], -0.055, str(b), ha="center", va="top", fontsize=7,
                color=colors(lb % 10), fontweight="bold")
    handles = [Patch(facecolor=colors(0), label="this row's blocks (colour = logical block)"),
               Patch(facecolor=(0.75, 0.75, 0.75), label="owned by another (slot, layer)"),
               Patch(facecolor="white", edgecolor="dimgray", label="free")]
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, -0.08), ncol=3,
              fontsize=7, frameon=False)
    ax.set_title(title or f"slot {slot}, layer {layer}: logical blocks -> physical blocks",
                 fontsize=10)
    fig.tight_layout()
    return fig


MEMORY_COLORS = {"token states": "#3182bd", "reservation": "#9ecae1",
                 "internal fragmentation": "#fdae6b", "external fragmentation & others": "#bdbdbd"}


def plot_memory_use(ours: Mapping[str, Mapping[str, float]],
                    paper: Mapping[str, Mapping[str, float | None]], *, title: str | None = None):
    """How each policy's KV memory is used, in percent: for every policy two stacked bars,
    ``ours`` (policy -> {category: percent}) and, beneath it, ``paper`` (the same keys; a
    category that is None is not broken down there, and what the known ones leave is drawn as
    "external fragmentation & others")."""
    fig, ax = _new_axes(None, (8.6, 0.9 + 0.95 * len(ours)))
    labels, ticks = [], []
    seen = set()
    for i, policy in enumerate(ours):
        for j, (who, parts) in enumerate((("ours", ours[policy]), ("paper", paper.get(policy)))):
            if parts is None:
                continue
            y = i + 0.4 * j
            known = {c: v for c, v in parts.items() if v is not None}
            if "external fragmentation & others" not in known:
                known["external fragmentation & others"] = 100.0 - sum(known.values())
            left = 0.0
            for category, value in known.items():
                if value <= 0:
                    continue
                ax.barh(y, value, left=left, height=0.36, color=MEMORY_COLORS[category],
                        edgecolor="white", label=None if category in seen else category)
                seen.add(category)
                left += value
            ax.text(1.0, y, f"{who}: {known['token states']:.1f}%", ha="left", va="center",
                    fontsize=7.5, color="white", fontweight="bold")
        ticks.append(i + 0.2)
        labels.append(policy)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the KV memory the policy holds (average over the run)")
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)
    if title:
        ax.set_title(title, fontsize=10, pad=24)
    fig.tight_layout()
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
    from paged_tutorial.teaching.harness.addresses import READ_COLORS, UNTOUCHED

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
