"""Puzzles on the decode kernel's addressing (the article's section on logical block ->
physical block -> byte address, ``kernels.cu:470-485``): the reader writes one step of the
kernel, the grader compiles it into the article's kernel (``attention.KernelParts``), runs it
on a poisoned cache and compares with the torch oracle.

- ``02.table_index``   the three-term index into the flat block table (kernels.cu:480), with
                        the row length derived from MAX_SEQ_LEN, rounded up (the article's
                        constant divides and truncates); ``table_part`` puts it in the
                        kernel's place
- ``03.k_index``        one thread's K element (kernels.cu:484), from the query head: the
                        reader maps it to its KV head for a GQA ratio the check draws (the
                        article divides by 4); ``kernel_part`` puts her function in the
                        kernel's ``k_index`` place

The loop over blocks itself (its bounds, the table lookup, the K/V addresses) is the body
puzzle ``03.walk_blocks`` (``block_walk``).
"""

from __future__ import annotations

import numpy as np

from paged_tutorial.config import BLOCK_SIZE_DEFAULT as BLOCK_SIZE
from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Wrong, check_compiles
from paged_tutorial.teaching.harness.kernel_harness import (KernelCase, bad_summary, prepare,
                                                            recorded_k_reads, replay, run)

RUNS_IN = Text(en="the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a "
                  "GPU)",
               ko="글의 디코드 커널 (attention.py; CPU에서는 시뮬레이터, GPU에서는 GPU)")



def table_cases() -> list[KernelCase]:
    """Two table layouts drawn afresh: slots, layers (the one read among them), logical
    blocks per sequence and BLOCK_SIZE all differ between the two, and no layout has as many
    layers as logical blocks per sequence.  One layout's BLOCK_SIZE is not a power of two (12
    or 24: no shift or mask stands in for the division) and its max_seq_len is one token past
    a whole number of blocks (its rows hold max_seq_len / BLOCK_SIZE rounded up: every
    rounding short of the ceiling, ``round`` or adding 0.9 included, is a row too short); the
    other's max_seq_len is an odd number of whole blocks (a rounding up that adds a block
    anyway is a row too long).  Softmax scales and q row strides are drawn too."""
    rng, seed = shapes.fresh_rng()
    slots = shapes.distinct(rng, (2, 3), 2)
    layers = shapes.distinct(rng, (2, 3, 4), 2)
    short = int(rng.integers(0, 2))            # the layout whose last block holds one token
    # MAX_BLOCKS_PER_SEQ: different in the two layouts, never equal to N_LAYERS (where a
    # layer stride of N_LAYERS would happen to be right), and odd where max_seq_len is a
    # whole number of blocks (round(k + 0.5) is k + 1 for odd k only: banker's rounding)
    whole = shapes.pick(rng, [m for m in (3, 5) if m != layers[1 - short]])
    per_seq = [whole, shapes.pick(rng, [m for m in (3, 4, 5) if m not in (whole, layers[short])])]
    if short == 0:
        per_seq.reverse()
    uneven = shapes.pick(rng, shapes.UNEVEN_BLOCK_SIZES)
    sizes = [uneven, shapes.pick(rng, [b for b in shapes.BLOCK_SIZES if b != uneven])]
    if short == 1:
        sizes.reverse()
    out = []
    for i in range(2):
        n, bs = slots[i], sizes[i]
        max_seq_len = bs * (per_seq[i] - 1) + 1 if i == short else bs * per_seq[i]
        lens = [int(rng.integers(1, min(40, max_seq_len) + 1)) for _ in range(n)]
        head_dim = shapes.pick(rng, (16, 24))
        out.append(shapes.case(rng, seed + i, head_dim=head_dim, gqa=(1, 1),
                               lens=lens, num_layers=layers[i], max_slots=n,
                               slots=list(rng.permutation(n)), max_seq_len=max_seq_len,
                               **shapes.drawn_constants(rng, head_dim, bs)))
    return out


def table_part(fn, max_seq_len: int):
    """The reader's ``block_table_index(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN,
    BLOCK_SIZE)`` in the kernel's ``block_table_index`` place, for a cache of ``max_seq_len``
    tokens per sequence: the kernel's own MAX_BLOCKS_PER_SEQ is not passed on; her function
    derives the row length itself.  One adapter per (function, max_seq_len), so a kernel built
    with it is built once."""
    key = (fn, int(max_seq_len))
    if key not in _TABLE_PARTS:
        MAX_SEQ_LEN = int(max_seq_len)

        def block_table_index(slot, layer, logical_block, N_LAYERS, MAX_BLOCKS_PER_SEQ):
            return fn(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE)
        _TABLE_PARTS[key] = block_table_index
    return _TABLE_PARTS[key]


_TABLE_PARTS: dict = {}


#: q heads per KV head that 03.k_index draws from (the article's is 4): the launch with
#: four or five KV heads takes one of the small ratios, the other launch one of the large
K_INDEX_SMALL_RATIOS = (1, 2, 3)
K_INDEX_LARGE_RATIOS = (4, 5, 6, 7, 8)
K_INDEX_GQA_RATIOS = K_INDEX_SMALL_RATIOS + K_INDEX_LARGE_RATIOS
#: KV heads of the launch with many (a KV head wrapped modulo 2 or 3 shows) and of the other
K_INDEX_MANY_KV_HEADS = (4, 5)
K_INDEX_FEW_KV_HEADS = (2, 3)


def k_cases() -> list[KernelCase]:
    """Two launches drawn afresh with different head_dims (one with a partly used last warp)
    and GQA layouts: four or five KV heads with 1, 2 or 3 q heads each, and two or three KV
    heads with 4 to 8 q heads each (one of the two ratios not a power of two, 3, 5, 6 or 7),
    so the KV head a query head reads shows and no group size, KV-head count or wrap-around
    can be a constant; BLOCK_SIZE (8 to 32), a softmax scale that is not 1/sqrt(head_dim) and
    q rows wider than their heads are drawn too."""
    rng, seed = shapes.fresh_rng()
    dims = [shapes.pick(rng, shapes.PARTIAL_WARP_HEAD_DIMS), shapes.pick(rng, (16, 32, 64))]
    while True:
        ratios = [shapes.pick(rng, K_INDEX_SMALL_RATIOS), shapes.pick(rng, K_INDEX_LARGE_RATIOS)]
        if any(r & (r - 1) for r in ratios):                 # a ratio not a power of two
            break
    kv_heads = [shapes.pick(rng, K_INDEX_MANY_KV_HEADS),
                2 if ratios[1] > 5 else shapes.pick(rng, K_INDEX_FEW_KV_HEADS)]
    order = list(rng.permutation(2))                         # which head_dim gets which
    return [shapes.case(rng, seed + i, head_dim=dims[order[i]], gqa=(kv_heads[i], ratios[i]),
                        lens=[int(rng.integers(17, 25))], max_slots=1, slots=[0],
                        **shapes.drawn_constants(rng, dims[order[i]]))
            for i in range(2)]


def kernel_part(fn):
    """The reader's ``k_index(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS,
    KV_DIM, HEAD_DIM)`` in the kernel's ``k_index`` place: the kernel's own KV head is not
    passed on; her function gets the thread block's query head (``blockIdx.y``) and the q heads
    per KV head (the grid's q heads over the cache's KV_DIM // HEAD_DIM KV heads).  ``cuda``
    is bound by the kernel's build (``attention.BUILD_NAMES``), as in every part."""
    def k_index(physical_block, token, kv_head, thread_id, BLOCK_ELEMS, KV_DIM, HEAD_DIM):
        return fn(physical_block, token, cuda.blockIdx.y, thread_id,  # noqa: F821
                  cuda.gridDim.y // (KV_DIM // HEAD_DIM), BLOCK_ELEMS, KV_DIM,  # noqa: F821
                  HEAD_DIM)
    return k_index


SAMPLE_ARGS = {
    "block_table_index": (1, 2, 0, 3, 60, 16),
    "k_index": (3, 2, 5, 1, 2, 2048, 64, 32),
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
        from paged_tutorial.teaching.harness.addresses import plot_block_reads

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
        from paged_tutorial.teaching.harness.addresses import plot_table_reads

        return plot_table_reads(prep.case.config, trace.table_index, reads,
                                title=f"block-table entries read by block (row {row}, q head "
                                      f"{h}): {source}")
    return draw


def _grade(part: str, fn, cases, explain):
    """Run ``fn`` as ``part`` of the kernel on every case; raise Wrong on the first wrong one,
    else return the figure of the first case's reads (drawn after a right answer too)."""
    from paged_tutorial.backends.numba_cuda.kernels import attention

    preps = [prepare(case) for case in cases]
    reps, all_parts = [], []
    for prep in preps:                                   # refuses reads outside memory
        in_kernel = kernel_part(fn) if part == "k_index" else \
            table_part(fn, prep.case.max_seq_len)
        parts = attention.ARTICLE_PARTS.replace(**{part: in_kernel})
        all_parts.append(parts)
        try:
            reps.append(replay(prep, parts, q_head_k_index=fn if part == "k_index" else None,
                               max_seq_len_table_index=fn if part != "k_index" else None))
        except Wrong as wrong:
            raise Wrong(f"[{prep.case.label}] {wrong.message}", wrong.figure) from None
    check_compiles(fn, SAMPLE_ARGS[part])
    figure = None
    for prep, rep, parts in zip(preps, reps, all_parts):
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
    return say(en="every query head's K found through its KV head, in scattered blocks, at two "
                  "head_dims and two GQA ratios: the kernel's output equals the torch oracle's "
                  f"on a poisoned cache.  Shapes run: {shapes_run}",
               ko="두 가지 head_dim과 두 가지 GQA 비율에서, 흩어진 블록에 있는 모든 q 헤드의 "
                  "K를 그 KV 헤드를 거쳐 찾았습니다: 오염된 "
                  f"캐시에서 커널 출력이 torch 오라클과 같습니다.  실행한 모양: {shapes_run}"), \
        figure


PUZZLES = (
    Puzzle(
        "02.table_index", Text(en="the three-term block-table index, inside the kernel",
                               ko="커널 안의 세 항 블록 테이블 인덱스"),
        "def block_table_index(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):",
        Text(en="Return the position, in the flat block table, of the entry for (cache slot,\n"
                "layer, logical block).  The table is laid out as [slot][layer][logical block]:\n"
                "every slot has N_LAYERS rows, and a row has one entry for every logical block a\n"
                "sequence of up to MAX_SEQ_LEN tokens can own, BLOCK_SIZE tokens per block.  The\n"
                "check draws MAX_SEQ_LEN, not always a multiple of BLOCK_SIZE.  The kernel then\n"
                "reads physical_block = block_table[block_table_index(...)].",
             ko="평평한 블록 테이블에서 (캐시 슬롯, 레이어, 논리 블록) 항목의 위치를 돌려주세요.\n"
                "테이블은 [슬롯][레이어][논리 블록] 순서입니다: 슬롯마다 행이 N_LAYERS개\n"
                "있고, 한 행에는 토큰이 MAX_SEQ_LEN개까지인 시퀀스가 가질 수 있는 논리 블록마다\n"
                "(블록마다 토큰 BLOCK_SIZE개) 항목이 하나씩 있습니다.  채점은 MAX_SEQ_LEN을\n"
                "뽑는데, 늘 BLOCK_SIZE의 배수인 것은 아닙니다.  커널은 그다음\n"
                "physical_block = block_table[block_table_index(...)]를 읽습니다."),
        Text(en="How many entries does one row take when MAX_SEQ_LEN is not a whole number of "
                "blocks?  Then: how many does one whole slot take, and one layer of one slot?",
             ko="MAX_SEQ_LEN이 BLOCK_SIZE로 나누어떨어지지 않을 때 한 행은 항목을 몇 개 "
                "차지하나요?  그다음: 슬롯 하나 전체는 몇 개, 슬롯 하나의 레이어 하나는요?"),
        Text(en=RUNS_IN.en + ", two table layouts drawn afresh for every check (2-3 slots, 2-4 "
                "layers, 3-5 logical blocks per sequence; one max_seq_len is not a multiple of "
                "BLOCK_SIZE)",
             ko=RUNS_IN.ko + ", 채점할 때마다 새로 뽑는 테이블 배치 두 가지 (슬롯 2-3개, 레이어 "
                "2-4개, 시퀀스마다 논리 블록 3-5개; 한 배치의 max_seq_len은 BLOCK_SIZE의 배수가 "
                "아님)"),
        "kernels.cu:16-19, 480", grade_table_index),
    Puzzle(
        "03.k_index", Text(en="one thread's K address, from its query head",
                           ko="q 헤드에서 출발한 스레드 하나의 K 주소"),
        "def k_index(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM, "
        "HEAD_DIM):",
        Text(en="Return the element of the cache buffer that thread `thread_id` of the thread\n"
                "block of query head `q_head` multiplies with q: the K value of dimension\n"
                "thread_id, for that query head's KV head, token row `token` of physical_block.\n"
                "Q_PER_KV query heads share each KV head (grouped-query attention), in groups\n"
                "of consecutive query heads; the check draws Q_PER_KV (1 to 8).\n"
                "Counted in elements, not bytes (the article's byte address divided by 2 for\n"
                "bf16).  A block holds BLOCK_ELEMS elements: BLOCK_SIZE rows of K, each\n"
                "KV_DIM = n_kv_heads x HEAD_DIM elements, then the same rows of V (which the\n"
                "kernel finds V_OFFSET_ELEMS further).",
             ko="q 헤드 `q_head`의 스레드 블록에서 스레드 `thread_id`가 q와 곱하는 캐시\n"
                "버퍼의 원소 번호를 돌려주세요: physical_block의 토큰 행 `token`, 그 q 헤드가\n"
                "읽는 KV 헤드, 차원 thread_id의 K 값입니다.  q 헤드 Q_PER_KV개가 KV 헤드\n"
                "하나를 함께 씁니다 (GQA). 묶음은 연속한 q 헤드들이고,\n"
                "채점은 Q_PER_KV를 1에서 8 사이에서 뽑습니다.  바이트가 아니라 원소\n"
                "단위입니다 (글의 바이트 주소를 bf16이면 2로 나눈 값).  블록 하나는\n"
                "BLOCK_ELEMS 원소를 담습니다: K 행 BLOCK_SIZE개 (행마다 KV_DIM = n_kv_heads x\n"
                "HEAD_DIM 원소), 그 뒤에 같은 수의 V 행 (커널은 V_OFFSET_ELEMS 뒤에서 찾습니다)."),
        Text(en="First the KV head: which group of Q_PER_KV query heads is q_head in?  Then four "
                "terms: where the block starts, where the row starts inside it, where that KV "
                "head's slice starts inside the row, and the thread's own dimension.",
             ko="먼저 KV 헤드: q_head는 Q_PER_KV개씩 묶은 q 헤드의 몇 번째 묶음에 있나요?  "
                "그다음 네 항: 블록이 시작하는 곳, 그 안에서 행이 시작하는 곳, 행 안에서 그 KV "
                "헤드 구간이 시작하는 곳, 그리고 스레드 자신의 차원."),
        Text(en=RUNS_IN.en + ", two shapes drawn afresh for every check (head_dim; 4 or 5 kv "
                "heads with 1-3 q heads each, and 2 or 3 kv heads with 4-8 q heads each)",
             ko=RUNS_IN.ko + ", 채점할 때마다 새로 뽑는 모양 두 가지 (head_dim; KV 헤드 4개나 "
                "5개에 각각 q 헤드 1-3개, 그리고 KV 헤드 2개나 3개에 각각 q 헤드 4-8개)"),
        "kernels.cu:468, 484", grade_k_index),
)
