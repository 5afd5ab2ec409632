"""Puzzle ``05.write_output``: the kernel's last line (``kernels.cu:522``), written by the reader
as device code: each thread stores its output dimension, acc / d, over q, at the very element
it read its q from (``kernels.cu:469``: the output is in place).

The grader compiles her ``write_output`` into the article's kernel (``KernelParts``) and runs
it for a batch of two rows with two q heads each, head_dim 40 (64 threads: the last 24 own no
dimension), against the torch oracle.  The simulator's log of q must show every thread block
writing exactly its own head's 40 elements, each once, by the thread that owns it; a store
that lands in another row or head (which that block may not have read yet), a thread past
HEAD_DIM that writes, or an output that is not acc / d is named.  The figure after every
graded run shows which thread wrote which element of q.
"""

from __future__ import annotations

from collections import Counter

from paged_tutorial.teaching.language import Text, say
from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong
from paged_tutorial.teaching.puzzles.kernel_harness import KernelCase, bad_summary, prepare, run_body

CASE = KernelCase("two rows, two q heads, head_dim 40 (a partly used second warp)",
                  rows=((1, 3), (0, 2)), head_dim=40, n_q_heads=2, max_slots=2, max_seq_len=16,
                  num_blocks=4, seed=50)


def q_element_name(case, element: int) -> str:
    row, rem = divmod(int(element), case.n_q_heads * case.head_dim)
    head, dim = divmod(rem, case.head_dim)
    return say(en=f"row {row}, q head {head}, dim {dim}", ko=f"행 {row}, q 헤드 {head}, 차원 {dim}")


def check_q_writes(prep, logs) -> None:
    case = prep.case
    writes = logs["q"]
    for row in range(len(case.rows)):
        for h in range(case.n_q_heads):
            who = say(en=f"thread block (row {row}, q head {h})",
                      ko=f"스레드 블록 (행 {row}, q 헤드 {h})")
            mine = [r for r in writes.records if r.block == (row, h) and r.op == "W"]
            base = (row * case.n_q_heads + h) * case.head_dim
            for r in mine:
                if r.index != base + r.thread or r.thread >= case.head_dim:
                    if r.thread >= case.head_dim:
                        raise Wrong(say(
                            en=f"{who}: thread {r.thread} wrote q element {r.index} "
                               f"({q_element_name(case, r.index)}), but threads from HEAD_DIM "
                               f"= {case.head_dim} on own no dimension and must write nothing",
                            ko=f"{who}: 스레드 {r.thread} 가 q 원소 {r.index} "
                               f"({q_element_name(case, r.index)}) 에 썼지만, HEAD_DIM = "
                               f"{case.head_dim} 부터의 스레드는 맡은 차원이 없어 아무것도 쓰면 "
                               "안 됩니다"))
                    raise Wrong(say(
                        en=f"{who}: thread {r.thread} wrote q element {r.index} "
                           f"({q_element_name(case, r.index)}), not the element it read its q "
                           f"from ({base + r.thread}): that element belongs to another block, "
                           "which may not have read its q yet",
                        ko=f"{who}: 스레드 {r.thread} 가 q 원소 {r.index} "
                           f"({q_element_name(case, r.index)}) 에 썼습니다. 자기 q 를 읽은 원소"
                           f"({base + r.thread})가 아닙니다: 그 원소는 아직 자기 q 를 읽지 않았을 "
                           "수도 있는 다른 블록의 것입니다"))
            counts = Counter(r.thread for r in mine)
            for d in range(case.head_dim):
                if counts.get(d, 0) != 1:
                    raise Wrong(say(
                        en=f"{who}: thread {d} wrote its output element {counts.get(d, 0)} "
                           "time(s), not once",
                        ko=f"{who}: 스레드 {d} 가 자기 출력 원소를 한 번이 아니라 "
                           f"{counts.get(d, 0)}번 썼습니다"))


def _figure(prep, logs, row: int = 0, h: int = 0):
    if not logs:
        return None
    writes = logs["q"].by_thread((row, h), "W")

    def draw():
        from paged_tutorial.teaching.viz.handoff import plot_q_writes

        return plot_q_writes(prep.case, writes, row, h)
    return draw


def grade(fn) -> tuple:
    from paged_tutorial.backends.numba_cuda.kernels import attention

    prep = prepare(CASE)
    result = run_body(prep, attention.ARTICLE_PARTS.replace(write_output=fn))
    figure = _figure(prep, result.logs)
    if result.logs:                 # the stores made before a failure say more than the failure
        check_q_writes(prep, result.logs)
    if result.error is not None:
        raise Wrong(say(en=f"the kernel failed with your write_output: {result.error}",
                        ko=f"여러분의 write_output 으로 커널이 실패했습니다: {result.error}"),
                    figure)
    if result.bad:
        row, h = result.bad[0]
        got, ref = result.out[row, h], prep.reference[row, h]
        ratio = float((got / ref).median())
        raise Wrong(bad_summary(prep, result) + say(
            en=f".  Every store landed in place; the values are about {ratio:.3g} times the "
               "attention output: is it acc / d?",
            ko=f".  저장 위치는 모두 맞습니다; 값이 어텐션 출력의 약 {ratio:.3g}배입니다: acc / d "
               "인가요?"), figure)
    return say(en="every thread of both rows and both heads wrote acc / d once, over the q "
                  "element it read; the 24 threads past head_dim 40 wrote nothing; the output "
                  "equals the torch oracle's",
               ko="두 행·두 헤드의 모든 스레드가 자기가 읽은 q 원소 위에 acc / d 를 한 번 썼고, "
                  "head_dim 40 을 넘는 24개 스레드는 아무것도 쓰지 않았으며, 출력이 torch "
                  "오라클과 같습니다"), figure


DOCSTRING = Text(
    en="Every thread of the block runs this once, after the last token.  q is the flat\n"
       "[rows][q heads][HEAD_DIM] array the kernel read this thread's q from, at\n"
       "active_slot * q_row_stride + q_head * HEAD_DIM + thread_id; store this thread's\n"
       "output dimension, acc / d, over it with store(q, index, value).  The block has\n"
       "HEAD_DIM threads rounded up to whole warps: threads past HEAD_DIM own no dimension.\n"
       "Available by name: store, HEAD_DIM.",
    ko="블록의 모든 스레드가 마지막 토큰 뒤에 한 번 실행합니다.  q 는 커널이 이 스레드의 q 를\n"
       "active_slot * q_row_stride + q_head * HEAD_DIM + thread_id 에서 읽은 평평한\n"
       "[rows][q heads][HEAD_DIM] 배열입니다; 이 스레드의 출력 차원 acc / d 를 그 위치에\n"
       "store(q, index, value) 로 쓰세요.  블록의 스레드 수는 HEAD_DIM 을 워프 단위로 올린\n"
       "값이라 HEAD_DIM 을 넘는 스레드는 맡은 차원이 없습니다.  이름만으로 쓸 수 있는 것: store,\n"
       "HEAD_DIM.")

HINT = Text(
    en="The output goes exactly where the input came from (in place); a thread without a "
       "dimension must not write at all.",
    ko="출력은 입력이 온 바로 그 자리로 갑니다(in-place); 맡은 차원이 없는 스레드는 아무것도 쓰면 "
       "안 됩니다.")

PUZZLES = (
    Puzzle(
        "05.write_output", Text(en="the in-place store of the output over q",
                                ko="출력을 q 자리에 쓰기 (in-place)"),
        "def write_output(q, q_row_stride, active_slot, q_head, thread_id, acc, d):",
        DOCSTRING, HINT,
        "the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a GPU), "
        "two rows, two q heads, head_dim 40",
        "kernels.cu:522", grade),
)
