"""Puzzle ``02.locate``: logical -> physical through the block table, on the cache's writer
side (the article's prefill and decode scatters, ``main.cpp:265`` and ``858``).

The reader's function says where a token of (slot, layer, position) goes: which physical block
and which row of it.  The grader runs a real engine with two slots and three layers, from a
shuffled free list (so physical blocks are not the logical ones), whose backend writes every
token's K and V where the reader's function says (``LocatingWriterBackend``) into a cache
filled with NaN; the decode attention reads them through the table.  The logits must equal a
stock engine's, bit for bit.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from paged_tutorial.backends.paged_reads import cache_view
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong, host_call, need_int
from paged_tutorial.teaching.puzzles.engine_harness import engine_with_cache, run, tiny_model

REQUESTS = ((tuple(range(3, 23)), 3), (tuple(range(30, 37)), 3))   # 20 and 7 prompt tokens
ENGINE = dict(device="cpu", max_slots=2, max_seq_len=32)
NUM_LAYERS = 3
SHUFFLE = 5
NAMES = ["block_table", "slot", "layer", "position", "BLOCK_SIZE"]


class LocatingWriterBackend(TorchBackend):
    """The torch backend, except that ``write_kv`` asks ``locate`` where each token goes and
    records every (layer, slot, position, physical block, row) it wrote."""

    def __init__(self, locate):
        super().__init__("cpu")
        self.locate = locate
        self.writes: list[tuple] = []

    def write_kv(self, cache, k, v, block_table, layer, slots, positions):
        c = cache.config
        view = cache_view(cache)                       # [NUM_BLOCKS, K/V, BLOCK_SIZE, KV_DIM]
        table = block_table.cpu().numpy().copy()       # the reader's function gets a copy
        for i, (slot, pos) in enumerate(zip(slots.tolist(), positions.tolist())):
            args = (table, slot, layer, pos, c.BLOCK_SIZE)
            call = f"locate(block_table, slot={slot}, layer={layer}, position={pos}, " \
                   f"BLOCK_SIZE={c.BLOCK_SIZE})"
            got = host_call(self.locate, args, NAMES)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Wrong(f"{call} returned {got!r}; it must return two integers: "
                            "(physical_block, row)")
            phys = need_int(got[0], "the physical block", call)
            row = need_int(got[1], "the row", call)
            if not 0 <= phys < c.NUM_BLOCKS or not 0 <= row < c.BLOCK_SIZE:
                raise Wrong(f"{call} = ({phys}, {row}): outside the cache ({c.NUM_BLOCKS} "
                            f"physical blocks of {c.BLOCK_SIZE} rows); the write would land in "
                            "someone else's memory or past the buffer")
            self.writes.append((layer, slot, pos, phys, row))
            view[phys, 0, row] = k[i].reshape(-1).to(view.dtype)
            view[phys, 1, row] = v[i].reshape(-1).to(view.dtype)


@lru_cache(maxsize=1)
def stock_run():
    engine = engine_with_cache(tiny_model(NUM_LAYERS), backend="torch", **ENGINE)
    return engine.cache_config, run(engine, REQUESTS, shuffle_seed=SHUFFLE)


def explain(backend: LocatingWriterBackend, table: np.ndarray, bs: int) -> tuple[str, list]:
    """The first write that went elsewhere than the decode kernel looks, and every write
    classified for the figure."""
    message, rows = "", []
    for layer, slot, pos, phys, row in backend.writes:
        want = (int(table[slot, layer, pos // bs]), pos % bs)
        rows.append((layer, slot, pos, (phys, row), want))
        if not message and (phys, row) != want:
            message = (f"layer {layer}, slot {slot}, position {pos} was written to physical "
                       f"block {phys}, row {row}; the decode kernel looks for it in "
                       f"block_table[{slot}, {layer}, {pos // bs}] = {want[0]}, row {want[1]}")
    return message or "every write went where the kernel reads", rows


def grade(fn) -> str:
    config, stock = stock_run()
    backend = LocatingWriterBackend(fn)
    engine = engine_with_cache(tiny_model(NUM_LAYERS), backend=backend, **ENGINE)
    mine, diff = run(engine, REQUESTS, shuffle_seed=SHUFFLE, poison=True, against=stock)

    if diff is not None:
        step = mine[diff[0]]
        message, rows = explain(backend, step.block_table, config.BLOCK_SIZE)

        def draw():
            from paged_tutorial.teaching.viz.layout import plot_placements

            return plot_placements(config, rows)
        raise Wrong(f"the engine's {step.kind} step {step.index} differs from a stock engine's: "
                    f"{message}", figure=draw)
    return ("2 slots x 3 layers from a shuffled free list: every token written where the decode "
            "kernel reads it; logits bit-identical to a stock engine's")


PUZZLES = (
    Puzzle(
        "02.locate", "logical -> physical block through the table",
        "def locate(block_table, slot, layer, position, BLOCK_SIZE):",
        "Return (physical_block, row): where the K and V of the token at `position` of the\n"
        "sequence in cache slot `slot` go, in layer `layer`.  block_table is the engine's\n"
        "table, a NumPy array indexed [slot, layer, logical block] that holds physical block\n"
        "ids (-1 where none is assigned yet).",
        "A position belongs to one logical block and to one row of it; the table turns the "
        "logical block into a physical one.",
        "a real Engine (torch backend, 2 slots x 3 layers, shuffled free list): your function "
        "places every token, the decode attention reads through the table",
        "main.cpp:265 (prefill) and main.cpp:858 (decode)", grade),
)
