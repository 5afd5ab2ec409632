"""Shared prefix blocks over a real engine run (notebook 09, beyond the article).

``SharingRecorder(engine)`` listens to the cache (``PagedKVCache.add_listener``) and rebuilds,
from the ``BlockEvent`` stream alone, what every physical block is after each engine step: the
block table, each block's reference count, which blocks hold a registered prefix (and its
hash key), which unused blocks are kept cached, which are free.  Nothing is read from the
cache's own bookkeeping, so comparing the two (``SharingRecord.matches``) checks that the
events say everything that happened.

The drawing functions turn a recording into pictures: the physical blocks coloured by their
state and count, layer 0's block table with the physical ids its entries name (two slots
naming the same block share it), and the owned / cached / free curve over the run.
matplotlib and ipywidgets are imported inside the functions that need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paged_tutorial.teaching.chapters.ch06_block_lifetime.lifetime import first_matches, grid_shape

FREE, OWNED, SHARED, CACHED = 0, 1, 2, 3
STATE_NAMES = ("free", "used by one", "shared", "cached (unused)")


class BlockStates:
    """What every physical block is, rebuilt event by event (``apply``)."""

    def __init__(self, num_blocks: int, table_shape: tuple[int, int, int]):
        self.num_blocks = num_blocks
        self.block_table = np.full(table_shape, -1, dtype=np.int32)
        self.ref_counts = np.zeros(num_blocks, dtype=np.int32)
        self.keys: dict[int, int] = {}          # block -> key of the prefix it holds
        self.cached: set[int] = set()           # unused blocks kept for their prefix

    def apply(self, event) -> None:
        b, kind = event.block, event.kind
        entry = (event.slot, event.layer, event.logical_block)
        if kind in ("pop", "share", "reuse"):
            self.block_table[entry] = b
            self.ref_counts[b] += 1
            self.cached.discard(b)
        elif kind in ("push", "unshare", "cache"):
            self.block_table[entry] = -1
            self.ref_counts[b] -= 1
            if kind == "cache":
                self.cached.add(b)
        elif kind == "register":
            self.keys[b] = event.key
        elif kind in ("evict", "unregister"):
            self.keys.pop(b, None)
            self.cached.discard(b)
        else:
            raise ValueError(f"unknown BlockEvent kind {kind!r}")
        if event.ref_count >= 0 and self.ref_counts[b] != event.ref_count:
            raise AssertionError(f"{kind} of block {b}: the event says {event.ref_count} "
                                 f"users, the replay counts {int(self.ref_counts[b])}")

    def states(self) -> np.ndarray:
        """FREE / OWNED / SHARED / CACHED for every physical block."""
        out = np.full(self.num_blocks, FREE, dtype=np.int8)
        out[self.ref_counts == 1] = OWNED
        out[self.ref_counts > 1] = SHARED
        out[list(self.cached)] = CACHED
        return out


@dataclass
class SharingRecord:
    """One engine step, as the recorder rebuilt it from the cache's events.  The first record
    (kind "start") is the state when the recorder was made."""
    index: int
    kind: str                                   # "start" | "prefill" | "decode" | "idle"
    request_ids: list[int]
    slots: list[int]
    num_tokens: int                             # tokens the step computed
    block_table: np.ndarray
    ref_counts: np.ndarray
    states: np.ndarray                          # FREE / OWNED / SHARED / CACHED per block
    keys: dict                                  # block -> prefix key, registered blocks
    events: list = field(default_factory=list)  # the BlockEvents of this step
    finished: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    slot_owner: dict = field(default_factory=dict)      # slot -> request id after the step

    def count(self, state: int) -> int:
        return int((self.states == state).sum())

    def kinds(self) -> dict:
        """How many events of each kind the step had."""
        out: dict = {}
        for e in self.events:
            out[e.kind] = out.get(e.kind, 0) + 1
        return out

    def matches(self, cache) -> bool:
        """Whether the rebuilt state equals the cache's own (table, counts, cached, free)."""
        counts = cache.reference_counts()
        cached = set(cache.evictable_blocks())
        free = set(int(b) for b in cache.free_blocks)
        return (np.array_equal(self.block_table, cache.block_table)
                and np.array_equal(self.ref_counts, counts)
                and set(np.flatnonzero(self.states == CACHED)) == cached
                and set(np.flatnonzero(self.states == FREE)) == free)


class SharingRecorder:
    """Step an engine and record every physical block's state after each step, rebuilt from
    the cache's listener events."""

    def __init__(self, engine):
        self.engine = engine
        self.cache = engine.cache
        self.replay = BlockStates(self.cache.NUM_BLOCKS, self.cache.block_table.shape)
        if (self.cache.block_table >= 0).any():
            raise ValueError("start the recorder on an engine whose cache is empty (every block "
                             "free), so that the events describe every block from the start")
        self._events: list = []
        self.cache.add_listener(self._on_event)
        self.steps: list[SharingRecord] = [self._record(engine.step_count - 1, "start", [], [],
                                                        0)]

    def _on_event(self, event) -> None:
        self._events.append(event)
        self.replay.apply(event)

    def _record(self, index, kind, request_ids, slots, num_tokens, **extra) -> SharingRecord:
        running = self.engine.scheduler.running
        record = SharingRecord(index, kind, list(request_ids), list(slots), num_tokens,
                               self.replay.block_table.copy(), self.replay.ref_counts.copy(),
                               self.replay.states(), dict(self.replay.keys),
                               events=self._events, slot_owner={r.slot: r.request_id
                                                                for r in running}, **extra)
        self._events = []
        return record

    def on_step(self, report) -> SharingRecord:
        """Record a step the engine has just made (pass as ``generate(..., on_step=...)``)."""
        record = self._record(report.index, report.kind, report.request_ids, report.slots,
                              report.num_tokens, finished=list(report.finished),
                              preempted=list(report.preempted))
        self.steps.append(record)
        return record

    def step(self) -> SharingRecord:
        return self.on_step(self.engine.step())

    def run(self, check: bool = True) -> list[SharingRecord]:
        """Step until every request has finished.  ``check``: after each step, the cache's
        invariants hold and the rebuilt state equals the cache's."""
        while self.engine.has_unfinished():
            record = self.step()
            if check:
                self.cache.check_invariants()
                if not record.matches(self.cache):
                    raise AssertionError(f"step {record.index}: the events do not add up to "
                                         "the cache's state")
        return self.steps

    def close(self) -> None:
        self.cache.remove_listener(self._on_event)

    # --- summaries -------------------------------------------------------------------------
    def key_steps(self, limit: int = 5) -> list[int]:
        """Positions in ``steps`` worth a panel, in time order: the first prefill, the first
        share, the first step that leaves blocks cached, the first cache hit on a cached
        block (reuse), the first eviction."""
        tests = [lambda r: r.kind == "prefill",
                 lambda r: "share" in r.kinds(),
                 lambda r: "cache" in r.kinds(),
                 lambda r: "reuse" in r.kinds(),
                 lambda r: "evict" in r.kinds()]
        return first_matches(self.steps, tests, limit)


# --- drawing ---------------------------------------------------------------------------------

STATE_RGBA = {FREE: (0.92, 0.92, 0.92, 1.0), OWNED: (0.55, 0.70, 0.88, 1.0),
              CACHED: (0.62, 0.85, 0.55, 1.0)}
SHARED_CMAP = "Oranges"
MAX_COUNT_SHADE = 4                   # counts of 4 and more get the darkest shade


def shared_rgba(count: int):
    import matplotlib

    shade = 0.45 + 0.5 * (min(count, MAX_COUNT_SHADE) - 2) / (MAX_COUNT_SHADE - 2)
    return matplotlib.colormaps[SHARED_CMAP](shade)


def block_colors(record: SharingRecord) -> np.ndarray:
    """RGBA [num_blocks, 4]: free grey, used by one blue, cached green, shared orange (darker
    for more users)."""
    colors = np.array([STATE_RGBA.get(int(s), (0, 0, 0, 1)) for s in record.states])
    for b in np.flatnonzero(record.states == SHARED):
        colors[b] = shared_rgba(int(record.ref_counts[b]))
    return colors


def draw_block_states(ax, record: SharingRecord, title: str | None = None,
                      marker_size: float = 9.0):
    """The physical blocks after ``record``'s step, coloured by state; dots mark blocks
    evicted in this step."""
    n = len(record.states)
    rows, cols = grid_shape(n)
    rgba = np.ones((rows * cols, 4))
    rgba[:n] = block_colors(record)
    ax.imshow(rgba.reshape(rows, cols, 4), interpolation="nearest", aspect="equal")
    if cols <= 60:
        ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.5)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    evicted = [e.block for e in record.events if e.kind == "evict"]
    if evicted:
        b = np.asarray(evicted)
        ax.scatter(b % cols, b // cols, s=marker_size, marker="x", c="crimson", linewidths=1)
    ax.set_title(step_title(record) if title is None else title, fontsize=9)


def step_title(record: SharingRecord) -> str:
    if record.kind == "start":
        return "before the first step"
    k = record.kinds()
    parts = [f"{k[name]} {name}" for name in ("share", "reuse", "cache", "evict") if k.get(name)]
    return (f"step {record.index} {record.kind}, {record.num_tokens} computed\n"
            + (", ".join(parts) if parts else " "))


def draw_table(ax, record: SharingRecord, layer: int = 0, max_logical: int | None = None,
               show_owner: bool = True):
    """Layer ``layer``'s block table after the step: one row per slot, one column per logical
    block, each cell the physical block id it names, coloured like the block (``show_owner``:
    the request holding each slot in the row label)."""
    table = record.block_table[:, layer, :]
    used = np.flatnonzero((table >= 0).any(axis=0))
    width = max_logical or (int(used.max()) + 1 if used.size else 1)
    colors = block_colors(record)
    slots = table.shape[0]
    rgba = np.ones((slots, width, 4))
    for s in range(slots):
        for lb in range(width):
            if table[s, lb] >= 0:
                rgba[s, lb] = colors[table[s, lb]]
    ax.imshow(rgba, interpolation="nearest", aspect="auto")
    for s in range(slots):
        for lb in range(width):
            if table[s, lb] >= 0:
                ax.text(lb, s, str(int(table[s, lb])), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(slots), [f"slot {s}" + (f" r{record.slot_owner[s]}"
                                                if show_owner and s in record.slot_owner else "")
                                 for s in range(slots)], fontsize=8)
    ax.set_xticks(range(width), [str(i) for i in range(width)], fontsize=7)
    ax.set_xlabel(f"logical block (layer {layer}; every layer alike)", fontsize=8)
    ax.set_xticks(np.arange(-0.5, width, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, slots, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)


def plot_usage(ax, steps: list[SharingRecord], current: int | None = None):
    """Blocks used, cached and free after every step (stacked)."""
    xs = np.array([s.index for s in steps])
    used = np.array([s.count(OWNED) + s.count(SHARED) for s in steps])
    cached = np.array([s.count(CACHED) for s in steps])
    free = np.array([s.count(FREE) for s in steps])
    ax.stackplot(xs, used, cached, free, step="post",
                 colors=[STATE_RGBA[OWNED], STATE_RGBA[CACHED], STATE_RGBA[FREE]],
                 labels=["used", "cached (unused)", "free"])
    if current is not None:
        ax.axvline(steps[current].index, color="black", linewidth=1)
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(0, len(steps[0].states))
    ax.set_xlabel("engine step", fontsize=8)
    ax.set_ylabel("physical blocks", fontsize=8)
    ax.set_title("used + cached + free = NUM_BLOCKS", fontsize=8)
    ax.tick_params(labelsize=8)


def _legend(fig, ncol: int = 6):
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=STATE_RGBA[FREE], label="free"),
               Patch(color=STATE_RGBA[OWNED], label="used by one request"),
               Patch(color=shared_rgba(2), label="shared by 2"),
               Patch(color=shared_rgba(MAX_COUNT_SHADE), label=f"shared by {MAX_COUNT_SHADE}+"),
               Patch(color=STATE_RGBA[CACHED], label="cached, unused"),
               Line2D([], [], marker="x", color="crimson", linestyle="", label="evicted")]
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)


def plot_step(steps: list[SharingRecord], pos: int, dpi: int = 80, max_logical: int | None = None):
    """One recorded step: the physical block states, layer 0's table and the usage curve."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(9.0, 4.4), dpi=dpi)
    grid = fig.add_gridspec(2, 2, width_ratios=[1.0, 1.25], height_ratios=[1.0, 1.0],
                            wspace=0.25, hspace=0.6, bottom=0.2, top=0.9, left=0.03,
                            right=0.98)
    draw_block_states(fig.add_subplot(grid[:, 0]), steps[pos], marker_size=14)
    draw_table(fig.add_subplot(grid[0, 1]), steps[pos], max_logical=max_logical)
    plot_usage(fig.add_subplot(grid[1, 1]), steps, current=pos)
    _legend(fig, ncol=3)
    return fig


def plot_sharing(steps: list[SharingRecord], positions: list[int], dpi: int = 80,
                 max_logical: int | None = None):
    """Static figure: for each of ``positions`` (indices into ``steps``), the block states
    above layer 0's table; the usage curve beneath."""
    import matplotlib.pyplot as plt

    n = len(positions)
    fig = plt.figure(figsize=(max(2.7 * n + 0.4, 6.0), 6.4), dpi=dpi)
    grid = fig.add_gridspec(3, n, height_ratios=[2.2, 1.0, 1.1], hspace=0.55, wspace=0.25,
                            bottom=0.14, top=0.93, left=0.08, right=0.98)
    width = max_logical or max(
        int(np.flatnonzero((steps[p].block_table[:, 0, :] >= 0).any(axis=0)).max(initial=0)) + 1
        for p in positions)
    for i, pos in enumerate(positions):
        draw_block_states(fig.add_subplot(grid[0, i]), steps[pos])
        ax = fig.add_subplot(grid[1, i])
        draw_table(ax, steps[pos], max_logical=width, show_owner=False)
        if i:
            ax.set_yticklabels([])
    ax = fig.add_subplot(grid[2, :])
    plot_usage(ax, steps)
    for pos in positions:
        ax.axvline(steps[pos].index, color="black", linewidth=0.8, alpha=0.5)
    _legend(fig)
    return fig


def sharing_widget(steps: list[SharingRecord], dpi: int = 80, max_logical: int | None = None):
    """An IntSlider over the recorded steps and an Output that redraws ``plot_step``."""
    from paged_tutorial.teaching.harness.widgets import step_slider

    return step_slider(steps, lambda pos: plot_step(steps, pos, dpi=dpi,
                                                    max_logical=max_logical),
                       "pt-sharing", "340px")
