"""Exercises of notebook 04: the warp-shuffle reduction.  Right answers come from running the
package's kernels (the shuffle demo kernel and the article's two-warp layout of ``warps``,
simulated on a CPU) or from ``backends.numba_cuda.kernels.attention``."""

from __future__ import annotations

import numpy as np

import math

from paged_tutorial.teaching.exercises.answers import Integer, Numbers, Real
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.language import Text, say

SHARED_DIMS = (64, 80, 128)


def _shfl_down_8():
    from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction.warps import shuffle_chain

    return tuple(int(x) for x in shuffle_chain(np.arange(32), offsets=[8], accumulate=False)[1])


def _article_terms_80():
    from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction.warps import (
        article_two_warp_dot)

    ones = np.ones(80, dtype=np.float32)
    return int(round(article_two_warp_dot(ones, ones)["score"]))


def _shared_floats(dims=SHARED_DIMS):
    from paged_tutorial.backends.numba_cuda.kernels import attention

    return tuple(attention.block_threads(d) // attention.WARP_SIZE for d in dims)


EXERCISES = (
    Exercise(
        "04.shfl_down_8",
        Text(en="All 32 lanes' values after v = shfl_down_sync(FULL, v, 8) when lane i holds i.",
             ko="레인 i가 i를 가질 때 v = shfl_down_sync(FULL, v, 8) 뒤 32개 레인의 값."),
        Numbers(Integer(), 32), _shfl_down_8,
        explain=lambda e: say(en="lanes 0-23 read lane i+8; lanes 24-31 have no source and "
                                 "keep their own",
                              ko="레인 0-23은 레인 i+8을 읽고, 레인 24-31은 읽을 레인이 없어 "
                                 "자기 값을 유지합니다"),
        hint=Text(en="a lane reads lane + 8 when that lane exists in the 32-lane warp, and "
                     "otherwise keeps its own value",
                  ko="32 레인 워프 안에 레인 + 8이 있으면 그 값을 읽고, 없으면 자기 값을 "
                     "유지합니다"),
        mistakes=(
            Mistake(lambda: tuple((i + 8) % 32 for i in range(32)),
                    Text(en="shfl_down does not wrap around: lanes 24-31 have no lane i+8 and "
                            "keep their own value",
                         ko="shfl_down은 한 바퀴 돌지 않습니다: 레인 24-31은 레인 i+8이 없어 "
                            "자기 값을 유지합니다")),
            Mistake(lambda: tuple(i - 8 if i >= 8 else i for i in range(32)),
                    Text(en="that is shfl_up: shfl_down reads from the higher lane i + 8",
                         ko="그것은 shfl_up입니다: shfl_down은 더 높은 레인 i + 8에서 "
                            "읽습니다")),
        )),
    Exercise(
        "04.article_terms_80",
        Text(en="How many of the 80 products q[d]*k[d] does the article's two-warp layout add "
                "up when launched with head_dim = 80 threads?",
             ko="head_dim = 80 스레드로 런치하면 글의 두 워프 배치는 곱 q[d]*k[d] 80개 중 "
                "몇 개를 더할까요?"),
        Integer(), _article_terms_80,
        explain=lambda e: say(en=f"only threads 0 and 32 publish: warps 0 and 1 = {e} terms; "
                                 f"the third warp's {80 - e} products are dropped",
                              ko=f"스레드 0과 32만 공유 메모리에 올립니다: 워프 0, 1 = {e}개 항; 셋째 "
                                 f"워프의 곱 {80 - e}개는 버려집니다"),
        hint=Text(en="which warps have their lane 0 write into dot_products?",
                  ko="어느 워프의 레인 0이 dot_products에 쓰나요?"),
        mistakes=(Mistake(lambda: 80, Text(
            en="count again: does anything read the third warp's sum?",
            ko="다시 세어 보세요: 셋째 워프의 합을 읽는 곳이 있나요?")),)),
    Exercise(
        "04.shared_floats",
        Text(en="Shared partial-sum floats (one per warp) of the package's decode kernel for "
                "head_dim {}, {} and {}.".format(*SHARED_DIMS),
             ko="head_dim {}, {}, {}에서 패키지 디코드 커널의 공유 메모리 부분합 float 수 "
                "(워프마다 하나).".format(*SHARED_DIMS)),
        Numbers(Integer(), 3, tuple(f"head_dim {d}" for d in SHARED_DIMS)), _shared_floats,
        explain=lambda e: say(en=f"head_dim {SHARED_DIMS} -> {e} warps, one shared float each",
                              ko=f"head_dim {SHARED_DIMS} -> 워프 {e}개, 각각 공유 float 하나"),
        hint=Text(en="threads = head_dim rounded up to whole warps of 32; one float per warp",
                  ko="스레드 수 = head_dim을 32 단위 워프로 올림; 워프마다 float 하나"),
        mistakes=(
            Mistake(lambda: tuple(d // 32 for d in SHARED_DIMS),
                    Text(en="d // 32 rounds down: 80 threads need a third, partly filled warp",
                         ko="d // 32는 내림입니다: 스레드 80개에는 덜 찬 셋째 워프가 필요합니다")),
            Mistake(lambda: (2, 2, 2), Text(
                en="that is the article's fixed layout; the port has one float per warp",
                ko="그것은 글의 고정 배치입니다; 이 패키지의 커널은 워프마다 float 하나를 둡니다")),
        )),
    Exercise(
        "04.scale_error_128",
        Text(en="The article's thread 0 divides every score by SQRT_HEAD_DIM = 8.  Kept as it "
                "is for a model with head_dim 128, by what factor are the scores too large?",
             ko="글의 스레드 0은 모든 점수를 SQRT_HEAD_DIM = 8로 나눕니다.  head_dim 128 "
                "모델에 그대로 두면 점수는 몇 배 커질까요?"),
        Real(), lambda: (1 / 8) / (1 / math.sqrt(128)),
        explain=lambda e: say(en=f"1/8 against 1/sqrt(128): sqrt(128)/8 = {e:.4f}, a sharper "
                                 "softmax",
                              ko=f"1/8 대 1/sqrt(128): sqrt(128)/8 = {e:.4f}, 더 뾰족한 "
                                 "소프트맥스"),
        hint=Text(en="the right scale is 1/sqrt(head_dim); compare it with 1/8",
                  ko="올바른 스케일은 1/sqrt(head_dim)입니다; 1/8과 비교해 보세요"),
        mistakes=(
            Mistake(lambda: 8 / math.sqrt(128), Text(
                en="that is the inverse: 1/8 is larger than 1/sqrt(128), so the scores come out "
                   "too large",
                ko="그것은 역수입니다: 1/8이 1/sqrt(128)보다 크므로 점수가 너무 커집니다")),
            Mistake(lambda: 128 / 64, Text(
                en="the scale goes with the square root of head_dim, not head_dim itself",
                ko="스케일은 head_dim 자체가 아니라 그 제곱근을 따릅니다")),
        )),
)
