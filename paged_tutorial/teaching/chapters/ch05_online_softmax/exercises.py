"""Exercises of notebook 05: online softmax and the in-place output.  Right answers come from
``oracles.online_softmax_trace`` (the decode kernel's recurrence, which notebook 05 checks
against the kernel) and from the kernel's q indexing."""

from __future__ import annotations

import math

import numpy as np

from paged_tutorial.teaching.exercises.answers import Integer, Numbers, Real
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.language import Text, say

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
        Text(en=f"The correction factor applied at each of the 4 steps for scores {SCORES}.",
             ko=f"점수 {SCORES}에 대해 스텝 4번 각각에서 곱해지는 보정 인자."),
        Numbers(Real(), len(SCORES), tuple(Text(en=f"step {i}", ko=f"스텝 {i}")
                                          for i in range(len(SCORES)))),
        lambda: tuple(float(x) for x in _trace()["correction"]),
        explain=lambda e: say(en="exp(old max - new max): 0 at the start, < 1 when the max "
                                 "rises, else 1",
                              ko="exp(이전 최대 - 새 최대): 처음엔 0, 최대가 오르면 1보다 작고, "
                                 "아니면 1"),
        hint=Text(en="exp(running max before the step - running max after it); before step 0 "
                     "the max is -inf",
                  ko="exp(스텝 전 누적 최댓값 - 스텝 후 누적 최댓값); 스텝 0 전의 최대는 -inf"),
        mistakes=(
            Mistake(lambda: tuple(0.0 if i == 0 else math.exp(float(m1 - m0))
                                  for i, (m0, m1) in enumerate(zip(
                                      np.r_[-np.inf, _trace()["max"][:-1]], _trace()["max"]))),
                    Text(en="that is exp(new max - old max): the correction shrinks the old "
                            "sums, so it is exp(old - new), at most 1",
                         ko="그것은 exp(새 최대 - 이전 최대)입니다: 보정은 이전 합을 줄이므로 "
                            "exp(이전 - 새), 많아야 1입니다")),
            Mistake(lambda: (1.0,) + tuple(float(x) for x in _trace()["correction"][1:]),
                    Text(en="step 0: the old max is -inf, so the correction is exp(-inf) = 0 "
                            "(nothing to rescale yet)",
                         ko="스텝 0: 이전 최대가 -inf이므로 보정은 exp(-inf) = 0 (아직 다시 맞출 "
                            "것이 없음)")),
        )),
    Exercise(
        "05.denominator",
        Text(en=f"The denominator d after the 4 scores {SCORES}.",
             ko=f"점수 4개 {SCORES} 뒤의 분모 d."),
        Real(), lambda: float(_trace()["d"][-1]),
        explain=lambda e: say(en=f"d = sum exp(s - 3.0) = {e:.4f}: relative to the final max",
                              ko=f"d = sum exp(s - 3.0) = {e:.4f}: 마지막 최댓값 기준"),
        hint=Text(en="d ends as the sum of exp(score - final max)",
                  ko="d는 결국 exp(score - 마지막 최대)의 합이 됩니다"),
        mistakes=(
            Mistake(lambda: float(np.exp(np.array(SCORES)).sum()),
                    Text(en="that is sum exp(s): d is kept relative to the running max",
                         ko="그것은 sum exp(s)입니다: d는 누적 최댓값 기준으로 유지됩니다")),
        )),
    Exercise(
        "05.q_index",
        Text(en="The flat element of q that thread {thread} of block (active_slot "
                "{active_slot}, q head {q_head}) reads first and overwrites last, for a "
                "contiguous q of shape {shape}.".format(shape=list(Q_SHAPE), **Q_BLOCK),
             ko="모양 {shape}의 연속된 q에서 블록 (active_slot {active_slot}, q 헤드 {q_head})의 "
                "{thread}번 스레드가 처음 읽고 마지막에 덮어쓰는 평평한 원소 "
                "번호.".format(shape=list(Q_SHAPE), **Q_BLOCK)),
        Integer(), _q_index,
        explain=lambda e: say(
            en=f"active_slot*{Q_SHAPE[1] * Q_SHAPE[2]} + q_head*{Q_SHAPE[2]} + thread = {e}: the "
               "same index for the read and the write, and no other thread uses it",
            ko=f"active_slot*{Q_SHAPE[1] * Q_SHAPE[2]} + q_head*{Q_SHAPE[2]} + thread = {e}: "
               "읽기와 쓰기가 같은 인덱스이고, 다른 스레드는 이 원소를 쓰지 않습니다"),
        hint=Text(en="row of the batch (not the cache slot!) * row stride + head * head_dim + "
                     "thread",
                  ko="배치의 행 (캐시 슬롯이 아님!) * 행 보폭 + 헤드 * head_dim + 스레드"),
        mistakes=(
            Mistake(lambda: Q_BLOCK["q_head"] * Q_SHAPE[1] * Q_SHAPE[2]
                    + Q_BLOCK["active_slot"] * Q_SHAPE[2] + Q_BLOCK["thread"],
                    Text(en="row and head swapped: blockIdx.x is the batch row, blockIdx.y the "
                            "q head",
                         ko="행과 헤드가 바뀌었습니다: blockIdx.x가 배치 행, blockIdx.y가 q "
                            "헤드입니다")),
            Mistake(lambda: Q_BLOCK["active_slot"] * Q_SHAPE[2] + Q_BLOCK["q_head"] * Q_SHAPE[2]
                    + Q_BLOCK["thread"],
                    Text(en="a row of q holds every head: its stride is n_q_heads * head_dim",
                         ko="q의 한 행은 모든 헤드를 담습니다: 행의 보폭은 n_q_heads * "
                            "head_dim입니다")),
        )),
)
