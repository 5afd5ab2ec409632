"""Puzzle ``04.token_score``: one token's score, written by the reader as the device code every
thread of the block runs (``kernels.cu:486-508``): her product, the five-step ``shfl_down_sync``
tree, the per-warp publish into shared memory, the barriers, the cross-warp combine for any
head_dim, the scale and a race-free hand-off of the score to every thread (the article's
limit 3: its kernel hands the score over in ``dot_products[0]``, which the next token's
publish overwrites with no barrier in between).

The grader compiles her ``token_score`` into the article's kernel (``KernelParts``) and runs it
for head_dim 32 (one warp), a head_dim of three warps whose last warp holds a lane or two (65, 66)
and one past 256 (9 or 10 warps: 260-292), drawn afresh for every check,
on a poisoned cache, against the torch oracle.  In the simulator it also records every
shared-memory access with its barrier epoch (``access_log.record_shared_accesses``) and every
barrier, and rejects, naming threads, cells and lines:

- a barrier that not every thread reaches (a ``cuda.syncthreads()`` inside ``if thread_id ...``:
  a deadlock on a GPU);
- a read or write outside a shared array (``dot_products[1]`` with one warp);
- a race: a write and another thread's access to the same shared cell with no barrier between
  them (a missing barrier, or the article's hand-off through ``dot_products[0]``);
- a wrong sum, diagnosed in this order: a shared cell read or added into before any thread
  set it, a score that does not follow ``scale`` (the one-hot probe below at two scales), the
  lanes the shuffle tree counted (a one-hot probe: token t's K is 1 in dimension t only), and
  the cells thread 0 combined.

After every graded run, right or wrong, the figure is the block's shared-memory hand-off
(``handoff``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Unsolved, Wrong
from paged_tutorial.teaching.harness.kernel_harness import (KernelCase, bad_summary, case_verdict,
                                                            divergence_message, is_stub,
                                                            prepare, race_message, run_body,
                                                            threads_text)

from paged_tutorial.backends.warp import WARP_SIZE  # noqa: E402


#: head_dims of three warps whose last one holds a lane or two: a warp count that rounds
#: head_dim / 33 or / 31 up, or leaves the last warp out, is wrong here
THREE_WARP_HEAD_DIMS = (65, 66)
#: head_dims past 256 (9 or 10 warps), the last warp holding a few lanes: a combine capped at
#: the 8 warps of head_dim 256 is wrong here
MANY_WARP_HEAD_DIMS = (260, 263, 289, 292)


def cases() -> list[KernelCase]:
    """Three launches drawn afresh: one warp (head_dim 32), a head_dim of three warps whose
    last one is partly used, and one past 256 (9 or 10 warps), each a few tokens long (so a
    combine that adds a fixed number of warps, up to eight, fails; each last warp holds only a
    lane or a few, so a warp count rounded from head_dim / 33 fails), each with its own
    BLOCK_SIZE, a softmax scale that is not 1/sqrt(head_dim) and q rows wider than their
    heads."""
    rng, seed = shapes.fresh_rng()
    dims = (32, shapes.pick(rng, THREE_WARP_HEAD_DIMS), shapes.pick(rng, MANY_WARP_HEAD_DIMS))
    return [shapes.case(rng, seed + i, head_dim=d, gqa=(1, 1),
                        lens=[int(rng.integers(2, 6))], max_slots=1, slots=[0],
                        **shapes.drawn_constants(rng, d))
            for i, d in enumerate(dims)]


def warps(head_dim: int) -> int:
    return -(-head_dim // WARP_SIZE)


def lane_counts(fn, scale: float = 1.0) -> np.ndarray | None:
    """How many times the reader's shuffle tree counts each lane of warp 0, times ``scale``
    (simulator only): head_dim 32, 32 tokens, token t's K one-hot in dimension t, q all ones,
    so token t's score is ``scale`` times the count of lane t.  None when it cannot be
    measured."""
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.backends.numba_cuda.runtime import access_log
    from paged_tutorial.cache.paged_cache import PagedKVCache
    from paged_tutorial.config import CacheConfig
    from paged_tutorial.teaching.oracles import kernel_device, quiet_nan_arithmetic

    if not access_log.AVAILABLE:
        return None
    c = CacheConfig(num_layers=1, num_kv_heads=1, head_dim=32, dtype="float32",
                    kv_cache_bytes=2 * 2 * 16 * 32 * 4, max_slots=1, max_seq_len=32)
    cache = PagedKVCache(c, kernel_device())
    cache.ensure_capacity(0, 32)
    buf = cache.buffer.view(c.NUM_BLOCKS, 2, 16, 32)
    buf.zero_()
    for t in range(32):
        phys = int(cache.block_table[0, 0, t // 16])
        buf[phys, 0, t % 16, t] = 1.0
    q = torch.ones(1, 1, 32, device=cache.buffer.device)
    parts = attention.ARTICLE_PARTS.replace(token_score=fn)
    try:
        with quiet_nan_arithmetic(), access_log.record_shared_accesses() as log:
            attention.decode(q, cache, cache.device_block_table(), 0, [32], [0], scale, parts)
    except Exception:
        return None
    # thread 0's last shared write of each token is the score it hands over (score[0] in
    # the article's layout): scale times the number of times lane t was counted
    writes = [a for a in log.records if a.thread == 0 and a.op == "W" and a.block == (0, 0)]
    per_token = len(writes) // 32 if len(writes) >= 32 else 0
    if not per_token:
        return None
    return np.array([writes[t * per_token + per_token - 1].value for t in range(32)])


def _lanes_message(counts: np.ndarray) -> str | None:
    wrong = {}
    for lane, n in enumerate(np.round(counts).astype(int).tolist()):
        if n != 1:
            wrong.setdefault(n, []).append(lane)
    if not wrong:
        return None
    parts = [say(en=f"lanes {threads_text(lanes)} counted {n} time(s)",
                 ko=f"레인 {particle(threads_text(lanes), '이/가')} {n}번 더해짐")
             for n, lanes in sorted(wrong.items())]
    return say(en="the shuffle tree of warp 0 does not add each of its 32 lanes once: "
               + "; ".join(parts) + " (a probe where token t's K is 1 in dimension t only)",
               ko="워프 0의 셔플 트리가 32개 레인을 한 번씩 더하지 않습니다: " + "; ".join(parts)
               + " (토큰 t의 K가 차원 t에서만 1인 시험 입력)")


#: the scales the probe runs at to see whether the score follows ``scale``
PROBE_SCALES = (1.0, 2.0)


def _scale_message(fn) -> str | None:
    """Why the score does not follow ``scale`` (the lane probe at two scales gives scores that
    are not in the scales' ratio), or None."""
    at = [lane_counts(fn, scale) for scale in PROBE_SCALES]
    if any(counts is None for counts in at):
        return None
    (low, s_low), (high, s_high) = zip(at, PROBE_SCALES)
    if np.allclose(high * s_low, low * s_high, rtol=1e-4, atol=1e-6):
        return None
    return say(en=f"the score does not follow `scale`: with the same q and K, token 0 scores "
                  f"{low[0]:.4g} at scale {s_low:g} and {high[0]:.4g} at scale {s_high:g} (a "
                  "probe where token t's K is 1 in dimension t only).  Multiply the sum by the "
                  "`scale` argument exactly once (the model's scale need not be "
                  "1/sqrt(HEAD_DIM))",
               ko=f"점수가 `scale`을 따르지 않습니다: 같은 q와 K에서 토큰 0의 점수가 scale "
                  f"{s_low:g}일 때 {low[0]:.4g}, scale {s_high:g}일 때 {high[0]:.4g}입니다 (토큰 t의 "
                  "K가 차원 t에서만 1인 시험 입력).  합에 `scale` 인자를 정확히 한 번 곱하세요 "
                  "(모델의 scale이 1/sqrt(HEAD_DIM)이라는 보장은 없습니다)")


def _unset_cell_message(result) -> str | None:
    """A thread that read a cell of dot_products or score before any thread of its block
    wrote it in this launch (a sum added into a cell never set: it counts whatever the cell
    held before), in words, or None."""
    if result.shared is None:
        return None
    written = set()
    for a in sorted(result.shared.records, key=lambda a: a.seq):
        if a.array not in ("dot_products", "score"):
            continue
        cell = (a.block, a.array, a.index)
        if a.op == "W":
            written.add(cell)
        elif cell not in written:
            name = f"{a.array}[{a.index}]"
            return say(
                en=f"thread {a.thread} read {name} (line {a.site.line} of {a.site.function}: "
                   f"`{a.site.code()}`) before any thread of block {a.block} had written it: "
                   "the cell still holds what was there before (another token's or another "
                   "launch's value), so a sum added into it counts that too.  Write a cell "
                   "before anything reads or adds into it, for every token",
                ko=f"스레드 {particle(str(a.thread), '이/가')} 블록 {a.block}의 어느 스레드도 "
                   f"쓰기 전에 {particle(name, '을/를')} 읽었습니다 ({a.site.function}의 "
                   f"{a.site.line}번 줄: `{a.site.code()}`): 그 칸에는 전에 있던 값 (다른 토큰이나 "
                   "다른 런치의 값)이 남아 있으므로, 거기에 더한 합은 그 값까지 셉니다.  토큰마다, "
                   "무엇이든 칸을 읽거나 더하기 전에 먼저 쓰세요")
    return None


def _combined_cells(result) -> list:
    """The dot_products cells thread 0 read in epoch 1 (between the first two barriers)."""
    return sorted({a.index for a in result.shared.records
                   if a.thread == 0 and a.op == "R" and a.array == "dot_products"
                   and a.epoch == 1 and a.block == (0, 0)})


def _figure(result, case):
    if result.shared is None:
        return None

    def draw():
        from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction.handoff import (
            plot_handoff)

        return plot_handoff(result.shared, (0, 0), title=f"{case.label}: shared-memory hand-off "
                            "of thread block (0, 0), first tokens")
    return draw


def _grade_case(parts, case):
    """Run one launch with ``parts``; raise Wrong naming the shape, else return its figure."""
    fn = parts.token_score
    prep = prepare(case)
    d = case.head_dim
    head = say(en=f"head_dim {d} ({warps(d)} warp(s)) [{case.label}]",
               ko=f"head_dim {d} (워프 {warps(d)}개) [{case.label}]")
    result = run_body(prep, parts)
    figure = _figure(result, case)
    # a thread that raised stops early, which looks like divergence: its error comes first,
    # except the shuffle emulation's, which a divergent barrier itself causes
    raised = result.error is not None and "sim_shim" not in result.error
    divergence = result.shared.divergence() if result.shared is not None else None
    if divergence is not None and not raised:
        raise Wrong(f"{head}: {divergence_message(divergence)}", figure)
    if result.error is not None:
        raise Wrong(say(en=f"{head}: the kernel failed with your token_score: {result.error}",
                        ko=f"{head}: 여러분의 token_score로 커널이 실패했습니다: "
                           f"{result.error}"), figure)
    races = result.shared.races() if result.shared is not None else []
    if races:
        raise Wrong(f"{head}: {race_message(races[0], len(races))}", figure)
    if result.bad:
        # the first of: a cell read before it was set (its old value makes every probe
        # below wrong too), the scale, the shuffle tree, the cells combined
        why = [bad_summary(prep, result)]
        unset = _unset_cell_message(result)
        scale = None if unset else _scale_message(fn)
        counts = None if scale or unset else lane_counts(fn)
        lanes = _lanes_message(counts) if counts is not None else None
        if scale or unset or lanes:
            why.append(unset or scale or lanes)
        elif result.shared is not None:
            cells = _combined_cells(result)
            if cells and cells != list(range(warps(d))):
                why.append(say(
                    en=f"thread 0 combined dot_products{cells}, but this block has "
                       f"{warps(d)} warp(s): cells 0..{warps(d) - 1}",
                    ko=f"스레드 0이 dot_products{particle(cells, '을/를')} 더했지만 이 블록의 "
                       f"워프는 {warps(d)}개입니다: 칸 0..{warps(d) - 1}"))
            else:
                why.append(say(en="every lane and every warp counted once: is the sum "
                                  "multiplied by scale exactly once?",
                               ko="레인과 워프는 모두 한 번씩 더해졌습니다: 합에 scale을 "
                                  "정확히 한 번 곱했나요?"))
        raise Wrong(f"{head}: " + ".  ".join(why), figure)
    return figure


def run_parts(parts, case):
    """Grade a whole set of kernel parts (the package's, or a chapter's demonstration) at one
    fixed ``case``, as the puzzle grades the reader's ``token_score``: a ``Verdict``."""
    from paged_tutorial.backends.numba_cuda.runtime import access_log

    if access_log.AVAILABLE:
        correct = say(en="no race, every barrier reached, the oracle's output",
                      ko="경합 없음, 모든 배리어 도달, 오라클과 같은 출력")
    else:
        correct = say(en="the oracle's output on this GPU (races and barriers are checked in "
                         "the simulator only)",
                      ko="이 GPU에서 오라클과 같은 출력 (경합과 배리어는 시뮬레이터에서만 검사)")
    return case_verdict(lambda: _grade_case(parts, case), case, correct, name_case=False)


def grade(fn) -> tuple:
    from paged_tutorial.backends.numba_cuda.kernels import attention

    if is_stub(fn):
        raise Unsolved(say(en="token_score has no body yet: write it",
                           ko="token_score의 본문이 아직 없습니다: 작성하세요"))
    parts = attention.ARTICLE_PARTS.replace(token_score=fn)
    last = None
    drawn = cases()
    for case in drawn:
        last = _grade_case(parts, case)
    dims = ", ".join(str(case.head_dim) for case in drawn)
    if last is None:                # on a GPU: no shared-memory log, the output alone
        return say(
            en=f"head_dim {dims}: the kernel's output equals the torch oracle's on this GPU. "
               "Races and divergent barriers are checked in the simulator only: run "
               "races.rerun_racecheck(part=token_score) (compute-sanitizer) or grade it on a "
               "CPU",
            ko=f"head_dim {dims}: 이 GPU에서 커널 출력이 torch 오라클과 같습니다. 경합과 분기 "
               "안의 배리어는 시뮬레이터에서만 검사합니다: races.rerun_racecheck("
               "part=token_score) (compute-sanitizer)를 실행하거나 CPU에서 채점하세요"), None
    message = say(
        en=f"head_dim {dims}: the kernel's output equals the torch oracle's, every barrier "
           "is reached by every thread, and no shared cell is written while another thread may "
           "still access it (no race in the access log)",
        ko=f"head_dim {dims}: 커널 출력이 torch 오라클과 같고, 모든 스레드가 모든 배리어에 "
           "도달하며, 다른 스레드가 아직 접근할 수 있는 공유 메모리 칸에 쓰지 않습니다 "
           "(접근 기록에 경합 없음)")
    return message, last


DOCSTRING = Text(
    en="Every thread of the block runs this once per token.  q_val and k are this thread's\n"
       "elements of q and of the token's K (0 for the threads past HEAD_DIM of a partial\n"
       "last warp).  Return the token's score, sum over d of q[d] * k[d] times scale, to\n"
       "every thread.\n\n"
       "Available by name: cuda (cuda.shfl_down_sync(WARP_FULL_MASK, value, offset),\n"
       "cuda.syncthreads()), WARP_SIZE, WARP_FULL_MASK, HEAD_DIM, NUM_WARPS, float32.\n"
       "dot_products is a shared float array of NUM_WARPS cells, score a shared array of\n"
       "one cell; both are shared by the whole block and reused for every token.",
    ko="블록의 모든 스레드가 토큰마다 한 번씩 실행합니다.  q_val과 k는 이 스레드가 맡은 q와\n"
       "그 토큰 K의 원소입니다 (부분 워프에서 HEAD_DIM을 넘는 스레드는 0).  토큰의 점수,\n"
       "d에 대한 q[d] * k[d]의 합에 scale을 곱한 값을 모든 스레드에 돌려주세요.\n\n"
       "이름만으로 쓸 수 있는 것: cuda (cuda.shfl_down_sync(WARP_FULL_MASK, value, offset),\n"
       "cuda.syncthreads()), WARP_SIZE, WARP_FULL_MASK, HEAD_DIM, NUM_WARPS, float32.\n"
       "dot_products는 NUM_WARPS 칸의 공유 메모리 float 배열, score는 한 칸짜리 공유\n"
       "배열입니다; 둘 다 블록 전체가 함께 쓰고 모든 토큰에서 다시 씁니다.")

HINT = Text(
    en="Shuffle down by half the warp, then half of that, until lane 0 holds the warp's sum; "
       "lane 0 of each warp publishes it; wait for everyone before thread 0 reads the cells, "
       "and again before anyone reads the score.  Where does the score wait, so that the next "
       "token's publish cannot overwrite it while a slow warp still reads it?",
    ko="워프의 절반만큼 shfl_down 하고, 다시 그 절반만큼... 레인 0이 워프의 합을 가질 때까지; "
       "각 워프의 레인 0이 그 합을 공유 메모리에 올립니다; 스레드 0이 칸을 읽기 전에 모두를 "
       "기다리고, 누구든 점수를 읽기 전에 다시 기다립니다.  다음 토큰에서 공유 메모리에 올리는 값이 느린 워프가 "
       "아직 읽는 점수를 덮어쓰지 않으려면 점수는 어디에 두어야 할까요?")

PUZZLES = (
    Puzzle(
        "04.token_score", Text(en="one token's score: shuffle tree, publish, barriers, combine, "
                                  "a race-free hand-off",
                               ko="토큰 하나의 점수: 셔플 트리, 공유 메모리에 올리기, 배리어, 합치기, 경합 없는 "
                                  "전달"),
        "def token_score(q_val, k, thread_id, scale, dot_products, score):",
        DOCSTRING, HINT,
        Text(en="the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a "
                "GPU), head_dim 32, one of three warps and one past 256 (9 or 10 warps, the last "
                "holding a lane or a few), drawn afresh for every check with BLOCK_SIZE and the scale, with the "
                "simulator's shared-memory race check",
             ko="글의 디코드 커널 (attention.py; CPU에서는 시뮬레이터, GPU에서는 GPU), "
                "head_dim 32, 그리고 채점할 때마다 BLOCK_SIZE, scale과 함께 새로 뽑는, 워프 세 "
                "개짜리 head_dim 하나와 256을 넘는 head_dim 하나 (워프 9-10개, 마지막 워프는 레인 몇 개만 씀); "
                "시뮬레이터의 공유 메모리 경합 검사 포함"),
        "kernels.cu:486-508", grade),
)
