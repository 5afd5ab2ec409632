"""Exercises of notebook 05: online softmax and the in-place output.  Right answers come from
``oracles.online_softmax_trace`` (the decode kernel's recurrence, which notebook 05 checks
against the kernel) and from the kernel's q indexing."""

from __future__ import annotations

import math

import numpy as np

from paged_tutorial.teaching.exercises.answers import Integer, Numbers, Real
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake

SCORES = (0.5, 2.0, 1.0, 3.0)
Q_SHAPE = (3, 4, 64)              # [batch rows, q heads, head_dim], contiguous
Q_BLOCK = dict(active_slot=2, q_head=1, thread=5)


def _trace():
    from paged_tutorial.teaching.oracles import online_softmax_trace

    return online_softmax_trace(np.array(SCORES))


def _q_index():
    import torch

    q = torch.zeros(*Q_SHAPE)
    row_stride = q.stride(0)        # what launch.rows(q) hands the kernel as q_row_stride
    b = Q_BLOCK
    return b["active_slot"] * row_stride + b["q_head"] * Q_SHAPE[2] + b["thread"]


EXERCISES = (
    Exercise(
        "05.corrections",
        f"The correction factor applied at each of the 4 steps for scores {SCORES}.",
        Numbers(Real(), len(SCORES), tuple(f"step {i}" for i in range(len(SCORES)))),
        lambda: tuple(float(x) for x in _trace()["correction"]),
        explain=lambda e: "exp(old max - new max): 0 at the start, < 1 when the max rises, else 1",
        hint=("exp(running max before the step - running max after it); before step 0 the "
              "max is -inf"),
        mistakes=(
            Mistake(lambda: tuple(0.0 if i == 0 else math.exp(float(m1 - m0))
                                  for i, (m0, m1) in enumerate(zip(
                                      np.r_[-np.inf, _trace()["max"][:-1]], _trace()["max"]))),
                    "that is exp(new max - old max): the correction shrinks the old sums, so "
                    "it is exp(old - new), at most 1"),
            Mistake(lambda: (1.0,) + tuple(float(x) for x in _trace()["correction"][1:]),
                    "step 0: the old max is -inf, so the correction is exp(-inf) = 0 (nothing "
                    "to rescale yet)"),
        )),
    Exercise(
        "05.denominator",
        f"The denominator d after the 4 scores {SCORES}.",
        Real(), lambda: float(_trace()["d"][-1]),
        explain=lambda e: f"d = sum exp(s - 3.0) = {e:.4f}: relative to the final max",
        hint="d ends as the sum of exp(score - final max)",
        mistakes=(
            Mistake(lambda: float(np.exp(np.array(SCORES)).sum()),
                    "that is sum exp(s): d is kept relative to the running max"),
        )),
    Exercise(
        "05.q_index",
        "The flat element of q that thread {thread} of block (active_slot {active_slot}, q head "
        "{q_head}) reads first and overwrites last, for a contiguous q of shape "
        "{shape}.".format(shape=list(Q_SHAPE), **Q_BLOCK),
        Integer(), _q_index,
        explain=lambda e: (f"active_slot*{Q_SHAPE[1] * Q_SHAPE[2]} + q_head*{Q_SHAPE[2]} + "
                           f"thread = {e}: the same index for the read and the write, and no "
                           "other thread uses it"),
        hint="row of the batch (not the cache slot!) * row stride + head * head_dim + thread",
        mistakes=(
            Mistake(lambda: Q_BLOCK["q_head"] * Q_SHAPE[1] * Q_SHAPE[2]
                    + Q_BLOCK["active_slot"] * Q_SHAPE[2] + Q_BLOCK["thread"],
                    "row and head swapped: blockIdx.x is the batch row, blockIdx.y the q head"),
            Mistake(lambda: Q_BLOCK["active_slot"] * Q_SHAPE[2] + Q_BLOCK["q_head"] * Q_SHAPE[2]
                    + Q_BLOCK["thread"],
                    "a row of q holds every head: its stride is n_q_heads * head_dim"),
        )),
)
