"""The lifetime of physical blocks over a real engine run (article part 6, the section on
``free_blocks``: ``src/main.cpp:1018-1029``, ``266-272``, ``859-865``, ``552/876/1030``).

``LifetimeRecorder(engine)`` drives ``engine.step()`` and, after every step, keeps a copy of
the block table, the size of the free list, the physical blocks popped from and pushed back to
``engine.cache.free_blocks`` (in the order the cache did it) and how many block-table entries
the step's device sync carried.  The pops and pushes are observed, not inferred: through the
cache's event hook (``cache.add_listener``).

The drawing functions turn a recording into the *physical* view the block table hides: one
cell per physical block, coloured by the (slot, layer) that owns it, grey when free.
matplotlib and ipywidgets are imported inside the functions that need them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

INT32_BYTES = 4
INDEX_BYTES = 8          # the engine scatters changed entries with int64 indices


# --- recording -----------------------------------------------------------------------------

@dataclass
class StepRecord:
    """One engine step, as the recorder saw it.  The first record (kind "start") is the state
    when the recorder was made; its index is the engine's previous step (-1 on a new engine)."""
    index: int
    kind: str                                   # "start" | "prefill" | "decode" | "idle"
    request_ids: list[int]
    slots: list[int]
    block_table: np.ndarray                     # int32 copy [slots, layers, MAX_BLOCKS_PER_SEQ]
    num_free: int
    popped: list[int] = field(default_factory=list)    # blocks taken from free_blocks, in order
    pushed: list[int] = field(default_factory=list)    # blocks given back, in order
    preempted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    new_tokens: dict = field(default_factory=dict)     # request id -> token id
    slot_owner: dict = field(default_factory=dict)     # slot -> request id after the step
    num_computed_tokens: dict = field(default_factory=dict)     # request id -> tokens in the cache
    synced_entries: int = 0                     # block-table entries the step's sync carried
    seconds: float = 0.0

    @property
    def releases(self) -> int:
        """Slots whose blocks went back this step (finished or preempted)."""
        return len(self.finished) + len(self.preempted)


class LifetimeRecorder:
    """Step an engine and record the block table and the free list after every step.

    Pops and pushes come from the cache's own event hook (``cache.add_listener``)."""

    def __init__(self, engine):
        self.engine = engine
        self.cache = engine.cache
        self.log: list[tuple[str, int]] = []
        self.cache.add_listener(self._on_block_event)
        self.closed = False
        self._log_mark = 0
        self._synced_mark = self.cache.dirty_entries_synced
        self.steps: list[StepRecord] = [self._record_start()]

    def _on_block_event(self, event) -> None:
        self.log.append((event.kind, int(event.block)))

    def _state(self) -> tuple[dict, dict]:
        running = self.engine.scheduler.running
        return ({r.slot: r.request_id for r in running},
                {r.request_id: r.num_computed_tokens for r in running})

    def _record_start(self) -> StepRecord:
        owner, cached = self._state()
        before = self.engine.step_count - 1                     # the step before the next one
        return StepRecord(before, "start", [], [], self.cache.block_table.copy(),
                          self.cache.num_free, slot_owner=owner, num_computed_tokens=cached)

    def step(self) -> StepRecord:
        """Run one ``engine.step()`` and record it."""
        return self.on_step(self.engine.step())

    def on_step(self, report) -> StepRecord:
        """Record a step the engine has just made; pass this as ``engine.generate(...,
        on_step=recorder.on_step)`` to watch a ``generate`` call."""
        if self.closed:
            raise RuntimeError("this LifetimeRecorder was closed: it no longer sees pops and "
                               "pushes; make a new one")
        events = self.log[self._log_mark:]
        owner, cached = self._state()
        record = StepRecord(
            index=report.index, kind=report.kind, request_ids=list(report.request_ids),
            slots=list(report.slots), block_table=self.cache.block_table.copy(),
            num_free=self.cache.num_free,
            popped=[b for op, b in events if op == "pop"],
            pushed=[b for op, b in events if op == "push"],
            preempted=list(report.preempted), finished=list(report.finished),
            new_tokens=dict(report.new_tokens), slot_owner=owner, num_computed_tokens=cached,
            synced_entries=self.cache.dirty_entries_synced - self._synced_mark,
            seconds=report.seconds)
        self._log_mark = len(self.log)
        self._synced_mark = self.cache.dirty_entries_synced
        self.steps.append(record)
        return record

    def run(self, check_invariants: bool = True) -> list[StepRecord]:
        """Step until every request has finished; check the cache's invariants each step."""
        while self.engine.has_unfinished():
            self.step()
            if check_invariants:
                self.cache.check_invariants()
        return self.steps

    def close(self) -> None:
        """Stop watching the cache's pops and pushes."""
        if not self.closed:
            self.cache.remove_listener(self._on_block_event)
            self.closed = True

    # --- summaries -------------------------------------------------------------------------
    def reused_blocks(self) -> list[tuple[int, int]]:
        """(step index, block) for every pop of a block that someone had owned before."""
        seen, reused = set(), []
        for rec in self.steps:
            reused += [(rec.index, block) for block in rec.popped if block in seen]
            seen |= set(rec.popped)
        return reused

    def fullest_step(self) -> int:
        """Position in ``steps`` of the first step with the fewest free blocks."""
        return int(np.argmin([s.num_free for s in self.steps]))

    def key_steps(self, limit: int = 5) -> list[int]:
        """Positions in ``steps`` worth a panel, in time order: the first prefill, release,
        reuse of a freed block, preemption, and the prefill that re-admits a preempted
        request (each when the run has one)."""
        reused_at = {i for i, _ in self.reused_blocks()}
        first = {}                        # request id -> step index of its first preemption
        for rec in self.steps:
            for rid in rec.preempted:
                first.setdefault(rid, rec.index)
        tests = [lambda r: r.kind == "prefill", lambda r: r.releases > 0,
                 lambda r: r.index in reused_at, lambda r: bool(r.preempted),
                 lambda r: r.kind == "prefill" and any(first.get(rid, r.index) < r.index
                                                       for rid in r.request_ids)]
        return first_matches(self.steps, tests, limit)


def first_matches(steps: list, tests: list, limit: int) -> list[int]:
    """Positions in ``steps`` of the first step passing each test, in time order, at most
    ``limit`` of them."""
    picks = []
    for test in tests:
        pos = next((pos for pos, rec in enumerate(steps) if test(rec)), None)
        if pos is not None:
            picks.append(pos)
    return sorted(set(picks))[:limit]


# --- block-table traffic ---------------------------------------------------------------------

def article_sync_entries(record: StepRecord, table_entries: int, num_layers: int) -> int:
    """Entries the article's engine would copy host->device for this step: the whole table
    after a prefill (``src/main.cpp:552``), once per layer in a decode step (``:876``) and
    once after each slot release (``:1030``)."""
    copies = {"prefill": 1, "decode": num_layers}.get(record.kind, 0) + record.releases
    return copies * table_entries


def traffic_table(steps: list[StepRecord], table_entries: int, num_layers: int) -> dict:
    """Totals over a recording: entries and bytes under the article's whole-table copies vs
    the entries this engine's sync actually carried (values int32 + indices int64)."""
    run = [s for s in steps if s.kind in ("prefill", "decode")]
    article = sum(article_sync_entries(s, table_entries, num_layers) for s in run)
    engine = sum(s.synced_entries for s in run)
    return {
        "steps": len(run),
        "article_entries": article,
        "article_bytes": article * INT32_BYTES,
        "engine_entries": engine,
        "engine_bytes": engine * (INT32_BYTES + INDEX_BYTES),
        "engine_copies": sum(1 for s in run if s.synced_entries),
    }


# --- drawing ---------------------------------------------------------------------------------

SLOT_CMAPS = ("Blues", "Oranges", "Greens", "Purples", "Reds", "Greys")
FREE_RGBA = (0.90, 0.90, 0.90, 1.0)


def grid_shape(num_blocks: int, aspect: float = 1.4) -> tuple[int, int]:
    """(rows, cols) for drawing ``num_blocks`` cells, about ``aspect`` times wider than tall."""
    cols = max(1, math.ceil(math.sqrt(num_blocks * aspect)))
    return math.ceil(num_blocks / cols), cols


def owner_colors(block_table: np.ndarray, num_blocks: int) -> np.ndarray:
    """RGBA [num_blocks, 4]: the owning (slot, layer) of each physical block, free in grey.
    Slot picks the hue, layer the shade (layer 0 light, last layer dark)."""
    import matplotlib

    slots, layers, _ = block_table.shape
    colors = np.tile(np.array(FREE_RGBA), (num_blocks, 1))
    for slot in range(slots):
        cmap = matplotlib.colormaps[SLOT_CMAPS[slot % len(SLOT_CMAPS)]]
        for layer in range(layers):
            owned = block_table[slot, layer]
            owned = owned[owned >= 0]
            shade = 0.35 + 0.6 * (layer / max(1, layers - 1))
            colors[owned] = cmap(shade)
    return colors


def draw_block_map(ax, record: StepRecord, num_blocks: int, title: str | None = None,
                   marker_size: float = 9.0):
    """One panel: the physical blocks after ``record``'s step; dots mark blocks popped in this
    step, crosses blocks pushed back."""
    rows, cols = grid_shape(num_blocks)
    rgba = np.ones((rows * cols, 4))
    rgba[:num_blocks] = owner_colors(record.block_table, num_blocks)
    ax.imshow(rgba.reshape(rows, cols, 4), interpolation="nearest", aspect="equal")
    if cols <= 60:                      # cell borders only while cells are big enough
        ax.set_xticks(np.arange(-0.5, cols, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, rows, 1), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.5)
    ax.tick_params(which="both", length=0, labelbottom=False, labelleft=False)
    for blocks, marker, color in ((record.popped, "o", "black"), (record.pushed, "x", "crimson")):
        if blocks:
            b = np.asarray(blocks)
            ax.scatter(b % cols, b // cols, s=marker_size, marker=marker, c=color, linewidths=1)
    if title is None:
        title = step_title(record)
    ax.set_title(title, fontsize=9)


def step_title(record: StepRecord) -> str:
    if record.kind == "start":
        return f"before step {record.index + 1}: {record.num_free} free"
    owners = ", ".join(f"s{s}=r{r}" for s, r in sorted(record.slot_owner.items())) or "no slot"
    events = []
    if record.popped:
        events.append(f"-{len(record.popped)}")
    if record.pushed:
        events.append(f"+{len(record.pushed)}")
    if record.preempted:
        events.append("preempt r" + ",r".join(map(str, record.preempted)))
    ev = (" (" + " ".join(events) + ")") if events else ""
    return f"step {record.index} {record.kind}{ev}\n{owners}; {record.num_free} free"


def _legend(fig, num_slots: int, num_layers: int, ncol: int | None = None):
    import matplotlib
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=matplotlib.colormaps[SLOT_CMAPS[s % len(SLOT_CMAPS)]](0.65),
                     label=f"slot {s} (layer 0 light .. {num_layers - 1} dark)")
               for s in range(num_slots)]
    handles += [Patch(color=FREE_RGBA, label="free"),
                Line2D([], [], marker="o", color="black", linestyle="", label="popped this step"),
                Line2D([], [], marker="x", color="crimson", linestyle="",
                       label="pushed back this step")]
    fig.legend(handles=handles, loc="lower center", ncol=ncol or len(handles), fontsize=8,
               frameon=False)


def plot_free_list(ax, steps: list[StepRecord], num_blocks: int, current: int | None = None):
    """Free-list size after every engine step (x = step index; the start record sits one step
    before the first recorded);
    red dots at preemptions, a line at position ``current`` of ``steps``."""
    xs = np.array([s.index for s in steps])
    ax.step(xs, [s.num_free for s in steps], where="post", color="dimgray")
    pre = [s for s in steps if s.preempted]
    if pre:
        ax.scatter([s.index for s in pre], [s.num_free for s in pre], color="crimson", zorder=3,
                   s=16)
    ax.set_title("len(free_blocks) after each step" + ("; red dot: preemption" if pre else ""),
                 fontsize=8)
    if current is not None:
        ax.axvline(steps[current].index, color="tab:blue", linewidth=1)
    ax.set_ylim(0, num_blocks * 1.05)
    ax.set_xlabel("engine step", fontsize=8)
    ax.set_ylabel("free blocks", fontsize=8)
    ax.tick_params(labelsize=8)


def plot_lifetime(steps: list[StepRecord], positions: list[int], num_blocks: int,
                  dpi: int = 80):
    """Static figure: block maps at ``positions`` (indices into ``steps``) side by side, and
    the free-list size over the whole run beneath them."""
    import matplotlib.pyplot as plt

    n = len(positions)
    wide = n >= 4                       # room for the legend on one line
    fig = plt.figure(figsize=(max(2.6 * n + 0.4, 6.0), 4.6 if wide else 4.9), dpi=dpi)
    grid = fig.add_gridspec(2, n, height_ratios=[2.3, 1.0], hspace=0.45, wspace=0.08,
                            bottom=0.2 if wide else 0.25, top=0.9, left=0.08, right=0.98)
    for i, pos in enumerate(positions):
        draw_block_map(fig.add_subplot(grid[0, i]), steps[pos], num_blocks)
    ax = fig.add_subplot(grid[1, :])
    plot_free_list(ax, steps, num_blocks)
    for pos in positions:
        ax.axvline(steps[pos].index, color="tab:blue", linewidth=0.8, alpha=0.5)
    slots, layers, _ = steps[0].block_table.shape
    _legend(fig, slots, layers, ncol=None if wide else 3)
    return fig


def plot_step(steps: list[StepRecord], pos: int, num_blocks: int, dpi: int = 80):
    """One recorded step: its block map and the free-list curve with a marker at ``pos``."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7.5, 3.6), dpi=dpi)
    grid = fig.add_gridspec(1, 2, width_ratios=[1.0, 1.3], wspace=0.25, bottom=0.3,
                            top=0.86, left=0.03, right=0.98)
    draw_block_map(fig.add_subplot(grid[0, 0]), steps[pos], num_blocks, marker_size=14)
    plot_free_list(fig.add_subplot(grid[0, 1]), steps, num_blocks, current=pos)
    slots, layers, _ = steps[0].block_table.shape
    _legend(fig, slots, layers, ncol=3)
    return fig


def lifetime_widget(steps: list[StepRecord], num_blocks: int, dpi: int = 80):
    """An IntSlider over the recorded engine steps (the first value is the start record) and an Output
    that redraws ``plot_step`` for the chosen one."""
    from paged_tutorial.teaching.harness.widgets import step_slider

    return step_slider(steps, lambda pos: plot_step(steps, pos, num_blocks, dpi=dpi),
                       "pt-lifetime", "280px")


def plot_table_and_free_list(table, free_blocks, article_table, article_free_blocks,
                             title: str = ""):
    """A puzzle's cache next to the article's engine's after the same step: each block table
    as [slot, layer] rows x logical-block columns with the physical ids (entries that differ
    in red), and each free list as a strip whose right end is the next block popped."""
    import matplotlib.pyplot as plt

    from paged_tutorial.teaching.harness.addresses import READ_COLORS, UNTOUCHED

    wrong = READ_COLORS["read, should not be"]
    tables = (np.asarray(table), np.asarray(article_table))
    frees = (list(free_blocks), list(article_free_blocks))
    slots, layers, logical = tables[0].shape
    width = max(len(frees[0]), len(frees[1]), 1)
    fig, axes = plt.subplots(2, 2, figsize=(max(7.5, 0.42 * width + 2), 2.2 + 0.5 * slots * layers),
                             dpi=80, gridspec_kw={"height_ratios": [slots * layers, 1.2]})
    for col, (tab, free, name) in enumerate(zip(tables, frees, ("yours", "the article's"))):
        ax = axes[0, col]
        flat = tab.reshape(slots * layers, logical)
        other = tables[1 - col].reshape(slots * layers, logical)
        img = np.ones((slots * layers, logical, 3)) * np.array(UNTOUCHED)
        img[flat >= 0] = (0.78, 0.87, 0.95)
        img[flat != other] = wrong
        ax.imshow(img, aspect="auto", interpolation="nearest")
        for r in range(slots * layers):
            for lb in range(logical):
                ax.text(lb, r, str(int(flat[r, lb])), ha="center", va="center", fontsize=7)
        ax.set_yticks(range(slots * layers))
        ax.set_yticklabels([f"slot {r // layers}, layer {r % layers}"
                            for r in range(slots * layers)], fontsize=7)
        ax.set_xticks(range(logical))
        ax.set_xlabel("logical block", fontsize=7)
        ax.set_title(f"block table, {name}", fontsize=8)
        ax = axes[1, col]
        strip = np.ones((1, width, 3)) * np.array(UNTOUCHED)
        other_free = frees[1 - col]
        for i, b in enumerate(free):
            j = width - len(free) + i
            k = len(other_free) - len(free) + i
            same = 0 <= k < len(other_free) and other_free[k] == b
            strip[0, j] = (0.78, 0.87, 0.95) if same else wrong
            ax.text(j, 0, str(b), ha="center", va="center", fontsize=7)
        ax.imshow(strip, aspect="auto", interpolation="nearest")
        ax.set_yticks([])
        ax.set_xticks([])
        ax.set_title(f"free_blocks, {name} (next pop: right end)", fontsize=8)
    fig.suptitle(title + "  (red: differs from the article's)", fontsize=9)
    fig.tight_layout()
    return fig
