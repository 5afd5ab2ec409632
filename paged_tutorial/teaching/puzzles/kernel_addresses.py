"""Puzzles on the decode kernel's addressing (the article's section on logical block ->
physical block -> byte address, ``kernels.cu:470-485``): the reader writes one step of the
kernel, the grader compiles it into the article's kernel (``attention.KernelParts``), runs it
on a poisoned cache and compares with the torch oracle.

- ``02.table_index``   the three-term index into the flat block table (kernels.cu:480)
- ``03.k_index``        one thread's K element (kernels.cu:484)

The loop over blocks itself (its bounds, the table lookup, the K/V addresses) is the body
puzzle ``03.walk_blocks`` (``block_walk``).
"""

from __future__ import annotations

import numpy as np

from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.puzzles import shapes
from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong, check_compiles
from paged_tutorial.teaching.puzzles.kernel_harness import (KernelCase, bad_summary, prepare,
                                                            recorded_k_reads, replay, run)

RUNS_IN = Text(en="the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a "
                  "GPU)",
               ko="글의 디코드 커널 (attention.py; CPU에서는 시뮬레이터, GPU에서는 GPU)")



def table_cases() -> list[KernelCase]:
    """Two table layouts drawn afresh: slots, layers (the one read among them) and logical
    blocks per sequence all differ between the two, and no layout has as many layers as
    logical blocks per sequence."""
    rng, seed = shapes.fresh_rng()
    slots = shapes.distinct(rng, (2, 3), 2)
    layers = shapes.distinct(rng, (2, 3, 4), 2)
    # MAX_BLOCKS_PER_SEQ: different in the two layouts, and never equal to N_LAYERS (where a
    # layer stride of N_LAYERS would happen to be right)
    first = shapes.pick(rng, [m for m in (3, 4, 5) if m != layers[0]])
    per_seq = [first, shapes.pick(rng, [m for m in (3, 4, 5) if m not in (first, layers[1])])]
    out = []
    for i in range(2):
        n = slots[i]
        lens = [int(rng.integers(1, 40)) for _ in range(n)]
        out.append(shapes.case(rng, seed + i, head_dim=shapes.pick(rng, (16, 24)), gqa=(1, 1),
                               lens=lens, num_layers=layers[i], max_slots=n,
                               slots=list(rng.permutation(n)),
                               max_seq_len=16 * per_seq[i]))
    return out


def k_cases() -> list[KernelCase]:
    """Two launches drawn afresh with different head_dims (one with a partly used last warp),
    numbers of KV heads and GQA ratios, so that no stride can be a constant."""
    rng, seed = shapes.fresh_rng()
    dims = [shapes.pick(rng, shapes.PARTIAL_WARP_HEAD_DIMS), shapes.pick(rng, (16, 32, 64))]
    kv_heads = shapes.distinct(rng, (2, 3), 2)
    layouts = [(kv, shapes.pick(rng, (1, 2))) for kv in kv_heads]
    return [shapes.case(rng, seed + i, head_dim=dims[i], gqa=layouts[i],
                        lens=[int(rng.integers(17, 33))], max_slots=1, slots=[0])
            for i in range(2)]


SAMPLE_ARGS = {
    "block_table_index": (1, 2, 0, 3, 4),
    "k_index": (3, 2, 1, 5, 2048, 64, 32),
}


def element_name(config, element: int) -> str:
    """An element index of the cache buffer in the article's terms."""
    c = config
    block, rem = divmod(int(element), c.BLOCK_ELEMS)
    half = "K" if rem < c.V_OFFSET_ELEMS else "V"
    row, col = divmod(rem % c.V_OFFSET_ELEMS, c.KV_DIM)
    head, dim = divmod(col, c.head_dim)
    return say(en=f"{half} of row {row} of physical block {block}, kv head {head}, dim {dim}",
               ko=f"물리 블록 {block}의 {row}번 행, KV 헤드 {head}, 차원 {dim}의 {half}")


def entry_name(config, index: int) -> str:
    c = config
    slot, rem = divmod(int(index), c.num_layers * c.MAX_BLOCKS_PER_SEQ)
    layer, logical = divmod(rem, c.MAX_BLOCKS_PER_SEQ)
    return say(en=f"entry {index} = (slot {slot}, layer {layer}, logical block {logical})",
               ko=f"(슬롯 {slot}, 레이어 {layer}, 논리 블록 {logical})의 항목 {index}")


def _figure(prep, reps, result, block=None):
    """Reads of thread block ``block`` (default: the first wrong one) against the article's, in
    the cache buffer."""
    row, h = block or result.bad[0]
    trace = prep.traces[(row, h)]
    rep = next(r for r in reps if (r.row, r.q_head) == (row, h))
    recorded = recorded_k_reads(result.logs, prep, row, h)
    reads = recorded if recorded is not None else rep.elements()
    source = "recorded in the simulated launch" if recorded is not None else \
        "computed by your function"
    slot, n = prep.case.rows[row]

    def draw():
        from paged_tutorial.teaching.viz.addresses import plot_block_reads

        return plot_block_reads(prep.case.config, trace.k_index.ravel(), reads,
                                title=f"K reads of block (row {row} = slot {slot}, q head {h}), "
                                      f"seq_len {n}: {source}")
    return draw


def _table_figure(prep, reps, result, block=None):
    row, h = block or result.bad[0]
    trace = prep.traces[(row, h)]
    rep = next(r for r in reps if (r.row, r.q_head) == (row, h))
    reads = rep.table_index
    source = "computed by your function"
    if result.logs:
        reads = result.logs["block_table"].by_block("R").get((row, h), [])
        source = "recorded in the simulated launch"

    def draw():
        from paged_tutorial.teaching.viz.addresses import plot_table_reads

        return plot_table_reads(prep.case.config, trace.table_index, reads,
                                title=f"block-table entries read by block (row {row}, q head "
                                      f"{h}): {source}")
    return draw


def _grade(part: str, fn, cases, explain):
    """Run ``fn`` as ``part`` of the kernel on every case; raise Wrong on the first wrong one,
    else return the figure of the first case's reads (drawn after a right answer too)."""
    from paged_tutorial.backends.numba_cuda.kernels import attention

    parts = attention.ARTICLE_PARTS.replace(**{part: fn})
    preps = [prepare(case) for case in cases]
    reps = []
    for prep in preps:                                   # refuses reads outside memory
        try:
            reps.append(replay(prep, parts))
        except Wrong as wrong:
            raise Wrong(f"[{prep.case.label}] {wrong.message}", wrong.figure) from None
    check_compiles(fn, SAMPLE_ARGS[part])
    figure = None
    for prep, rep in zip(preps, reps):
        result = run(prep, parts)
        draw = _table_figure if part == "block_table_index" else _figure
        if not result.ok:
            raise Wrong(f"[{prep.case.label}] {bad_summary(prep, result)}.  "
                        f"{explain(prep, rep, result)}", figure=draw(prep, rep, result))
        try:
            _no_extra_reads(prep, rep)
        except Wrong as wrong:
            raise Wrong(f"[{prep.case.label}] {wrong.message}", wrong.figure) from None
        if figure is None:          # the picture of a right run: its first thread block
            figure = draw(prep, rep, result, (0, 0))
    return figure


def _no_extra_reads(prep, reps) -> None:
    """A right output can hide a read the article's kernel does not make (an unassigned
    table entry whose block is then read for 0 tokens): refuse it too."""
    c = prep.case.config
    for rep in reps:
        trace = prep.traces[(rep.row, rep.q_head)]
        extra = sorted(set(rep.table_index) - set(trace.table_index.tolist()))
        if extra:
            slot, n = prep.case.rows[rep.row]
            raise Wrong(say(
                en=f"the output is right, but for slot {slot} (seq_len {n}) the kernel also "
                   f"reads {entry_name(c, extra[0])}, which holds no token of the sequence (-1 "
                   "in the engine's table); at max_seq_len it would lie past the slot's row",
                ko=f"출력은 맞지만, 슬롯 {slot} (seq_len {n})에 대해 커널이 "
                   f"{entry_name(c, extra[0])}도 읽습니다. 이 항목은 시퀀스의 토큰을 담지 않습니다 "
                   "(엔진 테이블에서 -1); max_seq_len에서는 슬롯의 행을 넘어섭니다"))
        if not set(rep.elements().tolist()) <= set(trace.k_index.ravel().tolist()):
            raise Wrong(say(en="the output is right, but the kernel reads cache elements the "
                               "article's kernel does not read",
                            ko="출력은 맞지만, 커널이 글의 커널이 읽지 않는 캐시 원소를 "
                               "읽습니다"))


# --- 02.table_index ----------------------------------------------------------------------

def _explain_table(prep, reps, result) -> str:
    c = prep.case.config
    for rep in reps:
        trace = prep.traces[(rep.row, rep.q_head)]
        for lb, (got, want) in enumerate(zip(rep.table_index, trace.table_index)):
            if got != want:
                slot = prep.case.rows[rep.row][0]
                shape = f"[{c.max_slots}][{c.num_layers}][{c.MAX_BLOCKS_PER_SEQ}]"
                return say(
                    en=f"For slot {slot}, layer {prep.case.layer}, logical block {lb} your index "
                       f"reads {entry_name(c, got)}; the block of (slot {slot}, layer "
                       f"{prep.case.layer}, logical block {lb}) is elsewhere in the {shape} "
                       "table",
                    ko=f"슬롯 {slot}, 레이어 {prep.case.layer}, 논리 블록 {lb}에 대해 여러분의 "
                       f"인덱스는 {particle(entry_name(c, got), '을/를')} 읽습니다; (슬롯 {slot}, 레이어 "
                       f"{prep.case.layer}, 논리 블록 {lb})의 블록은 {shape} 테이블의 다른 "
                       "곳에 있습니다")
    return say(en="The table entries read look right; check what else the function returns",
               ko="읽은 테이블 항목은 맞아 보입니다; 함수가 돌려주는 다른 값을 확인하세요")


def grade_table_index(fn) -> tuple:
    drawn = table_cases()
    figure = _grade("block_table_index", fn, drawn, _explain_table)
    shapes_run = "; ".join(case.label for case in drawn)
    return say(en="every block of every slot found through your index in two table layouts: "
                  "the kernel's output equals the torch oracle's on a poisoned cache.  Shapes "
                  f"run: {shapes_run}",
               ko="두 가지 테이블 배치에서 모든 슬롯의 모든 블록을 여러분의 인덱스로 찾았습니다: 오염된 "
                  f"캐시에서 커널 출력이 torch 오라클과 같습니다.  실행한 모양: {shapes_run}"), figure


# --- 03.k_index ---------------------------------------------------------------------------

def _explain_k(prep, reps, result) -> str:
    c = prep.case.config
    for rep in reps:
        trace = prep.traces[(rep.row, rep.q_head)]
        for t, (got, want) in enumerate(zip(rep.k_index, trace.k_index)):
            wrong = np.flatnonzero(got != want)
            if wrong.size:
                d = int(wrong[0])
                return say(
                    en=f"q head {rep.q_head} (kv head {rep.kv_head}), token {t}: thread {d} "
                       f"reads element {int(got[d])}, which is {element_name(c, got[d])}; it "
                       f"needs {element_name(c, want[d])}",
                    ko=f"q 헤드 {rep.q_head} (KV 헤드 {rep.kv_head}), 토큰 {t}: 스레드 {particle(d, '이/가')} "
                       f"원소 {particle(f'{int(got[d])} ({element_name(c, got[d])})', '을/를')} "
                       f"읽습니다; 필요한 것은 "
                       f"{element_name(c, want[d])}")
    return say(en="The K elements read look right; check what else the function returns",
               ko="읽은 K 원소는 맞아 보입니다; 함수가 돌려주는 다른 값을 확인하세요")


def grade_k_index(fn) -> tuple:
    drawn = k_cases()
    figure = _grade("k_index", fn, drawn, _explain_k)
    shapes_run = "; ".join(case.label for case in drawn)
    return say(en="every kv head's K found in scattered blocks at two head_dims: the kernel's "
                  f"output equals the torch oracle's on a poisoned cache.  Shapes run: "
                  f"{shapes_run}",
               ko="두 가지 head_dim에서 흩어진 블록의 모든 KV 헤드의 K를 찾았습니다: 오염된 "
                  f"캐시에서 커널 출력이 torch 오라클과 같습니다.  실행한 모양: {shapes_run}"), \
        figure


PUZZLES = (
    Puzzle(
        "02.table_index", Text(en="the three-term block-table index, inside the kernel",
                               ko="커널 안의 세 항 블록 테이블 인덱스"),
        "def block_table_index(slot, layer, logical_block, N_LAYERS, MAX_BLOCKS_PER_SEQ):",
        Text(en="Return the position, in the flat block table, of the entry for (cache slot,\n"
                "layer, logical block).  The table is laid out as [slot][layer][logical block]:\n"
                "every slot has N_LAYERS rows of MAX_BLOCKS_PER_SEQ entries.  The kernel then\n"
                "reads physical_block = block_table[block_table_index(...)].",
             ko="평평한 블록 테이블에서 (캐시 슬롯, 레이어, 논리 블록) 항목의 위치를 돌려주세요.\n"
                "테이블은 [슬롯][레이어][논리 블록] 순서입니다: 슬롯마다 MAX_BLOCKS_PER_SEQ\n"
                "항목짜리 행이 N_LAYERS개 있습니다.  커널은 그다음\n"
                "physical_block = block_table[block_table_index(...)]를 읽습니다."),
        Text(en="How many entries does one whole slot take?  And one layer of one slot?",
             ko="슬롯 하나 전체는 항목을 몇 개 차지하나요?  슬롯 하나의 레이어 하나는요?"),
        Text(en=RUNS_IN.en + ", two table layouts drawn afresh for every check (slots, layers, "
                "logical blocks)",
             ko=RUNS_IN.ko + ", 채점할 때마다 새로 뽑는 테이블 배치 두 가지 (슬롯, 레이어, 논리 블록 "
                "수)"),
        "kernels.cu:480", grade_table_index),
    Puzzle(
        "03.k_index", Text(en="one thread's K address", ko="스레드 하나의 K 주소"),
        "def k_index(physical_block, token, kv_head, thread_id, BLOCK_ELEMS, KV_DIM, HEAD_DIM):",
        Text(en="Return the element of the cache buffer that thread `thread_id` multiplies with\n"
                "q: the K value of dimension thread_id, kv head kv_head, token row `token` of\n"
                "physical_block.  Counted in elements, not bytes (the article's byte address\n"
                "divided by 2 for bf16).  A block holds BLOCK_ELEMS elements: BLOCK_SIZE rows of\n"
                "K, each KV_DIM = n_kv_heads x HEAD_DIM elements, then the same rows of V (which\n"
                "the kernel finds V_OFFSET_ELEMS further).",
             ko="스레드 `thread_id`가 q와 곱하는 캐시 버퍼의 원소 번호를 돌려주세요: physical_block\n"
                "의 토큰 행 `token`, KV 헤드 kv_head, 차원 thread_id의 K 값입니다.  바이트가 아니라\n"
                "원소 단위입니다 (글의 바이트 주소를 bf16이면 2로 나눈 값).  블록 하나는\n"
                "BLOCK_ELEMS 원소를 담습니다: K 행 BLOCK_SIZE개 (행마다 KV_DIM = n_kv_heads x\n"
                "HEAD_DIM 원소), 그 뒤에 같은 수의 V 행 (커널은 V_OFFSET_ELEMS 뒤에서 찾습니다)."),
        Text(en="Four terms: where the block starts, where the row starts inside it, where the "
                "head's slice starts inside the row, and the thread's own dimension.",
             ko="네 항: 블록이 시작하는 곳, 그 안에서 행이 시작하는 곳, 행 안에서 헤드 구간이 "
                "시작하는 곳, 그리고 스레드 자신의 차원."),
        Text(en=RUNS_IN.en + ", two shapes drawn afresh for every check (head_dim, kv heads, "
                "GQA ratio)",
             ko=RUNS_IN.ko + ", 채점할 때마다 새로 뽑는 모양 두 가지 (head_dim, KV 헤드 수, GQA "
                "비율)"),
        "kernels.cu:484", grade_k_index),
)
