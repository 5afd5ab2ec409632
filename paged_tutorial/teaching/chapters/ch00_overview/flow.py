"""The article's flow in one figure: free_blocks -> block table -> kernel -> byte addresses ->
score -> online softmax -> output, and the release that gives the blocks back (the flowchart
of the article's section on logical block -> physical block -> byte address, drawn as a map of
the notebooks).

``flow_values(engine, slot)`` reads, through public attributes only, what a live engine holds
at that moment for one slot (the next free blocks, the slot's row of the table in layer 0, its
sequence length, one K address); ``plot_article_flow(values)`` writes those values into the
boxes, so the figure shows the state of a real run, not an illustration.
"""

from __future__ import annotations

#: (key, title, what happens, article lines, notebook) for each box, in flow order
STAGES = (
    ("free", "free_blocks", "a stack of physical block ids;\npop to allocate, push to release",
     "main.cpp:575-581", "06"),
    ("table", "block_table",
     "[slot, layer, logical block] -> physical;\nprefill pops where an entry is -1,\n"
     "decode at the first row of a block",
     "main.cpp:264-272, 859-865", "02"),
    ("kernel", "pagedAttentionKernel",
     "for each logical block < ceil(seq_len/16):\nphysical = block_table[...]",
     "kernels.cu:470-481", "03"),
    ("address", "byte address",
     "K = phys*BLOCK_BYTES + token*KV_DIM*2\n+ kv_head*64*2 + thread*2\nV = K + V_OFFSET",
     "kernels.cu:484-485", "01, 03"),
    ("score", "score of one token", "q.k per thread, warp shuffle sum,\ntwo warps combined, / 8",
     "kernels.cu:486-508", "04"),
    ("softmax", "online softmax", "running max m, denominator d, acc;\nold terms x exp(m_old - m)",
     "kernels.cu:509-519", "05"),
    ("output", "output = acc / d", "written over its own q\n(in place), then O projection",
     "kernels.cu:522, main.cpp:878", "05"),
    ("release", "release (slot ends)", "layer by layer, logical by logical:\npush, entry = -1",
     "main.cpp:1018-1029", "06"),
)

#: grid position (column, row) of each box: the read path runs along the top row and back
#: along the bottom one; release closes the loop to free_blocks
POSITIONS = {"free": (0, 0), "table": (1, 0), "kernel": (2, 0), "address": (3, 0),
             "score": (3, 1), "softmax": (2, 1), "output": (1, 1), "release": (0, 1)}
COLORS = {"free": "#e5f5e0", "table": "#e5f5e0", "kernel": "#deebf7", "address": "#deebf7",
          "score": "#fee6ce", "softmax": "#fee6ce", "output": "#fee6ce", "release": "#e5f5e0"}


def flow_values(engine, slot: int, layer: int = 0, kv_head: int = 0) -> dict:
    """What the engine holds now for ``slot`` (which must be running): one line per box."""
    cache = engine.cache
    c = cache.config
    request = next((r for r in engine.scheduler.running if r.slot == slot), None)
    if request is None:
        raise ValueError(f"slot {slot} holds no running request: step the engine first")
    seq_len = request.num_computed_tokens
    n_logical = c.blocks_for_tokens(seq_len)
    row = [int(b) for b in cache.block_table[slot, layer, :n_logical + 1]]
    last = seq_len - 1
    physical = row[last // c.BLOCK_SIZE]
    k = cache.k_byte_offset(physical, last % c.BLOCK_SIZE, kv_head)
    tail = ", ".join(str(b) for b in cache.free_blocks[-3:])
    return {
        "free": f"[..., {tail}]  {cache.num_free} free",
        "table": f"[{slot}, {layer}, :] = {row}",
        "kernel": f"seq_len {seq_len} -> {n_logical} logical blocks",
        "address": f"token {last}: K at byte {k:,}",
        "release": f"slot {slot} owns {cache.blocks_owned(slot)} blocks (all layers)",
    }


def plot_article_flow(values: dict | None = None, title: str | None = None):
    """The flow as 8 boxes in a loop; ``values`` (``flow_values``) adds a live line to some."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    values = values or {}
    fig, ax = plt.subplots(figsize=(12.5, 5.6), dpi=80)
    ax.set_xlim(-0.05, 4.25)
    ax.set_ylim(-0.15, 2.05)
    ax.axis("off")
    w, h = 0.88, 0.78
    centers = {}
    for key, name, what, lines, notebook in STAGES:
        col, row = POSITIONS[key]
        x, y = col * 1.07 + 0.03, 1.12 - row * 1.08
        centers[key] = (x + w / 2, y + h / 2)
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.012,rounding_size=0.04",
                                    facecolor=COLORS[key], edgecolor="dimgray", lw=1))
        ax.text(x + w / 2, y + h - 0.06, name, ha="center", va="top", fontsize=9,
                fontweight="bold")
        ax.text(x + w / 2, y + h - 0.19, what, ha="center", va="top", fontsize=7.2)
        if key in values:
            ax.text(x + w / 2, y + 0.17, values[key], ha="center", va="center", fontsize=6.8,
                    color="#08519c", family="monospace", wrap=True)
        ax.text(x + 0.03, y + 0.04, lines, ha="left", va="bottom", fontsize=6.3, color="dimgray")
        ax.text(x + w - 0.03, y + 0.04, f"notebook {notebook}", ha="right", va="bottom",
                fontsize=6.3, color="dimgray", style="italic")

    def arrow(a, b, text="", dashed=False, rad=0.0):
        (xa, ya), (xb, yb) = centers[a], centers[b]
        if ya == yb:                       # same row: edge to edge
            sign = 1 if xb > xa else -1
            start, end = (xa + sign * w / 2, ya), (xb - sign * w / 2, yb)
        elif xa == xb:                     # same column: bottom to top
            sign = 1 if yb > ya else -1
            start, end = (xa, ya + sign * h / 2), (xb, yb - sign * h / 2)
        else:
            start, end = (xa, ya - h / 2), (xb, yb + h / 2)
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                     color="black" if not dashed else "dimgray", lw=1.2,
                                     linestyle="--" if dashed else "-",
                                     connectionstyle=f"arc3,rad={rad}"))
        if text and ya == yb:              # a label above a horizontal arrow
            ax.text((start[0] + end[0]) / 2, ya + 0.03, text, fontsize=7, color="dimgray",
                    ha="center", va="bottom")
        elif text:
            ax.text((start[0] + end[0]) / 2 + 0.03, (start[1] + end[1]) / 2, text, fontsize=7,
                    color="dimgray", ha="left", va="center")

    arrow("free", "table", "pop")
    arrow("table", "kernel", "to the\nGPU")
    arrow("kernel", "address")
    arrow("address", "score", "load K, V")
    arrow("score", "softmax")
    arrow("softmax", "kernel", "next token /\nlogical block", dashed=True, rad=-0.25)
    arrow("softmax", "output", "done")
    arrow("output", "release", "slot\nends", dashed=True)
    arrow("release", "free", "push", dashed=True)
    ax.set_title(title or "The article's flow: a block's life (green), the kernel's read path "
                 "(blue), the arithmetic on what it read (orange)", fontsize=10)
    fig.tight_layout()
    return fig
