"""Exercises of notebook 04: the warp-shuffle reduction.

Expected answers are produced by running the package's kernels (the shuffle demo kernel and
the article's two-warp layout from ``viz.kernels``, simulated on a CPU) or read from
``backends.numba_cuda.attention``.
"""

from __future__ import annotations

import numpy as np


def check_shfl_down_8(answer):
    """All 32 lanes' values after ``v = shfl_down_sync(FULL, v, 8)`` when lane i holds i."""
    from ..viz.kernels import shuffle_chain

    expected = shuffle_chain(np.arange(32), offsets=[8], accumulate=False)[1]
    try:
        got = np.asarray(answer, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        got = None
    if got is not None and got.shape == expected.shape and np.array_equal(got, expected):
        return True, "lanes 0-23 read lane i+8; lanes 24-31 have no source and keep their own"
    if got is not None and got.shape == expected.shape:
        bad = int(np.flatnonzero(got != expected)[0])
        return False, (f"lane {bad} is off: a lane reads lane + 8 when that lane exists in "
                       "the 32-lane warp, and otherwise keeps its own value")
    return False, "give one value per lane: a list of 32 numbers"


def check_article_terms_80(answer):
    """How many of the 80 products q[d]*k[d] the article's two-warp layout adds up when
    launched with head_dim = 80 threads."""
    from ..viz.kernels import article_two_warp_dot

    ones = np.ones(80, dtype=np.float32)
    expected = int(round(article_two_warp_dot(ones, ones)["score"]))
    try:
        got = int(answer)
    except (TypeError, ValueError):
        got = None
    if got == expected:
        return True, (f"only threads 0 and 32 publish: warps 0 and 1 = {expected} terms; "
                      f"the third warp's {80 - expected} products are dropped")
    return False, "which warps have their lane 0 write into dot_products?"


def check_shared_floats(answer):
    """Shared partial-sum floats (one per warp) of the package's decode kernel for head_dim
    64, 80 and 128, as a tuple."""
    from ..backends.numba_cuda import attention

    dims = (64, 80, 128)
    expected = tuple(attention.block_threads(d) // attention.WARP_SIZE for d in dims)
    try:
        got = tuple(int(x) for x in answer)
    except (TypeError, ValueError):
        got = None
    if got == expected:
        return True, f"head_dim {dims} -> {expected} warps, one shared float each"
    return False, "threads = head_dim rounded up to whole warps of 32; one float per warp"


CHECKS = {
    "04.shfl_down_8": check_shfl_down_8,
    "04.article_terms_80": check_article_terms_80,
    "04.shared_floats": check_shared_floats,
}
