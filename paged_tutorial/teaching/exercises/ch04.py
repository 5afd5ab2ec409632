"""Exercises of notebook 04: the warp-shuffle reduction.  Right answers come from running the
package's kernels (the shuffle demo kernel and the article's two-warp layout of ``viz.warps``,
simulated on a CPU) or from ``backends.numba_cuda.kernels.attention``."""

from __future__ import annotations

import numpy as np

import math

from paged_tutorial.teaching.exercises.answers import Integer, Numbers, Real
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake

SHARED_DIMS = (64, 80, 128)


def _shfl_down_8():
    from paged_tutorial.teaching.viz.warps import shuffle_chain

    return tuple(int(x) for x in shuffle_chain(np.arange(32), offsets=[8], accumulate=False)[1])


def _article_terms_80():
    from paged_tutorial.teaching.viz.warps import article_two_warp_dot

    ones = np.ones(80, dtype=np.float32)
    return int(round(article_two_warp_dot(ones, ones)["score"]))


def _shared_floats(dims=SHARED_DIMS):
    from paged_tutorial.backends.numba_cuda.kernels import attention

    return tuple(attention.block_threads(d) // attention.WARP_SIZE for d in dims)


EXERCISES = (
    Exercise(
        "04.shfl_down_8",
        "All 32 lanes' values after v = shfl_down_sync(FULL, v, 8) when lane i holds i.",
        Numbers(Integer(), 32), _shfl_down_8,
        explain=lambda e: "lanes 0-23 read lane i+8; lanes 24-31 have no source and keep their own",
        hint=("a lane reads lane + 8 when that lane exists in the 32-lane warp, and otherwise "
              "keeps its own value"),
        mistakes=(
            Mistake(lambda: tuple((i + 8) % 32 for i in range(32)),
                    "shfl_down does not wrap around: lanes 24-31 have no lane i+8 and keep "
                    "their own value"),
            Mistake(lambda: tuple(i - 8 if i >= 8 else i for i in range(32)),
                    "that is shfl_up: shfl_down reads from the higher lane i + 8"),
        )),
    Exercise(
        "04.article_terms_80",
        "How many of the 80 products q[d]*k[d] does the article's two-warp layout add up when "
        "launched with head_dim = 80 threads?",
        Integer(), _article_terms_80,
        explain=lambda e: (f"only threads 0 and 32 publish: warps 0 and 1 = {e} terms; the "
                           f"third warp's {80 - e} products are dropped"),
        hint="which warps have their lane 0 write into dot_products?",
        mistakes=(Mistake(lambda: 80, "count again: does anything read the third warp's sum?"),)),
    Exercise(
        "04.shared_floats",
        "Shared partial-sum floats (one per warp) of the package's decode kernel for head_dim "
        "{}, {} and {}.".format(*SHARED_DIMS),
        Numbers(Integer(), 3, tuple(f"head_dim {d}" for d in SHARED_DIMS)), _shared_floats,
        explain=lambda e: f"head_dim {SHARED_DIMS} -> {e} warps, one shared float each",
        hint="threads = head_dim rounded up to whole warps of 32; one float per warp",
        mistakes=(
            Mistake(lambda: tuple(d // 32 for d in SHARED_DIMS),
                    "d // 32 rounds down: 80 threads need a third, partly filled warp"),
            Mistake(lambda: (2, 2, 2), "that is the article's fixed layout; the port has one "
                    "float per warp"),
        )),
    Exercise(
        "04.scale_error_128",
        "The article's thread 0 divides every score by SQRT_HEAD_DIM = 8.  Kept as it is for a "
        "model with head_dim 128, by what factor are the scores too large?",
        Real(), lambda: (1 / 8) / (1 / math.sqrt(128)),
        explain=lambda e: f"1/8 against 1/sqrt(128): sqrt(128)/8 = {e:.4f}, a sharper softmax",
        hint="the right scale is 1/sqrt(head_dim); compare it with 1/8",
        mistakes=(
            Mistake(lambda: 8 / math.sqrt(128), "that is the inverse: 1/8 is larger than "
                                                "1/sqrt(128), so the scores come out too large"),
            Mistake(lambda: 128 / 64, "the scale goes with the square root of head_dim, not "
                                      "head_dim itself"),
        )),
)
