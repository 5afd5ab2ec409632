"""One folder per notebook (``chNN_<name>`` after ``notebooks/NN_<name>.ipynb``): its
exercises (``exercises.py``, numbers to work out, their ``EXERCISES``), its puzzles and its
figures, over the machinery every chapter shares (``paged_tutorial.teaching.harness``).

Puzzles are in the spirit of GPU-Puzzles: the reader writes one piece of the engine or of the
article's kernel as a plain Python function, and the grader runs it *where it belongs* -- in
the article's decode kernel (the simulator on a CPU, the GPU on a GPU) or in a real ``Engine``
-- and compares the result with the oracles the package already has (a poisoned cache, the
torch backend, a stock engine).  A wrong answer gets a message that says where it went wrong
and, in a notebook, a figure of which threads read which memory.  Each puzzle is registered
with the exercises, so the same calls serve both: ``pt.exercises.names()``,
``pt.exercises.check("03.k_index", my_k_index)``, ``pt.exercises.reveal("03.k_index")``;
``puzzle(name).stub()`` is the function to fill in.  Figures are drawn from what the engine
actually holds or did (public hooks only); matplotlib is imported lazily by each function.

- ``ch00_overview``: ``flow`` (the article's whole flow, filled in from a live engine);
- ``ch01_block_layout``: ``block_layout`` (puzzle: a K/V element's bytes in a block),
  ``layout`` (a block's bytes, the block table, memory over a run, the paper's memory bars);
- ``ch02_block_table``: ``block_table`` (puzzle: logical -> physical in the engine's write
  path), ``kernel_addresses`` (puzzles 02.table_index and 03.k_index, in the kernel);
- ``ch03_address_arithmetic``: ``block_walk`` (puzzle: the kernel's loop over blocks),
  ``thread_block``, ``kernel_source`` (the article's kernel next to kernels.cu, for 03-05);
- ``ch04_warp_shuffle_reduction``: ``score_handoff`` (puzzle: one token's score, shuffle tree
  to race-free hand-off), ``warps`` (one warp's shuffles), ``handoff`` (shared-memory figures);
- ``ch05_online_softmax``: ``online_softmax`` and ``output_store`` (puzzles), ``softmax`` (the
  online softmax token by token), ``races`` (NVIDIA's race checker on the article's layout);
- ``ch06_block_lifetime``: ``allocator`` and ``table_sync`` (puzzles: her block allocator; only
  changed table entries reach the device), ``lifetime`` (the physical block map over a run);
- ``ch07_full_model``: exercises only; ``ch08_performance``: ``performance`` (the committed GPU
  measurements);
- ``ch09_prefix_sharing``: ``prefix_sharing`` (puzzle, beyond the article: when a request may
  use a cached block), ``sharing`` (shared blocks over a run).

``PUZZLES`` lists every chapter's puzzles in notebook order; the checker finds each chapter's
``exercises`` module itself (``exercises/registry.py``).
"""

from __future__ import annotations

from paged_tutorial.teaching.chapters.ch01_block_layout import block_layout
from paged_tutorial.teaching.chapters.ch02_block_table import block_table, kernel_addresses
from paged_tutorial.teaching.chapters.ch03_address_arithmetic import block_walk
from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction import score_handoff
from paged_tutorial.teaching.chapters.ch05_online_softmax import online_softmax, output_store
from paged_tutorial.teaching.chapters.ch06_block_lifetime import allocator, table_sync
from paged_tutorial.teaching.chapters.ch09_prefix_sharing import prefix_sharing
from paged_tutorial.teaching.harness.base import Puzzle

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
