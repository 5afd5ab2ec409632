"""One thread block of the decode kernel, drawn before the puzzles use its words: threads (one
per head dimension) grouped into warps of 32 lanes, the padding lanes of a partly used last
warp (``owns_dim`` False), and the block's shared memory (``dot_products``, one cell per warp,
and ``score``), with the path one token's score takes through them between the barriers."""

from __future__ import annotations

from paged_tutorial.backends.numba_cuda.kernels.attention import WARP_SIZE, block_threads
from paged_tutorial.teaching.chapters.ch01_block_layout.layout import FIG_DPI

OWNS = "#9ecae1"          # a thread that holds one head dimension
PADDING = "0.85"          # a lane past head_dim: owns_dim False
SHARED = "#fdd0a2"        # shared memory cells


def block_layout(head_dim: int) -> dict:
    """The numbers the figure draws: threads, warps, the lanes that own a dimension."""
    threads = block_threads(head_dim)
    warps = threads // WARP_SIZE
    return {"head_dim": head_dim, "threads": threads, "warps": warps,
            "padding": threads - head_dim, "lane0": [w * WARP_SIZE for w in range(warps)]}


def plot_thread_block(head_dim: int = 40):
    """The block of the decode kernel for ``head_dim``: each thread a cell (lanes of a warp side
    by side), padding lanes grey; below, the shared arrays and the score's path: each warp's
    lane 0 writes its warp's sum into ``dot_products[warp]``; barrier; thread 0 adds the cells,
    scales and writes ``score[0]``; barrier; every thread reads ``score[0]``."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    info = block_layout(head_dim)
    threads, warps = info["threads"], info["warps"]
    fig, ax = plt.subplots(figsize=(min(0.09 * threads + 2.5, 11), 3.6), dpi=FIG_DPI)
    for t in range(threads):
        ax.add_patch(Rectangle((t, 3), 1, 1, facecolor=OWNS if t < head_dim else PADDING,
                               edgecolor="white", lw=0.4))
    for w in range(warps):
        x0 = w * WARP_SIZE
        ax.add_patch(Rectangle((x0, 3), WARP_SIZE, 1, fill=False, edgecolor="black", lw=1.0))
        ax.text(x0 + WARP_SIZE / 2, 4.35, f"warp {w}: lanes 0-31 = threads {x0}-{x0 + 31}",
                ha="center", fontsize=7)
    if info["padding"]:
        ax.text(head_dim + info["padding"] / 2, 3.5, "owns_dim\nFalse", ha="center",
                va="center", fontsize=6)
    # shared memory: dot_products[warps] and score[1]
    cell = min(WARP_SIZE / 2, threads / (warps + 2))
    for w in range(warps):
        x = w * WARP_SIZE + WARP_SIZE / 2 - cell / 2
        ax.add_patch(Rectangle((x, 1), cell, 0.8, facecolor=SHARED, edgecolor="black", lw=0.8))
        ax.text(x + cell / 2, 1.4, f"dot_products[{w}]", ha="center", va="center", fontsize=7)
        ax.add_patch(FancyArrowPatch((w * WARP_SIZE + 0.5, 3), (x + cell / 2, 1.8),
                                     arrowstyle="->", mutation_scale=8, color="tab:red"))
    sx = threads + 2
    ax.add_patch(Rectangle((sx, 1), cell * 0.7, 0.8, facecolor=SHARED, edgecolor="black", lw=0.8))
    ax.text(sx + cell * 0.35, 1.4, "score[0]", ha="center", va="center", fontsize=7)
    ax.add_patch(FancyArrowPatch((0.5, 1.0), (sx, 1.2), arrowstyle="->", mutation_scale=8,
                                 color="tab:blue", connectionstyle="arc3,rad=0.25"))
    ax.text(0, 0.2, "1. lane 0 of each warp writes its warp's sum (red)   2. barrier   "
                    "3. thread 0 adds the cells, scales, writes score[0] (blue)   4. barrier   "
                    "5. every thread reads score[0]", fontsize=6.5)
    ax.text(-1, 3.5, "threads", ha="right", va="center", fontsize=8)
    ax.text(-1, 1.4, "shared\nmemory", ha="right", va="center", fontsize=8)
    ax.set_xlim(-9, sx + cell + 2)
    ax.set_ylim(-0.2, 4.8)
    ax.axis("off")
    ax.set_title(f"one thread block for head_dim {head_dim}: {threads} threads in {warps} "
                 f"warp(s), {info['padding']} padding lane(s)", fontsize=9)
    fig.tight_layout()
    return fig
