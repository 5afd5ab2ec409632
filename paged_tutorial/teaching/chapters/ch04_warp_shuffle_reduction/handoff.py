"""The shared-memory hand-off of one thread block, from the simulator's shared-memory log
(``access_log.SharedLog``): which threads wrote and read each shared cell between two barriers,
and where a write meets another thread's access with no barrier between them (a race).

    with access_log.record_shared_accesses() as log:
        attention.decode(..., parts)
    plot_handoff(log, block=(0, 0))

One column per barrier epoch (the stretch of code between two ``cuda.syncthreads()``), one row
per shared cell; a box says who wrote ("W t0") and how many threads read ("R x64"); a red box
is a race.  matplotlib is imported inside the plotting function only.
"""

from __future__ import annotations

from paged_tutorial.teaching.chapters.ch01_block_layout.layout import FIG_DPI

__all__ = ["handoff_table", "plot_handoff", "plot_q_writes"]


def _threads(threads) -> str:
    from paged_tutorial.teaching.harness.kernel_harness import threads_text

    return threads_text(threads)


def handoff_table(log, block=(0, 0), max_epochs: int = 6) -> dict:
    """{(cell, epoch): {"W": writer threads, "R": reader threads, "race": bool}} for the first
    ``max_epochs`` barrier epochs of ``block``."""
    block = tuple(block)
    racy = {(r.cell, r.write.epoch) for r in log.races() if r.write.block == block}
    table: dict = {}
    for a in log.accesses(block):
        if a.epoch >= max_epochs:
            continue
        entry = table.setdefault((f"{a.array}[{a.index}]", a.epoch),
                                 {"W": set(), "R": set(), "race": False})
        entry[a.op].add(a.thread)
    for key, entry in table.items():
        entry["race"] = key in racy
    return table


def plot_handoff(log, block=(0, 0), max_epochs: int = 6, title: str = ""):
    """The hand-off of ``block`` over its first ``max_epochs`` barrier epochs (see the
    module's docstring)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    table = handoff_table(log, block, max_epochs)
    cells = sorted({cell for cell, _ in table}, key=lambda c: (c.split("[")[0] != "dot_products",
                                                                c))
    epochs = range(max_epochs)
    fig, ax = plt.subplots(figsize=(1.05 * max_epochs + 1.6, 0.55 * max(len(cells), 1) + 1.1),
                           dpi=FIG_DPI)
    for y, cell in enumerate(cells):
        for x in epochs:
            entry = table.get((cell, x))
            if entry is None:
                continue
            colour = "#f4a6a6" if entry["race"] else "#cfe8cf"
            ax.add_patch(Rectangle((x + 0.05, y + 0.08), 0.9, 0.84, color=colour))
            text = []
            if entry["W"]:
                text.append("W t" + _threads(entry["W"]))
            if entry["R"]:
                text.append(f"R x{len(entry['R'])}" if len(entry["R"]) > 2
                            else "R t" + _threads(entry["R"]))
            ax.text(x + 0.5, y + 0.5, "\n".join(text), ha="center", va="center", fontsize=6)
    for x in range(1, max_epochs):
        ax.axvline(x, color="black", lw=1.2, ls="--")
    ax.set_xlim(0, max_epochs)
    ax.set_ylim(0, max(len(cells), 1))
    ax.set_yticks([y + 0.5 for y in range(len(cells))], cells, fontsize=7)
    ax.set_xticks([x + 0.5 for x in epochs], [f"epoch {x}" for x in epochs], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("barrier epochs (dashed: cuda.syncthreads()); red: a write and another "
                  "thread's access with no barrier between", fontsize=6)
    races = sum(entry["race"] for entry in table.values())
    ax.set_title(title or f"shared-memory hand-off of thread block {tuple(block)}: "
                 f"{races} racy box(es)", fontsize=8)
    fig.tight_layout()
    return fig


def plot_q_writes(case, writes_by_thread: dict, row: int = 0, q_head: int = 0):
    """Which thread of thread block (row, q_head) wrote which element of q (the flat
    [rows][q heads][head_dim] array), for a ``puzzles.kernel_harness.KernelCase``: one cell per
    element, coloured by the writing thread; the block's own head is outlined."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle

    n_rows, heads, dim = len(case.rows), case.n_q_heads, case.head_dim
    stride = getattr(case, "q_row_stride", heads * dim)   # q rows may be wider than heads
    grid = np.full((n_rows * heads, dim), np.nan)
    for thread, elements in writes_by_thread.items():
        for e in np.asarray(elements).ravel().tolist():
            r, rem = divmod(int(e), stride)
            if 0 <= r < n_rows and rem < heads * dim:
                grid.flat[r * heads * dim + rem] = thread
    fig, ax = plt.subplots(figsize=(6.4, 0.35 * n_rows * heads + 1.2), dpi=FIG_DPI)
    cmap = plt.get_cmap("turbo").with_extremes(bad="#dddddd")
    ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0, vmax=max(dim - 1, 1),
              aspect="auto", interpolation="nearest")
    own = row * heads + q_head
    ax.add_patch(Rectangle((-0.5, own - 0.5), dim, 1, fill=False, lw=1.5, ec="black"))
    ax.set_yticks(range(n_rows * heads),
                  [f"row {r}, head {h}" for r in range(n_rows) for h in range(heads)],
                  fontsize=6)
    ax.set_xlabel("dim (colour: the thread that wrote it; grey: not written)", fontsize=7)
    ax.tick_params(axis="x", labelsize=6)
    ax.set_title(f"q after the kernel: stores of thread block (row {row}, q head {q_head})",
                 fontsize=8)
    fig.tight_layout()
    return fig
