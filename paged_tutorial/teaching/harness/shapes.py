"""The shapes a kernel puzzle runs at, drawn afresh for every check.

A function that only works for the shape it was tried on (a hard-coded head_dim, number of
KV heads, GQA ratio, table layout or sequence length) must fail, so no grader runs at a fixed
shape: each check draws its cases from a generator seeded by ``os.urandom`` and a counter.
The case's ``label`` names everything drawn (and the seed), so a failing verdict says at
which shape it failed and the reader can rebuild the case with ``KernelCase`` and ``prepare``.

Shapes stay small: the simulator spends about 2.5 ms per barrier round of 64 threads.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import numpy as np

from paged_tutorial.config import BLOCK_SIZE_DEFAULT as BLOCK_SIZE
from paged_tutorial.teaching.language import particle, say
from paged_tutorial.teaching.harness.kernel_harness import KernelCase

#: head dimensions whose last warp is only partly used (threads past head_dim own nothing)
PARTIAL_WARP_HEAD_DIMS = (24, 40, 48, 56)
#: (num_kv_heads, q heads per kv head): GQA ratios other than the article's 4
GQA_LAYOUTS = ((1, 2), (1, 3), (2, 1), (3, 1), (2, 2))
#: tokens per block that are not a power of two: the engine and the kernel take any block size,
#: so a shift by log2(BLOCK_SIZE) or a mask with BLOCK_SIZE - 1 must fail where one is drawn
UNEVEN_BLOCK_SIZES = (12, 24)
#: tokens per block a kernel check draws from (the engine's default is 16)
BLOCK_SIZES = (8, 12, 16, 24, 32)
#: softmax scales are drawn as the model's 1/sqrt(head_dim) times one of these (never 1: an
#: answer that computes 1/sqrt(head_dim) itself instead of using ``scale`` must fail)
SCALE_FACTORS = (0.5, 0.75, 1.25, 1.5, 2.0)

_draws = itertools.count()


def fresh_rng() -> tuple[np.random.Generator, int]:
    """A generator no earlier check used, and its seed (named in the cases' labels)."""
    seed = (int.from_bytes(os.urandom(4), "little") + next(_draws)) % 2 ** 32
    return np.random.default_rng(seed), seed


def blocks_needed(lens, num_layers: int, block_size: int = BLOCK_SIZE) -> int:
    return sum(-(-n // block_size) for n in lens) * num_layers


def drawn_constants(rng, head_dim: int, block_size: int | None = None) -> dict:
    """The launch constants a check draws for one case, as ``case``'s keywords: BLOCK_SIZE
    (any of ``BLOCK_SIZES`` unless given), a softmax scale that is not 1/sqrt(head_dim), and
    q rows of a wider matrix (at least one element between one row's last head and the next
    row), so that none of them can be taken as a constant."""
    return {"block_size": int(pick(rng, BLOCK_SIZES)) if block_size is None else block_size,
            "scale": float(pick(rng, SCALE_FACTORS)) / float(np.sqrt(head_dim)),
            "q_row_pad": int(rng.integers(1, head_dim + 1))}


def describe(case: KernelCase) -> str:
    """Everything a case was drawn with, as the reader would write it to rebuild it."""
    lens = ", ".join(say(en=f"slot {s}: seq_len {n}", ko=f"슬롯 {s}: seq_len {n}")
                     for s, n in case.rows)
    ratio = case.n_q_heads // case.num_kv_heads
    drawn = []                         # the constants a check draws beyond the model's
    if case.block_size != BLOCK_SIZE:
        drawn.append(f"BLOCK_SIZE {case.block_size}")
    if case.scale is not None:
        drawn.append(f"scale {case.softmax_scale:.4g}")
    if case.q_row_pad:
        drawn.append(f"q_row_stride {case.q_row_stride}")
    if case.zero_v_dims:
        drawn.append(f"V = 0 in dims 0-{case.zero_v_dims - 1}")
    if case.large_v_dims:
        drawn.append(say(en=f"|V| >= {case.large_v:.3g} in dims "
                            f"{case.head_dim - case.large_v_dims}-{case.head_dim - 1}",
                         ko=f"차원 {case.head_dim - case.large_v_dims}-{case.head_dim - 1}에서 "
                            f"|V| >= {case.large_v:.3g}"))
    if case.score_band is not None:
        low, high = case.score_band
        drawn.append(say(en=f"every score between {low:.0f} and {high:.0f}",
                         ko=f"모든 점수가 {low:.0f}에서 {high:.0f} 사이"))
    if case.far_below_peak is not None:
        low, high = case.far_below_peak
        drawn.append(say(en=f"one token of the first block {low:g}-{high:g} above the rest, "
                            "their V scaled up by about e^gap",
                         ko=f"첫 블록의 토큰 하나가 나머지보다 {low:g}-{high:g} 위, 나머지의 V는 "
                            "약 e^gap배로 키움"))
    extra = "".join(f", {d}" for d in drawn)
    return say(en=f"head_dim {case.head_dim}, {case.num_kv_heads} kv head(s) x {ratio} q "
                  f"head(s) each, {case.num_layers} layer(s) (layer {case.layer} read), "
                  f"max_seq_len {case.max_seq_len}, rows [{lens}]{extra}, seed {case.seed}",
               ko=f"head_dim {case.head_dim}, KV 헤드 {case.num_kv_heads}개 (각각 q 헤드 "
                  f"{ratio}개), 레이어 {case.num_layers}개 (레이어 {particle(case.layer, '을/를')} 읽음), "
                  f"max_seq_len {case.max_seq_len}, 행 [{lens}]{extra}, 시드 {case.seed}")


def case(rng, seed: int, *, head_dim: int, gqa: tuple[int, int], lens, num_layers: int = 1,
         max_slots: int | None = None, slots=None, max_seq_len: int | None = None,
         q_scale: float = 1.0, block_size: int = BLOCK_SIZE, scale: float | None = None,
         q_row_pad: int = 0, zero_v_dims: int = 0, large_v_dims: int = 0,
         large_v: float = 0.0, layer: int | None = None,
         score_band: tuple | None = None,
         far_below_peak: tuple | None = None) -> KernelCase:
    """One launch: batch row i reads cache slot ``slots[i]`` (default: the rows in reverse
    order of their slots, so batch row and slot differ) with ``lens[i]`` tokens, in ``layer``
    (default: drawn, never 0 when there are several).  A check passes ``block_size``,
    ``scale`` and ``q_row_pad`` drawn with ``drawn_constants`` (the defaults are the model's:
    BLOCK_SIZE 16, 1/sqrt(head_dim), contiguous q rows); ``score_band`` draws every score of
    the launch from a range, ``far_below_peak`` puts one token of the first block that far
    above all the others and scales their V up (``kernel_harness.place_scores``)."""
    kv, ratio = gqa
    slots = list(slots) if slots is not None else list(range(len(lens)))[::-1]
    max_slots = max_slots or len(lens)
    bs = int(block_size)
    max_seq_len = max_seq_len or bs * (-(-max(lens) // bs) + int(rng.integers(0, 3)))
    if layer is None:                  # the layer term counts
        layer = int(rng.integers(1, num_layers)) if num_layers > 1 else 0
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer {layer} is not one of the case's {num_layers} layers: pass "
                         f"0 to {num_layers - 1}")
    draft = KernelCase("", rows=tuple(zip(slots, lens)), head_dim=head_dim, num_kv_heads=kv,
                       n_q_heads=kv * ratio, num_layers=num_layers, max_slots=max_slots,
                       max_seq_len=max_seq_len, layer=layer,
                       num_blocks=blocks_needed(lens, num_layers, bs) + 2, q_scale=q_scale,
                       seed=seed, block_size=bs, scale=scale, q_row_pad=int(q_row_pad),
                       zero_v_dims=zero_v_dims, large_v_dims=large_v_dims,
                       large_v=float(large_v), score_band=score_band,
                       far_below_peak=far_below_peak)
    return dataclasses.replace(draft, label=describe(draft))


def partly_filled(rng, low: int = 1, high: int = 2 * BLOCK_SIZE,
                  block_size: int = BLOCK_SIZE) -> int:
    """A sequence length whose last block (of ``block_size`` tokens) is partly filled."""
    while True:
        n = int(rng.integers(low, high + 1))
        if n % block_size:
            return n


def pick(rng, options):
    return options[int(rng.integers(0, len(options)))]


def distinct(rng, options, k: int):
    """``k`` different entries of ``options``, in random order."""
    return [options[i] for i in rng.permutation(len(options))[:k]]
