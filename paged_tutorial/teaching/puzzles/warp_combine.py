"""Puzzle ``04.combine_warps``: thread 0 adds the warps' partial dot products, for any head_dim
(the article's limit 2: its kernel adds exactly two, ``kernels.cu:503-506``).

The grader compiles the reader's function into the article's kernel and runs it for head_dim
80 (three warps, the last one partly filled), 16 (one warp), 64 (the article's two) and 128
(four), each against the torch oracle on a poisoned cache.  Before launching, it calls the
function on the host with a guarded array that refuses a read past the block's cells (a read
past the end of shared memory on a GPU), and with one-hot partial sums to see which warps the
sum counts: that is what a wrong answer's message and figure show.
"""

from __future__ import annotations

import numpy as np

from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong, check_compiles, host_call, need_real
from paged_tutorial.teaching.puzzles.kernel_harness import KernelCase, bad_summary, prepare, run

WARP_SIZE = 32
HEAD_DIMS = (80, 16, 64, 128)
CASES = tuple(KernelCase(f"head_dim {d}", rows=((0, 3),), head_dim=d, max_seq_len=16,
                         num_blocks=4, seed=10 + i) for i, d in enumerate(HEAD_DIMS))
NAMES = ["dot_products", "HEAD_DIM", "WARP_SIZE"]


class SharedCells:
    """Stands in for the kernel's ``dot_products`` shared array on the host: indexing past its
    cells raises, so a read outside shared memory is reported before any launch."""

    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.float32)
        self.shape = self.values.shape
        self.size = self.values.size
        self.dtype = self.values.dtype

    def __len__(self):
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __getitem__(self, index):
        i = int(index)
        if not -len(self.values) <= i < len(self.values):
            raise IndexError(f"dot_products[{i}] read, but a block of this head_dim has "
                             f"{len(self.values)} warp(s), so cells 0..{len(self.values) - 1}")
        return self.values[i]

    def __setitem__(self, index, value):
        raise Wrong("your function writes into dot_products; thread 0 only needs to read the "
                    "cells (other warps may still be using them on the next token)")


def warps(head_dim: int) -> int:
    return -(-head_dim // WARP_SIZE)


def coefficients(fn, head_dim: int) -> np.ndarray:
    """How many times the function counts each warp's partial sum (one-hot inputs, on the
    host).  Raises Wrong for a read past the cells."""
    n = warps(head_dim)
    coef = np.zeros(n)
    for w in range(n):
        cells = np.zeros(n, dtype=np.float32)
        cells[w] = 1.0
        try:
            value = host_call(fn, (SharedCells(cells), head_dim, WARP_SIZE), NAMES)
        except Wrong as wrong:
            if "IndexError" in wrong.message:
                reason = wrong.message.split("IndexError: ")[1].split(" (called")[0]
                raise Wrong(f"for HEAD_DIM {head_dim}: {reason}; on a GPU that read leaves "
                            "the shared array", figure=None) from None
            raise
        coef[w] = need_real(value, "the returned sum",
                            f"combine_warps(dot_products, {head_dim}, {WARP_SIZE})")
    return coef


def coverage_text(head_dim: int, coef: np.ndarray) -> str:
    parts = []
    for w, k in enumerate(coef):
        lo, hi = w * WARP_SIZE, min((w + 1) * WARP_SIZE, head_dim) - 1
        if k != 1:
            what = "dropped" if k == 0 else f"counted {k:g} times"
            parts.append(f"warp {w} (dims {lo}-{hi}) {what}")
    return "; ".join(parts)


def grade(fn) -> str:
    from paged_tutorial.backends.numba_cuda.kernels import attention

    coefs, past_cells = {}, {}
    for d in HEAD_DIMS:
        try:
            coefs[d] = coefficients(fn, d)
        except Wrong as wrong:
            if "leaves the shared array" not in wrong.message:
                raise
            past_cells[d] = wrong.message
    check_compiles(fn, (np.zeros(3, dtype=np.float32), 80, WARP_SIZE))
    parts = attention.ARTICLE_PARTS.replace(combine_warps=fn)
    also = "".join(f"  Also, {message}." for message in past_cells.values())
    for case in CASES:
        d = case.head_dim
        if d in past_cells:
            continue                # never launched: on a GPU the read would leave shared memory
        result = run(prepare(case), parts)
        if not result.ok:
            coef = coefs[d]
            why = coverage_text(d, coef) or ("every warp counted once, yet the sum is wrong: is "
                                              "it the plain sum of the cells?")

            def draw(d=d, coef=coef):
                from paged_tutorial.teaching.viz.warps import plot_warp_coverage

                return plot_warp_coverage(d, coef, WARP_SIZE)
            raise Wrong(f"head_dim {d} ({warps(d)} warps): {bad_summary(prepare(case), result)}."
                        f"  Your sum: {why}.{also}", figure=draw)
    if past_cells:
        first = next(iter(past_cells.values()))
        raise Wrong(first[0].upper() + first[1:] + ".  (The head dims your sum can read were "
                    "right in the kernel.)")
    return ("head_dim 80, 16, 64 and 128: every warp's partial sum counted once; the kernel's "
            "output equals the torch oracle's")


PUZZLES = (
    Puzzle(
        "04.combine_warps", "adding the warps' partial sums, for any head_dim",
        "def combine_warps(dot_products, HEAD_DIM, WARP_SIZE):",
        "Thread 0 runs this after the barrier.  dot_products[w] holds warp w's sum of\n"
        "q[d] * k[d] over its WARP_SIZE dimensions (lane 0 of each warp wrote it).  The block\n"
        "has HEAD_DIM threads rounded up to whole warps, one cell per warp.  Return the whole\n"
        "dot product q.k (the kernel then multiplies it by the scale).",
        "The article adds dot_products[0] + dot_products[1]: right for 64 only.  How many warps "
        "does a block of 80 threads have?  And of 16?",
        "the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a GPU), "
        "head_dim 80, 16, 64 and 128", "kernels.cu:503-506", grade),
)
