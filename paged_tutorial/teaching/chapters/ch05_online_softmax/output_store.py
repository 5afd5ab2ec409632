"""Puzzle ``05.write_output``: the kernel's last line (``kernels.cu:522``), written by the reader
as device code: each thread stores its output dimension, acc / d, over q, at the very element
it read its q from (``kernels.cu:469``: the output is in place).

The grader compiles her ``write_output`` into the article's kernel (``KernelParts``) and runs
it in three launches drawn afresh for every check (``cases``), batches of two to four rows with
one to three q heads, one with a head_dim whose last warp is partly used (head_dim 40 launches
64 threads: the last 24 own no dimension), one whose output is far past float16's range in a
few dimensions, against the torch oracle.  The simulator's log of q must show every thread block
writing exactly its own head's 40 elements, each once, by the thread that owns it; a store
that lands in another row or head (which that block may not have read yet), a thread past
HEAD_DIM that writes, or an output that is not acc / d is named.  The figure after every
graded run shows which thread wrote which element of q.
"""

from __future__ import annotations

from collections import Counter

import torch

from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Unsolved, Wrong
from paged_tutorial.teaching.harness.kernel_harness import (RTOL, KernelCase, bad_summary,
                                                            case_verdict, is_stub, prepare,
                                                            run_body)

#: head_dims of whole warps (no idle thread: a guard derived from HEAD_DIM % 32 fails here),
#: each wider than every narrow partly used head_dim, so a guard or a head stride taken from
#: that launch's head_dim fails here too
FULL_WARP_HEAD_DIMS = (64, 96)
#: head_dims of more than three warps, the last partly used, each wider than every whole-warp
#: one: a guard that lets every thread store once the head is wide fails here
WIDE_PARTIAL_HEAD_DIMS = (112, 136, 152)
#: batch rows of the third launch (drawn from this range): a row stride right only for the
#: first two rows fails there
MANY_ROWS = (3, 5)
#: the second launch's V magnitude in its last few dimensions is at least 10 to a power drawn
#: from this range (1e5-1e6): an output clamped to float16's range (65504) fails there
LARGE_V_EXPONENTS = (5.0, 6.0)


def cases() -> list[KernelCase]:
    """Three launches drawn afresh, in a drawn order, each with batch rows in q rows wider
    than their heads: a head_dim whose last warp is partly used (threads past head_dim own
    nothing), one of whole warps, and one of four or five warps, the last partly used;
    different numbers of q heads.  In the first, V is 0 in a few dimensions, so their output is
    exactly 0; in the second, V's magnitude is at least a drawn 1e5-1e6 in the last few
    dimensions (past float16's 65504), so their output is that large; the first two have two
    batch rows of one to four tokens, the third three or four rows of one or two tokens."""
    rng, seed = shapes.fresh_rng()
    dims = [shapes.pick(rng, shapes.PARTIAL_WARP_HEAD_DIMS),
            shapes.pick(rng, FULL_WARP_HEAD_DIMS), shapes.pick(rng, WIDE_PARTIAL_HEAD_DIMS)]
    dims = [dims[i] for i in rng.permutation(3)]
    layouts = shapes.distinct(rng, ((1, 2), (1, 3), (2, 1), (3, 1)), 3)
    rows = [2, 2, int(rng.integers(*MANY_ROWS))]
    # tokens per row: up to four in two rows, up to two in more (a launch costs rows x tokens)
    most = [4, 4, 2]
    return [shapes.case(rng, seed + i, head_dim=dims[i], gqa=layouts[i],
                        lens=[int(rng.integers(1, most[i] + 1)) for _ in range(rows[i])],
                        zero_v_dims=int(rng.integers(1, 4)) if i == 0 else 0,
                        large_v_dims=int(rng.integers(2, 5)) if i == 1 else 0,
                        large_v=float(10.0 ** rng.uniform(*LARGE_V_EXPONENTS)) if i == 1 else 0.0,
                        **shapes.drawn_constants(rng, dims[i]))
            for i in range(3)]


def q_element_name(case, element: int) -> str:
    row, rem = divmod(int(element), case.q_row_stride)
    head, dim = divmod(rem, case.head_dim)
    return say(en=f"row {row}, q head {head}, dim {dim}", ko=f"행 {row}, q 헤드 {head}, 차원 {dim}")


def check_q_writes(prep, logs, figure_for=lambda row, h: None) -> None:
    case = prep.case
    writes = logs["q"]
    for row in range(len(case.rows)):
        for h in range(case.n_q_heads):
            who = _block_name(row, h)
            mine = sorted((r for r in writes.records if r.block == (row, h) and r.op == "W"),
                          key=lambda r: (r.thread, r.seq))
            base = row * case.q_row_stride + h * case.head_dim
            for r in mine:
                if r.index != base + r.thread or r.thread >= case.head_dim:
                    if r.thread >= case.head_dim:
                        raise Wrong(figure=figure_for(row, h), message=say(
                            en=f"{who}: thread {r.thread} wrote q element {r.index} "
                               f"({q_element_name(case, r.index)}), but threads from HEAD_DIM "
                               f"= {case.head_dim} on own no dimension and must write nothing",
                            ko=f"{who}: 스레드 {particle(r.thread, '이/가')} q 원소 {r.index} "
                               f"({q_element_name(case, r.index)})에 썼지만, HEAD_DIM = "
                               f"{case.head_dim}부터의 스레드는 맡은 차원이 없어 아무것도 쓰면 "
                               "안 됩니다"))
                    raise Wrong(figure=figure_for(row, h), message=say(
                        en=f"{who}: thread {r.thread} wrote q element {r.index} "
                           f"({q_element_name(case, r.index)}), not the element it read its q "
                           f"from ({base + r.thread}): that element belongs to another block, "
                           "which may not have read its q yet",
                        ko=f"{who}: 스레드 {particle(r.thread, '이/가')} q 원소 {r.index} "
                           f"({q_element_name(case, r.index)})에 썼습니다. 자기 q를 읽은 원소"
                           f"({base + r.thread})가 아닙니다: 그 원소는 아직 자기 q를 읽지 않았을 "
                           "수도 있는 다른 블록의 것입니다"))
            counts = Counter(r.thread for r in mine)
            for d in range(case.head_dim):
                if counts.get(d, 0) != 1:
                    raise Wrong(figure=figure_for(row, h),
                                message=_not_once(row, h, d, counts.get(d, 0)))


def _block_name(row: int, h: int) -> str:
    return say(en=f"thread block (row {row}, q head {h})", ko=f"스레드 블록 (행 {row}, q 헤드 {h})")


def _not_once(row: int, h: int, thread: int, count: int) -> str:
    """The verdict for a thread that stored its output element ``count`` times, not once."""
    return say(en=f"{_block_name(row, h)}: thread {thread} wrote its output element {count} "
                  "time(s), not once",
               ko=f"{_block_name(row, h)}: 스레드 {particle(thread, '이/가')} 자기 출력 원소를 "
                  f"한 번이 아니라 {count}번 썼습니다")


def _figure(prep, logs, row: int = 0, h: int = 0):
    if not logs:
        return None
    writes = logs["q"].by_thread((row, h), "W")

    def draw():
        from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction.handoff import (
            plot_q_writes)

        return plot_q_writes(prep.case, writes, row, h)
    return draw


def grade(fn) -> tuple:
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.backends.numba_cuda.runtime import access_log

    if is_stub(fn):
        raise Unsolved(say(en="write_output has no body yet: write it",
                           ko="write_output의 본문이 아직 없습니다: 작성하세요"))
    parts = attention.ARTICLE_PARTS.replace(write_output=fn)
    drawn = cases()
    first_figure = None
    for case in drawn:
        try:
            figure = _grade_case(parts, case)
        except Wrong as wrong:
            raise Wrong(f"[{case.label}] {wrong.message}", wrong.figure) from None
        first_figure = first_figure or figure
    shapes_run = "; ".join(case.label for case in drawn)
    if not access_log.AVAILABLE:        # on a GPU: where the stores landed, not who made them
        return say(en="the output equals the torch oracle's on this GPU, every element stored "
                      "and nothing stored outside the q heads.  Which thread stored which "
                      "element, and how often, is checked in the simulator only: grade it on a "
                      f"CPU.  Shapes run: {shapes_run}",
                   ko="이 GPU에서 출력이 torch 오라클과 같고, 모든 원소가 저장되었으며 q 헤드 "
                      "밖에는 아무것도 저장되지 않았습니다.  어느 스레드가 어느 원소를 몇 번 "
                      "저장했는지는 시뮬레이터에서만 검사합니다: CPU에서 채점하세요.  실행한 "
                      f"모양: {shapes_run}"), first_figure
    return say(en="every thread of every row and q head wrote acc / d once, over the q element "
                  "it read; the threads past head_dim wrote nothing; the output equals the torch "
                  f"oracle's.  Shapes run: {shapes_run}",
               ko="모든 행·q 헤드의 모든 스레드가 자기가 읽은 q 원소 위에 acc / d를 한 번 썼고, "
                  "head_dim을 넘는 스레드는 아무것도 쓰지 않았으며, 출력이 torch 오라클과 "
                  f"같습니다.  실행한 모양: {shapes_run}"), first_figure


def run_parts(parts, case):
    """Grade a whole set of kernel parts (the package's, or a chapter's demonstration of a
    mistake in another part) at one fixed ``case``, with this puzzle's checks: a ``Verdict``."""
    return case_verdict(lambda: _grade_case(parts, case), case,
                        say(en="the article's reads and the oracle's output",
                            ko="글과 같은 읽기, 오라클과 같은 출력"))


def _grade_case(parts, case):
    prep = prepare(case)
    result = run_body(prep, parts)
    figure = _figure(prep, result.logs)
    if result.logs:                 # the stores made before a failure say more than the failure
        check_q_writes(prep, result.logs, lambda row, h: _figure(prep, result.logs, row, h))
    elif result.stray:              # on a GPU: no log, but the padding shows where stores went
        row, offset = result.stray[0]
        raise Wrong(say(
            en=f"a store landed outside every q head: {offset} element(s) after row {row}'s "
               f"last q head, in the padding between rows that no thread owns "
               f"({len(result.stray)} such element(s) in all).  Threads from HEAD_DIM = "
               f"{prep.case.head_dim} on own no dimension and must store nothing (the "
               "simulator on a CPU names the thread)",
            ko=f"저장 하나가 모든 q 헤드 밖에 떨어졌습니다: 행 {row}의 마지막 q 헤드 뒤 "
               f"{offset}번째 원소, 어느 스레드의 것도 아닌 행 사이의 패딩입니다 (그런 원소가 "
               f"모두 {len(result.stray)}개).  HEAD_DIM = {prep.case.head_dim}부터의 스레드는 "
               "맡은 차원이 없어 아무것도 저장하면 안 됩니다 (CPU의 시뮬레이터는 그 스레드를 "
               "짚어 줍니다)"), figure)
    if result.error is not None:
        raise Wrong(say(en=f"the kernel failed with your write_output: {result.error}",
                        ko=f"여러분의 write_output으로 커널이 실패했습니다: {result.error}"),
                    figure)
    if result.bad and not result.logs:  # on a GPU: an element still holding its q was not stored
        for row, h in result.bad:
            kept = torch.nonzero((result.out[row, h] == prep.q[row, h])
                                 & (prep.reference[row, h] != prep.q[row, h])).flatten()
            if len(kept):
                raise Wrong(_not_once(row, h, int(kept[0]), 0) + say(
                    en=f": it still holds the q value the kernel read there ({len(kept)} such "
                       "element(s) in this head)",
                    ko=f": 커널이 거기서 읽은 q 값이 그대로 있습니다 (이 헤드에 그런 원소 "
                       f"{len(kept)}개)"), figure)
    if result.bad:
        row, h = result.bad[0]
        got, ref = result.out[row, h], prep.reference[row, h]
        off = ~torch.isclose(got, ref, rtol=RTOL, atol=prep.atol)
        if bool(off.all()):         # every dimension is off: the value stored is not acc / d
            ratio = float((got / ref).median())
            raise Wrong(bad_summary(prep, result) + say(
                en=f".  Every store landed in place; the values are about {ratio:.3g} times the "
                   "attention output: is it acc / d?",
                ko=f".  저장 위치는 모두 맞습니다; 값이 어텐션 출력의 약 {ratio:.3g}배입니다: "
                   "acc / d로 나눴나요?"), figure)
        dim = int(torch.nonzero(off).flatten()[0])
        raise Wrong(bad_summary(prep, result) + say(
            en=f".  Every store landed in place, and most values are right, but thread {dim} "
               f"stored {float(got[dim]):.6g} where acc / d is {float(ref[dim]):.6g} "
               f"({int(off.sum())} such dimension(s) in this head): whatever its value, the "
               "output is acc / d as it is",
            ko=f".  저장 위치는 모두 맞고 값도 대부분 맞지만, 스레드 {particle(dim, '이/가')} "
               f"acc / d가 {float(ref[dim]):.6g}인 자리에 "
               f"{particle(format(float(got[dim]), '.6g'), '을/를')} 저장했습니다 "
               f"(이 헤드에 그런 차원 {int(off.sum())}개): 값이 무엇이든 출력은 acc / d "
               "그대로입니다"), figure)
    return figure


DOCSTRING = Text(
    en="Every thread of the block runs this once, after the last token.  q is flat: batch\n"
       "row active_slot starts q_row_stride elements after the row before it, and inside a\n"
       "row the q heads' vectors of HEAD_DIM elements lie one after another.  Store this\n"
       "thread's output dimension over the very element the kernel read this thread's q\n"
       "from, with store(q, index, value).  acc and d are this thread's state after the\n"
       "last token.  The block's thread count is HEAD_DIM rounded up to whole warps.\n"
       "Available by name: store, HEAD_DIM.",
    ko="블록의 모든 스레드가 마지막 토큰 뒤에 한 번 실행합니다.  q는 평평한 배열입니다: 배치\n"
       "행 active_slot은 앞 행보다 q_row_stride 원소 뒤에서 시작하고, 한 행 안에는 q 헤드마다\n"
       "HEAD_DIM 원소짜리 벡터가 차례로 놓입니다.  커널이 이 스레드의 q를 읽은 바로 그 원소\n"
       "위에 이 스레드의 출력 차원을 store(q, index, value)로 쓰세요.  acc와 d는 마지막\n"
       "토큰 뒤 이 스레드의 상태입니다.  블록의 스레드 수는 HEAD_DIM을 워프 단위로 올린\n"
       "값입니다.  이름만으로 쓸 수 있는 것: store, HEAD_DIM.")

HINT = Text(
    en="The output goes exactly where the input came from (in place): which row, which head, "
       "which dimension does this thread hold?  And how many threads does a head_dim of 40 "
       "launch?",
    ko="출력은 입력이 온 바로 그 자리로 갑니다(in-place): 이 스레드가 맡은 것은 어느 행, 어느 "
       "헤드, 어느 차원인가요?  그리고 head_dim이 40이면 스레드가 몇 개 뜨나요?")

PUZZLES = (
    Puzzle(
        "05.write_output", Text(en="the in-place store of the output over q",
                                ko="출력을 q 자리에 쓰기 (in-place)"),
        "def write_output(q, q_row_stride, active_slot, q_head, thread_id, acc, d):",
        DOCSTRING, HINT,
        Text(en="the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a "
                "GPU), three launches drawn afresh for every check: a head_dim with a "
                "partly used last warp, one of whole warps and one of four or five warps, the "
                "last partly used; two to four rows, one to three q heads, q rows wider than "
                "their heads; outputs exactly 0 and outputs past float16's range",
             ko="글의 디코드 커널 (attention.py; CPU에서는 시뮬레이터, GPU에서는 GPU), "
                "채점할 때마다 새로 뽑는 런치 세 개: 마지막 워프를 일부만 쓰는 head_dim, "
                "워프를 다 쓰는 head_dim, 워프 네다섯 개에 마지막 워프를 일부만 쓰는 head_dim; "
                "행 두 개에서 네 개, q 헤드 한 개에서 세 개, 헤드보다 넓은 q 행; 정확히 0인 출력과 "
                "float16 범위를 넘는 출력"),
        "kernels.cu:522", grade),
)
