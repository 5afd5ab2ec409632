"""Chapter 03 (logical block -> physical block -> address): where the decode kernel reads.

Figures drawn from a ``ReadTrace`` (``paged_tutorial.teaching.oracles.kernel_read_trace``: the
kernel's address arithmetic replayed in NumPy) or from a recording of a real launch
(``backends.numba_cuda.runtime.access_log``): the flat cache buffer with the elements each trace reads
(``plot_buffer_reads``), element index against token position (``plot_address_by_token``),
which thread read which element (``plot_thread_reads``, from an access log or ``thread_reads``),
and, for the puzzles, the K rows one thread block read against the rows it should have read
(``plot_block_reads``) and the block-table entries read against the right ones
(``plot_table_reads``).  matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import textwrap

import numpy as np

from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.teaching.oracles import ReadTrace

__all__ = ["plot_buffer_reads", "plot_address_by_token", "plot_block_reads", "plot_table_reads",
           "plot_thread_reads", "thread_reads"]

FIG_DPI = 80


def _plt():
    import matplotlib.pyplot as plt
    return plt


#: shades of a trace's colour map used for its tokens: first token -> last token
TOKEN_SHADES = (0.15, 0.9)
OWNED_NOT_READ = (0.82, 0.82, 0.82)


def _token_colormap(name: str):
    """The part of colour map ``name`` that ``plot_buffer_reads`` paints tokens with, as a
    colour map of its own (so that its colour bar shows exactly the tiles' colours)."""
    from matplotlib.colors import ListedColormap

    base = _plt().get_cmap(name)
    return ListedColormap(base(np.linspace(*TOKEN_SHADES, 256)), name=f"{name}-tokens")


def plot_buffer_reads(cache: PagedKVCache, traces, labels=None, ncols: int = 4,
                      title: str | None = None):
    """The flat cache buffer, one tile per physical block (K rows on top, V rows below, one
    column per element of KV_DIM).  Elements each trace reads are coloured by the token's
    position in its sequence (one colour map per trace, shown by its colour bar); blocks owned
    by someone else are grey; free blocks white.  Each tile is labelled with its owner (slot,
    layer, logical block) from the block table."""
    plt = _plt()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    c = cache.config
    traces = list(traces) if isinstance(traces, (list, tuple)) else [traces]
    labels = labels or [f"slot {t.slot} q head {t.q_head}" for t in traces]
    cmaps = [_token_colormap(name) for name in ("viridis", "plasma", "cividis", "magma")]
    nb = c.NUM_BLOCKS
    rows_per_block = 2 * c.BLOCK_SIZE
    owners = cache.owner_map()
    per_slot = c.num_layers * c.MAX_BLOCKS_PER_SEQ
    img = np.ones((nb, rows_per_block, c.KV_DIM, 4))
    for b in range(nb):
        if owners[b] >= 0:
            img[b, :, :, :3] = OWNED_NOT_READ
    for trace, cmap in zip(traces, cmaps):
        for index in (trace.k_index, trace.v_index):
            for t in range(trace.seq_len):
                blk = index[t] // c.BLOCK_ELEMS
                row, col = np.divmod(index[t] % c.BLOCK_ELEMS, c.KV_DIM)
                img[blk, row, col] = cmap(t / max(trace.seq_len - 1, 1))
    nrows = -(-nb // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.3 * ncols, 1.3 * nrows + 1.2),
                             dpi=FIG_DPI, squeeze=False)
    for b in range(nrows * ncols):
        ax = axes[b // ncols][b % ncols]
        ax.set_xticks([])
        ax.set_yticks([])
        if b >= nb:
            ax.axis("off")
            continue
        ax.imshow(img[b], aspect="auto", interpolation="nearest")
        ax.axhline(c.BLOCK_SIZE - 0.5, color="black", lw=0.8)
        if b % ncols == 0:
            ax.set_yticks([c.BLOCK_SIZE / 2 - 0.5, 1.5 * c.BLOCK_SIZE - 0.5])
            ax.set_yticklabels(["K", "V"], fontsize=7)
        for h in range(1, c.num_kv_heads):
            ax.axvline(h * c.head_dim - 0.5, color="white", lw=0.6, ls=":")
        if owners[b] >= 0:
            s_, rem = divmod(int(owners[b]), per_slot)
            layer, lb = divmod(rem, c.MAX_BLOCKS_PER_SEQ)
            ax.set_title(f"phys {b}: s{s_} L{layer} lb{lb}", fontsize=7)
        else:
            ax.set_title(f"phys {b}: free", fontsize=7, color="0.5")
    fig.subplots_adjust(left=0.06, right=0.98, top=0.9, bottom=0.24, hspace=0.5, wspace=0.15)
    width = min(0.26, 0.62 / max(len(traces), 1))
    for i, (trace, cmap, label) in enumerate(zip(traces, cmaps, labels)):
        cax = fig.add_axes((0.34 + i * (width + 0.05), 0.09, width, 0.025))
        bar = fig.colorbar(ScalarMappable(Normalize(0, max(trace.seq_len - 1, 1)), cmap),
                           cax=cax, orientation="horizontal")
        bar.set_label(f"{label}: token position", fontsize=7)
        bar.ax.tick_params(labelsize=6)
    handles = [plt.Rectangle((0, 0), 1, 1, fc=OWNED_NOT_READ, ec="0.5", label="owned, not read"),
               plt.Rectangle((0, 0), 1, 1, fc="white", ec="0.5", label="free block")]
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.02, 0.03), ncol=1,
               fontsize=7, frameon=False)
    fig.suptitle(title or "cache buffer: K rows (top) / V rows (bottom) of each physical block; "
                 "columns = KV_DIM", fontsize=8)
    return fig


def thread_reads(trace: ReadTrace) -> dict:
    """{thread: cache elements it reads, in loop order (K then V of each token)} for one thread
    block, from the kernel's NumPy replay: the shape ``AccessLog.by_thread`` has."""
    both = np.stack([trace.k_index, trace.v_index], axis=1)       # [tokens, K/V, head_dim]
    return {d: both[:, :, d].ravel() for d in range(trace.k_index.shape[1])}


def _draw_block(ax, c, block: int, colours: dict, row_labels: bool, head_label: str) -> None:
    """Physical block ``block`` as K rows over V rows x KV_DIM columns, each element in its
    colour from ``colours`` (element index -> RGB; UNTOUCHED where absent)."""
    img = np.ones((2 * c.BLOCK_SIZE, c.KV_DIM, 3)) * np.array(UNTOUCHED)
    for e, colour in colours.items():
        if e // c.BLOCK_ELEMS == block:
            row, col = divmod(e % c.BLOCK_ELEMS, c.KV_DIM)
            img[row, col] = colour
    ax.imshow(img, aspect="auto", interpolation="nearest")
    ax.axhline(c.BLOCK_SIZE - 0.5, color="black", lw=0.8)
    for h in range(1, c.num_kv_heads):
        ax.axvline(h * c.head_dim - 0.5, color="0.4", lw=0.6, ls=":")
    ax.set_title(f"physical block {block}", fontsize=8)
    ax.set_yticks([c.BLOCK_SIZE / 2 - 0.5, 1.5 * c.BLOCK_SIZE - 0.5])
    ax.set_yticklabels(["K rows", "V rows"] if row_labels else [], fontsize=7)
    ax.set_xticks([h * c.head_dim for h in range(c.num_kv_heads)])
    ax.set_xticklabels([f"{head_label} {h}" for h in range(c.num_kv_heads)], fontsize=7)


def plot_thread_reads(config, reads_by_thread: dict, title: str = "", max_tiles: int = 4):
    """Which thread read which element: every physical block a thread block touched, K rows
    on top and V rows below, each element coloured by the thread (0 .. n-1) that read it;
    grey where nobody did, black where more than one thread did.  ``reads_by_thread``:
    ``AccessLog.by_thread(block, "R")`` of a recorded launch, or ``thread_reads(trace)``."""
    plt = _plt()
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    c = config
    reader: dict = {}
    for thread, elements in reads_by_thread.items():
        for e in np.asarray(elements).ravel().tolist():
            reader[e] = thread if reader.get(e, thread) == thread else -1
    blocks = sorted({e // c.BLOCK_ELEMS for e in reader if e >= 0})[:max_tiles]
    n_threads = max(max(reads_by_thread, default=0) + 1, 2)
    cmap = _plt().get_cmap("turbo")
    fig, axes = plt.subplots(1, max(len(blocks), 1), squeeze=False, dpi=FIG_DPI,
                             figsize=(2.7 * max(len(blocks), 1) + 1.2, 3.4))
    colours = {e: (0, 0, 0) if thread < 0 else cmap(thread / (n_threads - 1))[:3]
               for e, thread in reader.items()}
    for ax, b in zip(axes[0], blocks):
        _draw_block(ax, c, b, colours, row_labels=ax is axes[0][0], head_label="kv head")
    if not blocks:
        axes[0][0].axis("off")
    fig.subplots_adjust(left=0.1, right=0.86, top=0.82, bottom=0.1, wspace=0.08)
    bar = fig.colorbar(ScalarMappable(Normalize(0, n_threads - 1), cmap),
                       cax=fig.add_axes((0.88, 0.1, 0.02, 0.72)))
    bar.set_label("thread (threadIdx.x) that read the element", fontsize=7)
    bar.ax.tick_params(labelsize=6)
    fig.suptitle(title or "which thread read which element", fontsize=8)
    return fig


def plot_address_by_token(cache: PagedKVCache, trace: ReadTrace):
    """Element index of K[token, dim 0] and V[token, dim 0] against the token's position:
    contiguous runs inside a block (stride KV_DIM), jumps between physical blocks."""
    plt = _plt()
    c = cache.config
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=FIG_DPI)
    pos = np.arange(trace.seq_len)
    ax.plot(pos, trace.k_index[:, 0], "o-", ms=3, lw=0.8, label="K, dim 0")
    ax.plot(pos, trace.v_index[:, 0], "s-", ms=3, lw=0.8, label="V, dim 0 (K + V_OFFSET)")
    for lb in range(trace.num_blocks):
        x0 = lb * c.BLOCK_SIZE
        ax.axvline(x0 - 0.5, color="0.7", lw=0.6, ls="--")
        ax.text(x0 + 0.2, trace.k_index[x0, 0],
                f" lb {lb} -> phys {trace.physical_block[lb]}", fontsize=7, va="bottom")
    ax.set_xlabel("token position in the sequence")
    ax.set_ylabel("element index in cache.buffer")
    ax.set_title(f"slot {trace.slot}, layer {trace.layer}, q head {trace.q_head} "
                 f"(kv head {trace.kv_head}): where each token's K and V live", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


# --- puzzle figures: what a launch read against what it should have read ------------------

#: colours shared by the puzzle figures (legend and cells use the same values)
READ_COLORS = {"read, as the article's kernel does": (0.17, 0.63, 0.17),
               "should be read, was not": (1.0, 0.50, 0.05),
               "read, should not be": (0.84, 0.15, 0.16)}
UNTOUCHED = (0.93, 0.93, 0.93)


def _classify(expected, reads) -> dict:
    expected = set(int(x) for x in np.asarray(expected).ravel())
    reads = set(int(x) for x in np.asarray(reads).ravel())
    names = list(READ_COLORS)
    return {**{i: names[0] for i in expected & reads}, **{i: names[1] for i in expected - reads},
            **{i: names[2] for i in reads - expected}}


def _legend(fig, used):
    plt = _plt()
    handles = [plt.Rectangle((0, 0), 1, 1, color=READ_COLORS[n], label=n)
               for n in READ_COLORS if n in used]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)


def plot_block_reads(config, expected_elements, read_elements, title: str = "",
                     max_tiles: int = 6):
    """Each physical block touched, as K rows (top) and V rows (bottom) x KV_DIM columns:
    green where the launch read what the article's kernel reads, orange where it missed an
    element, red where it read one it should not.  ``read_elements`` may come from an access
    log (``access_log``) or from the reader's function evaluated on the host."""
    plt = _plt()
    c = config
    cls = _classify(expected_elements, read_elements)
    blocks = sorted({i // c.BLOCK_ELEMS for i in cls if i >= 0})[:max_tiles]
    outside = [i for i in cls if i < 0 or i // c.BLOCK_ELEMS >= c.NUM_BLOCKS]
    fig, axes = plt.subplots(1, max(len(blocks), 1), figsize=(2.6 * max(len(blocks), 1) + 0.6, 3.4),
                             dpi=FIG_DPI, squeeze=False)
    colours = {i: READ_COLORS[name] for i, name in cls.items() if i >= 0}
    for ax, b in zip(axes[0], blocks):
        _draw_block(ax, c, b, colours, row_labels=True, head_label="head")
    if not blocks:
        axes[0][0].axis("off")
    note = f"  ({len(outside)} read(s) outside the buffer)" if outside else ""
    fig.suptitle((title or "cache reads") + note, fontsize=8)
    _legend(fig, set(cls.values()))
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    return fig


def plot_table_reads(config, expected_entries, read_entries, title: str = ""):
    """The flat block table drawn as its [slot][layer] rows x logical-block columns, coloured
    as in ``plot_block_reads``; each cell shows its flat index."""
    plt = _plt()
    c = config
    cls = _classify(expected_entries, read_entries)
    rows, cols = c.max_slots * c.num_layers, c.MAX_BLOCKS_PER_SEQ
    img = np.ones((rows, cols, 3)) * np.array(UNTOUCHED)
    for i, name in cls.items():
        if 0 <= i < rows * cols:
            img[i // cols, i % cols] = READ_COLORS[name]
    fig, ax = plt.subplots(figsize=(max(5.5, min(1.6 + 0.55 * cols, 9)), 1.2 + 0.32 * rows),
                           dpi=FIG_DPI)
    ax.imshow(img, aspect="auto", interpolation="nearest")
    for r in range(rows):
        for col in range(cols):
            ax.text(col, r, str(r * cols + col), ha="center", va="center", fontsize=6, color="0.25")
    ax.set_yticks(range(rows))
    ax.set_yticklabels([f"slot {r // c.num_layers}, layer {r % c.num_layers}" for r in range(rows)],
                       fontsize=7)
    ax.set_xticks(range(cols))
    ax.set_xlabel("logical block", fontsize=8)
    for s in range(1, c.max_slots):
        ax.axhline(s * c.num_layers - 0.5, color="black", lw=0.8)
    outside = [i for i in cls if not 0 <= i < rows * cols]
    note = f"  ({len(outside)} read(s) outside the table)" if outside else ""
    ax.set_title(textwrap.fill((title or "block-table reads") + note, 70), fontsize=8)
    _legend(fig, set(cls.values()))
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    return fig
