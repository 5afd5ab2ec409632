"""Exercises of notebook 05: online softmax and the in-place output.

Expected answers come from ``viz.kernels.online_softmax_trace`` (the decode kernel's
recurrence, which notebook 05 checks against the kernel) and from the kernel's q indexing.
"""

from __future__ import annotations

import numpy as np

SCORES = (0.5, 2.0, 1.0, 3.0)


def _floats(answer, n):
    try:
        got = np.asarray(answer, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return None
    return got if got.shape == (n,) else None


def check_corrections(answer):
    """The correction factor applied at each of the 4 steps for scores (0.5, 2.0, 1.0, 3.0)."""
    from ..viz.kernels import online_softmax_trace

    expected = online_softmax_trace(np.array(SCORES))["correction"].astype(np.float64)
    got = _floats(answer, len(SCORES))
    if got is not None and np.allclose(got, expected, rtol=1e-5, atol=1e-7):
        return True, "exp(old max - new max): 0 at the start, < 1 when the max rises, else 1"
    if got is not None and got[0] != 0:
        return False, "step 0: the old max is -inf, so what is exp(-inf - 0.5)?"
    return False, "4 numbers: exp(previous running max - running max after the step)"


def check_denominator(answer):
    """The denominator d after the 4 scores (0.5, 2.0, 1.0, 3.0)."""
    from ..viz.kernels import online_softmax_trace

    expected = float(online_softmax_trace(np.array(SCORES))["d"][-1])
    try:
        got = float(answer)
    except (TypeError, ValueError):
        got = None
    if got is not None and abs(got - expected) <= 1e-5 * expected:
        return True, f"d = sum exp(s - 3.0) = {expected:.4f}: relative to the final max"
    if got is not None and abs(got - float(np.exp(SCORES).sum())) < 1e-3:
        return False, "that is sum exp(s): d is kept relative to the running max"
    return False, "d ends as the sum of exp(score - final max)"


def check_q_index(answer):
    """The flat element of q that thread 5 of block (active_slot 2, q head 1) reads first and
    overwrites last, for a contiguous q of shape [3, 4, 64]."""
    import torch

    q = torch.zeros(3, 4, 64)
    row_stride = q.stride(0)        # what launch.rows(q) hands the kernel as q_row_stride
    expected = 2 * row_stride + 1 * q.shape[2] + 5
    try:
        got = int(answer)
    except (TypeError, ValueError):
        got = None
    if got == expected:
        return True, (f"active_slot*{row_stride} + q_head*64 + thread = {expected}: the same "
                      "index for the read and the write, and no other thread uses it")
    return False, "row of the batch (not the cache slot!) * row stride + head * head_dim + thread"


CHECKS = {
    "05.corrections": check_corrections,
    "05.denominator": check_denominator,
    "05.q_index": check_q_index,
}
