"""Chapter 03 (logical block -> physical block -> address): where the decode kernel reads.

Figures drawn from a ``ReadTrace`` (``paged_tutorial.oracles.kernel_read_trace``: the kernel's
address arithmetic replayed in NumPy) or from a recording of a real launch
(``backends.numba_cuda.access_log``): the flat cache buffer with the elements each trace reads
(``plot_buffer_reads``), element index against token position (``plot_address_by_token``),
and, for the puzzles, the K rows one thread block read against the rows it should have read
(``plot_block_reads``) and the block-table entries read against the right ones
(``plot_table_reads``).  matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import numpy as np

from ..kv_cache import PagedKVCache
from ..oracles import ReadTrace

__all__ = ["plot_buffer_reads", "plot_address_by_token", "plot_block_reads", "plot_table_reads"]

FIG_DPI = 80


def _plt():
    import matplotlib.pyplot as plt
    return plt


def plot_buffer_reads(cache: PagedKVCache, traces, labels=None, ncols: int = 4,
                      title: str | None = None):
    """The flat cache buffer, one tile per physical block (K rows on top, V rows below, one
    column per element of KV_DIM).  Elements each trace reads are coloured by the token's
    position in its sequence; blocks owned by someone else are grey; free blocks white.
    Each tile is labelled with its owner (slot, layer, logical block) from the block table."""
    plt = _plt()

    c = cache.config
    traces = list(traces) if isinstance(traces, (list, tuple)) else [traces]
    labels = labels or [f"slot {t.slot} q head {t.q_head}" for t in traces]
    cmaps = ["viridis", "plasma", "cividis", "magma"]
    nb = c.NUM_BLOCKS
    rows_per_block = 2 * c.BLOCK_SIZE
    owners = cache.owner_map()
    per_slot = c.num_layers * c.MAX_BLOCKS_PER_SEQ
    img = np.ones((nb, rows_per_block, c.KV_DIM, 4))
    for b in range(nb):
        if owners[b] >= 0:
            img[b, :, :, :3] = 0.82
    for trace, cmap_name in zip(traces, cmaps):
        cmap = plt.get_cmap(cmap_name)
        for which, index in (("K", trace.k_index), ("V", trace.v_index)):
            for t in range(trace.seq_len):
                rel = index[t] - (index[t] // c.BLOCK_ELEMS) * c.BLOCK_ELEMS
                blk = index[t] // c.BLOCK_ELEMS
                row = rel // c.KV_DIM
                col = rel % c.KV_DIM
                color = cmap(0.15 + 0.75 * t / max(trace.seq_len - 1, 1))
                img[blk, row, col] = color
    nrows = -(-nb // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.3 * ncols, 1.25 * nrows + 0.6),
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
            o = int(owners[b])
            s, rem = divmod(o, per_slot)
            layer, lb = divmod(rem, c.MAX_BLOCKS_PER_SEQ)
            ax.set_title(f"phys {b}: s{s} L{layer} lb{lb}", fontsize=7)
        else:
            ax.set_title(f"phys {b}: free", fontsize=7, color="0.5")
    handles = [plt.Line2D([], [], marker="s", ls="", color=plt.get_cmap(m)(0.6), label=lab)
               for lab, m in zip(labels, cmaps)]
    handles.append(plt.Line2D([], [], marker="s", ls="", color="0.82", label="owned, not read"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7,
               frameon=False)
    fig.suptitle(title or "cache buffer: K rows (top) / V rows (bottom) of each physical block; "
                 "columns = KV_DIM", fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
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
