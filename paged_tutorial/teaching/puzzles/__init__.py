"""Puzzles in the spirit of GPU-Puzzles: the reader writes one piece of the engine or of the
article's kernel as a plain Python function, and the grader runs it *where it belongs* -- in
the article's decode kernel (the simulator on a CPU, the GPU on a GPU) or in a real ``Engine``
-- and compares the result with the oracles the package already has (a poisoned cache, the
torch backend, a stock engine).  A wrong answer gets a message that says where it went wrong
and, in a notebook, a figure of which threads read which memory.

Each puzzle is registered with the exercises, so the same calls serve both:
``pt.exercises.names()``, ``pt.exercises.check("03.k_index", my_k_index)``,
``pt.exercises.reveal("03.k_index")``; ``puzzle(name).stub()`` is the function to fill in.

Modules, one per part of the article: ``block_layout`` (01: a K/V element's bytes in a block),
``block_table`` (02: logical -> physical through the table, in the engine's write path),
``kernel_addresses`` (02-03: the table index and the K address, in the kernel), the kernel's
body parts written as device code: ``block_walk`` (03: the loop over blocks), ``score_handoff``
(04: one token's score, shuffle tree to race-free hand-off), ``output_store`` (05: the in-place
store); ``online_softmax`` (05: the (m, d, acc) update), ``allocator`` (06: the reader's block
allocator, pops, release and preemption), ``table_sync`` (06: only the changed entries of the
table reach the device),
``prefix_sharing`` (09, beyond the article: when a request may use a cached block).
Shared machinery: ``base`` (the Puzzle record, host calls), ``kernel_harness`` (the kernel with
a replaced part, against the oracles), ``engine_harness`` (a tiny engine with a replaced piece,
against a stock one).
"""

from __future__ import annotations

from paged_tutorial.teaching.puzzles import (allocator, block_layout, block_table, block_walk,
                                             kernel_addresses, online_softmax, output_store,
                                             prefix_sharing, score_handoff, table_sync)
from paged_tutorial.teaching.puzzles.base import Puzzle

PUZZLES: tuple[Puzzle, ...] = (
    *block_layout.PUZZLES,
    *block_table.PUZZLES,
    *kernel_addresses.PUZZLES,
    *block_walk.PUZZLES,
    *score_handoff.PUZZLES,
    *online_softmax.PUZZLES,
    *output_store.PUZZLES,
    *allocator.PUZZLES,
    *table_sync.PUZZLES,
    *prefix_sharing.PUZZLES,
)

__all__ = ["PUZZLES", "Puzzle", "puzzle"]


def puzzle(name: str) -> Puzzle:
    """The puzzle called ``name`` (its signature, docstring, hint, ``stub()``)."""
    for p in PUZZLES:
        if p.name == name:
            return p
    raise KeyError(f"no puzzle named {name!r}; puzzles: {', '.join(p.name for p in PUZZLES)}")
