"""Puzzle ``03.walk_blocks``: the decode kernel's loop over the sequence's logical blocks,
written by the reader as the device code every thread runs (``kernels.cu:470-485`` and the
loops around the score and the softmax): how many blocks, the block-table lookup with the
article's three-term index, the partly filled last block, this thread's K and V elements, and
the calls of ``token_score`` and ``softmax_update`` for every token.

The grader compiles her ``walk_blocks`` into the article's kernel (``KernelParts``) and runs it
on a poisoned cache (every element and table entry the article's kernel does not read is NaN
or points at a NaN block), in two launches drawn afresh for every check (``cases``): head_dims
whose last warp is partly used (threads past head_dim have ``owns_dim`` False and must read
nothing), GQA ratios other than the article's 4, two to four layers and a layer between the
first and the last, batch rows in the reverse order of their slots and a slot past the
second, sequences with a partly filled last block and one that fills its last block exactly,
one token of the first block 9.5 to 30 above every other token, whose V is scaled up so that
together they weigh about as much as it, and a sequence past eight blocks whose every score
lies far below 0.  Besides the output, the simulator's access logs must show, for every thread
block, the article's table entries and, for every thread, each of its K and V elements of the
sequence read exactly once and nothing else; a wrong answer is told the shape, and which
block, thread, entry or token went wrong.

After every graded run the figure shows which thread read which element of the cache
(``harness.addresses.plot_thread_reads``).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Unsolved, Wrong
from paged_tutorial.teaching.chapters.ch02_block_table.kernel_addresses import (
    element_name, entry_name)
from paged_tutorial.teaching.harness.kernel_harness import (KernelCase, bad_summary, case_verdict,
                                                            divergence_message, is_stub,
                                                            prepare, run_body)



#: BLOCK_SIZEs of the first launch (its rows end one token into a block and on a block's end)
FIRST_BLOCK_SIZES = (8, 12)
#: BLOCK_SIZEs of the second launch: a few tokens per block, so that its walk past eight
#: blocks stays a short launch
LONG_WALK_BLOCK_SIZES = (3, 4, 5, 6)
#: the logical blocks the second launch's sequence fills (low, high), past eight: a walk that
#: stops after a fixed number of blocks leaves tokens out
LONG_WALK_BLOCKS = (9, 12)
#: the range the second launch's highest score is drawn from: far below 0, so that a running
#: max started anywhere but -inf stays above every score and exp() of each underflows to 0
LOW_SCORE_TOP = (-850.0, -250.0)
#: how far below the highest score the second launch's other scores reach (drawn in this
#: range): tens, so that many tokens score ten or more below the running max
SCORE_SPREAD = (20.0, 50.0)
#: how far below the first launch's peak (one token of the first block) its other tokens score
#: (each drawn between the two; their V scaled up so that together they weigh about as much
#: as the peak): past 9.5, so a walk that leaves out tokens more than a margin of up to 30
#: below the running max leaves out some of them
FAR_BELOW_PEAK = (9.5, 30.0)
#: the first launch's number of layers; it reads one of the layers between the first and
#: the last
FIRST_LAYER_COUNTS = (3, 4)
#: the second launch's number of layers (it reads a layer the first does not)
SECOND_LAYER_COUNTS = (2, 3, 4)
#: the first launch's number of cache slots (low, high): one of its rows is in slot 2 or
#: later, so a slot folded onto fewer slots reads another sequence's row of the table
FIRST_SLOT_COUNTS = (3, 5)


def _is_power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def cases() -> list[KernelCase]:
    """Two launches drawn afresh: partly used last warps (two different head_dims), GQA ratios
    other than 4, two different BLOCK_SIZEs (3 to 12, one of them not a power of two), three
    or four layers then two to four, each launch reading another layer (never layer 0, the
    first never its last), a first launch whose every row has one token of its first block
    9.5 to 30 above all the others (their V scaled up so that together they weigh about as
    much as it) and whose rows sit in two of three to five slots (one in
    slot 2 or later), in the reverse order of their slots, a sequence of three blocks, the
    last holding one token, and whole blocks; a second launch whose one sequence fills nine
    to twelve blocks and whose every score lies far below 0 (the highest between -850 and
    -250, the others up to tens below it); softmax scales that are not 1/sqrt(head_dim) and q
    rows wider than their heads."""
    rng, seed = shapes.fresh_rng()
    dims = shapes.distinct(rng, (24, 40, 48), 2)
    # one KV head, then two or three (a K address that swaps the token and the KV head shows)
    layouts = [shapes.pick(rng, ((1, 2), (1, 3))), shapes.pick(rng, ((2, 1), (3, 1), (2, 3)))]
    # two different BLOCK_SIZEs, one of them not a power of two (no shift or mask stands in
    # for the division); the first small enough that its sequence spans three blocks, and
    # never 16 (a count rounded up with a literal 15 is right at 16 only)
    first_bs = shapes.pick(rng, FIRST_BLOCK_SIZES)
    sizes = [first_bs, shapes.pick(rng, [b for b in LONG_WALK_BLOCK_SIZES if not (
        _is_power_of_two(first_bs) and _is_power_of_two(b))])]
    # two layers read, neither layer 0, the first between the first and the last: no
    # constant layer, and not the last layer's row, passes
    layers = shapes.pick(rng, FIRST_LAYER_COUNTS)
    layer = int(rng.integers(1, layers - 1))
    second_layers = [(n, other) for n in SECOND_LAYER_COUNTS for other in range(1, n)
                     if other != layer]
    # the first launch's rows in two slots of three to five, one of them 2 or later
    max_slots = int(rng.integers(FIRST_SLOT_COUNTS[0], FIRST_SLOT_COUNTS[1] + 1))
    high = int(rng.integers(2, max_slots))
    slots = [high, int(rng.integers(0, high))]
    bs = sizes[0]
    # a last block holding one token, and whole blocks: every rounding of the block count
    # other than up, (seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE, is wrong at one of the two
    first = shapes.case(rng, seed, head_dim=dims[0], gqa=layouts[0],
                        lens=[2 * bs + 1, bs * int(rng.integers(1, 3))],
                        num_layers=layers, layer=layer, max_slots=max_slots, slots=slots,
                        max_seq_len=bs * shapes.pick(rng, (3, 5)),
                        far_below_peak=FAR_BELOW_PEAK,
                        **shapes.drawn_constants(rng, dims[0], bs))
    bs = sizes[1]
    layers, layer = shapes.pick(rng, second_layers)
    blocks = int(rng.integers(LONG_WALK_BLOCKS[0], LONG_WALK_BLOCKS[1] + 1))
    # the last of the blocks holds one to BLOCK_SIZE tokens
    n = (blocks - 1) * bs + int(rng.integers(1, bs + 1))
    # every score far below 0, spread over tens: a walk whose running max does not start at
    # -inf, or that leaves tokens far below the max out of the softmax, shows
    top = float(rng.uniform(*LOW_SCORE_TOP))
    band = (top - float(rng.uniform(*SCORE_SPREAD)), top)
    second_slots = int(rng.integers(2, 5))
    second = shapes.case(rng, seed + 1, head_dim=dims[1], gqa=layouts[1], lens=[n],
                         num_layers=layers, layer=layer, max_slots=second_slots,
                         slots=[int(rng.integers(1, second_slots))], score_band=band,
                         # a logical block or two of the table's row spare
                         max_seq_len=bs * (blocks + int(rng.integers(1, 3))),
                         **shapes.drawn_constants(rng, dims[1], bs))
    return [first, second]


def _block_name(prep, row: int, h: int) -> str:
    slot, n = prep.case.rows[row]
    return say(en=f"thread block (row {row} = slot {slot}, q head {h}; seq_len {n})",
               ko=f"스레드 블록 (행 {row} = 슬롯 {slot}, q 헤드 {h}; seq_len {n})")


def check_table_reads(prep, logs, figure_for=lambda row, h: None) -> None:
    """Every thread block reads the article's table entries, in order, and no other."""
    c = prep.case.config
    reads = logs["block_table"]
    for (row, h), trace in prep.traces.items():
        got = []
        for r in reads.records:
            if r.block == (row, h) and r.op == "R" and r.index not in got:
                got.append(r.index)
        want = trace.table_index.tolist()
        if got == want:
            continue
        who = _block_name(prep, row, h)
        if len(got) != len(want) and set(got[:len(want)]) <= set(want):
            raise Wrong(figure=figure_for(row, h), message=say(
                en=f"{who} read {len(got)} block-table entries, but its {trace.seq_len} tokens "
                   f"fill {len(want)} logical block(s) of BLOCK_SIZE {c.BLOCK_SIZE}: check how "
                   "many blocks the loop visits",
                ko=f"{particle(who, '이/가')} 블록 테이블 항목을 {len(got)}개 읽었지만 토큰 {trace.seq_len}개는 "
                   f"BLOCK_SIZE {c.BLOCK_SIZE}의 논리 블록 {len(want)}개를 채웁니다: 루프가 도는 "
                   "블록 수를 확인하세요"))
        lb = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got),
                                                                               len(want)))
        wrong = got[lb] if lb < len(got) else None
        raise Wrong(figure=figure_for(row, h), message=say(
            en=f"{who}, logical block {lb}: it read "
               + (f"block_table[{wrong}] ({entry_name(c, wrong)})" if wrong is not None
                  else "no entry")
               + f"; the article's {entry_name(c, want[lb])}",
            ko=f"{who}, 논리 블록 {lb}: "
               + (f"{particle(f'block_table[{wrong}] ({entry_name(c, wrong)})', '을/를')} 읽었습니다"
                  if wrong is not None else "항목을 읽지 않았습니다")
               + f"; 글의 인덱스는 {entry_name(c, want[lb])}"))


def check_idle_threads(prep, logs, figure_for=lambda row, h: None) -> None:
    """No thread past HEAD_DIM (owns_dim False) reads the cache.  Checked on the reads logged
    so far even when the launch failed: such a read is what takes a thread out of the buffer."""
    c = prep.case.config
    reads = logs["kv_cache"]
    for (row, h) in prep.traces:
        who = _block_name(prep, row, h)
        by_thread = reads.by_thread((row, h), "R")
        idle = sorted(t for t, elems in by_thread.items() if t >= c.head_dim and len(elems))
        if idle:
            t = idle[0]
            e = int(by_thread[t][0])
            raise Wrong(figure=figure_for(row, h), message=say(
                en=f"{who}: thread {t} read element {e} ({element_name(c, e)}), but the block's "
                   f"threads from HEAD_DIM = {c.head_dim} on own no dimension (owns_dim is False "
                   f"in the partly used last warp): threads {idle[0]}-{idle[-1]} must read "
                   "nothing (on a GPU such a read can leave the buffer)",
                ko=f"{who}: {t}번 스레드가 {e}번 원소({element_name(c, e)})를 읽었지만, "
                   f"HEAD_DIM = {c.head_dim}부터의 스레드는 맡은 차원이 없습니다 (일부만 쓰는 "
                   f"마지막 워프에서 owns_dim은 False): {idle[0]}-{idle[-1]}번 스레드는 아무것도 "
                   "읽으면 안 됩니다 (GPU에서는 그런 읽기가 버퍼를 벗어날 수 있습니다)"))


def check_cache_reads(prep, logs, figure_for=lambda row, h: None) -> None:
    """Every thread reads each K and V element of its dimension of the sequence once, and
    nothing else."""
    c = prep.case.config
    check_idle_threads(prep, logs, figure_for)
    reads = logs["kv_cache"]
    for (row, h), trace in prep.traces.items():
        who = _block_name(prep, row, h)
        by_thread = reads.by_thread((row, h), "R")
        for d in range(c.head_dim):
            want = {int(e): (t, half) for half, index in (("K", trace.k_index), ("V",
                                                                                 trace.v_index))
                    for t, e in enumerate(index[:, d].tolist())}
            counts = Counter(by_thread.get(d, np.zeros(0, dtype=np.int64)).tolist())
            stray = next((e for e in counts if e not in want), None)
            if stray is not None:
                raise Wrong(figure=figure_for(row, h), message=say(
                    en=f"{who}: thread {d} read element {stray} ({element_name(c, stray)}), "
                       "which is not its element of any token of this sequence",
                    ko=f"{who}: 스레드 {particle(d, '이/가')} 원소 "
                       f"{particle(f'{stray} ({element_name(c, stray)})', '을/를')} "
                       "읽었는데, 이 시퀀스의 어떤 토큰의 원소도 아닙니다"))
            for e, (t, half) in sorted(want.items(), key=lambda item: item[1]):
                n = counts.get(e, 0)
                if n != 1:
                    lb, row_in = int(trace.logical_block[t]), int(trace.token_in_block[t])
                    raise Wrong(figure=figure_for(row, h), message=say(
                        en=f"{who}: thread {d} read the {half} element of token {t} (logical "
                           f"block {lb}, row {row_in}; element {e}) {n} times, not once",
                        ko=f"{who}: 스레드 {particle(d, '이/가')} 토큰 {t} (논리 블록 {lb}, {row_in}번 행; 원소 "
                           f"{e})의 {half} 원소를 한 번이 아니라 {n}번 읽었습니다"))


def _figure(prep, logs, row: int = 0, h: int = 0):
    if not logs:
        return None
    slot, n = prep.case.rows[row]
    head_dim = prep.case.head_dim
    reads = logs["kv_cache"].by_thread((row, h), "R")

    def draw():
        from paged_tutorial.teaching.harness.addresses import plot_thread_reads

        return plot_thread_reads(prep.case.config, reads,
                                 title=f"thread block (row {row} = slot {slot}, q head {h}), "
                                       f"seq_len {n}, head_dim {head_dim}: which thread read "
                                       "which element")
    return draw


#: the kernel's parts a walk may call: the score and the online softmax (notebooks 04 and 05);
#: every other step of the walk is what this puzzle asks for
GIVEN_PARTS = ("token_score", "softmax_update")


def kernel_steps_called(fn) -> list[str]:
    """The kernel's own step parts (``block_table_index``, ``k_index``...) that ``fn`` calls
    by name without defining them itself: the build would hand it the engine's."""
    from paged_tutorial.backends.numba_cuda.kernels.attention import PART_NAMES, own_function
    from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import global_names

    called, todo, seen = [], [getattr(fn, "py_func", fn)], set()
    while todo:                        # her walk, and the helpers of hers it calls
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        for name in global_names(fn.__code__):
            value = fn.__globals__.get(name)
            if own_function(value):
                todo.append(value)
            elif name in PART_NAMES and name not in GIVEN_PARTS and name not in called:
                called.append(name)
    return called


def grade(fn) -> tuple:
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.backends.numba_cuda.runtime import access_log

    if is_stub(fn):
        raise Unsolved(say(en="walk_blocks has no body yet: write it",
                           ko="walk_blocks의 본문이 아직 없습니다: 작성하세요"))
    steps = kernel_steps_called(fn)
    if steps:
        raise Wrong(say(
            en=f"walk_blocks calls {', '.join(steps)}, which it does not define: the kernel "
               "would hand it the engine's own step.  This puzzle is every step of the walk "
               "(the block count, the table index, the last block's fill, the K and V "
               "addresses): write them in walk_blocks, or in helpers you define yourself; "
               "token_score and softmax_update are the parts it may call",
            ko=f"walk_blocks가 스스로 정의하지 않은 {particle(', '.join(steps), '을/를')} "
               "부릅니다: 커널은 거기에 엔진 자신의 단계를 넘겨 줍니다.  이 퍼즐은 루프의 모든 "
               "단계(블록 수, 테이블 인덱스, 마지막 블록의 채움, K·V 주소)입니다: walk_blocks "
               "안에서, 또는 직접 정의한 도우미 함수로 쓰세요; 부를 수 있는 부분은 token_score와 "
               "softmax_update입니다"))
    parts = attention.ARTICLE_PARTS.replace(walk_blocks=fn)
    drawn = cases()
    first_figure = None
    for case in drawn:
        figure = _grade_case(parts, case)
        first_figure = first_figure or figure
    shapes_run = "; ".join(case.label for case in drawn)
    if not access_log.AVAILABLE:        # on a GPU: the output, not the reads behind it
        return say(en="the output equals the torch oracle's on this GPU.  Which table entries "
                      "and which K and V elements each thread read, and how often, is checked "
                      f"in the simulator only: grade it on a CPU.  Shapes run: {shapes_run}",
                   ko="이 GPU에서 출력이 torch 오라클과 같습니다.  각 스레드가 어느 테이블 항목과 "
                      "어느 K·V 원소를 몇 번 읽었는지는 시뮬레이터에서만 검사합니다: CPU에서 "
                      f"채점하세요.  실행한 모양: {shapes_run}"), first_figure
    return say(en="every thread block of every launch read the article's table entries, "
                  "every K and V element of each thread exactly once (nothing past head_dim), "
                  f"and the output equals the torch oracle's.  Shapes run: {shapes_run}",
               ko="모든 런치의 모든 스레드 블록이 글의 블록 테이블 항목을 읽었고, 각 스레드가 "
                  "자기 K·V 원소를 정확히 한 번씩 읽었으며 (head_dim을 넘는 스레드는 읽지 않음), "
                  f"출력이 torch 오라클과 같습니다.  실행한 모양: {shapes_run}"), first_figure


def run_parts(parts, case):
    """Grade a whole set of kernel parts (the package's, or a chapter's demonstration of a
    mistake in another part) at one fixed ``case``, with this puzzle's checks: a ``Verdict``."""
    return case_verdict(lambda: _grade_case(parts, case), case,
                        say(en="the article's reads and the oracle's output",
                            ko="글과 같은 읽기, 오라클과 같은 출력"))


def _grade_case(parts, case):
    """Run one drawn launch; raise Wrong naming the shape, else return its figure."""
    prep = prepare(case)
    result = run_body(prep, parts)
    figure = _figure(prep, result.logs)
    at = say(en=f"[{case.label}] ", ko=f"[{case.label}] ")
    raised = result.error is not None and "sim_shim" not in result.error
    divergence = result.shared.divergence() if result.shared is not None else None
    if divergence is not None and not raised:
        raise Wrong(at + divergence_message(divergence) + say(
            en=" (every thread of a block must visit the same tokens: the loop bounds may "
               "depend on the sequence, not on thread_id)",
            ko=" (블록의 모든 스레드가 같은 토큰을 돌아야 합니다: 루프 범위는 시퀀스에 따라 "
               "정해지고 thread_id에 따라 달라지면 안 됩니다)"), figure)
    if result.error is not None and result.logs:
        try:
            check_idle_threads(prep, result.logs,
                               lambda row, h: _figure(prep, result.logs, row, h))
        except Wrong as wrong:
            raise Wrong(at + wrong.message, wrong.figure) from None
    if result.error is not None:
        raise Wrong(at + say(en=f"the kernel failed with your walk_blocks: {result.error}",
                             ko=f"여러분의 walk_blocks로 커널이 실패했습니다: {result.error}"),
                    figure)
    try:
        if result.logs:
            def figure_for(row, h):
                return _figure(prep, result.logs, row, h)
            check_table_reads(prep, result.logs, figure_for)
            check_cache_reads(prep, result.logs, figure_for)
    except Wrong as wrong:
        raise Wrong(at + wrong.message, wrong.figure) from None
    if result.bad:
        row, h = result.bad[0]
        if not result.logs:
            note = far_below_zero(case) or far_below_peak(case)
            raise Wrong(at + bad_summary(prep, result) + unlogged_reads_hint(case)
                        + (f".  {note}" if note else ""), figure)
        not_a_read = say(en="not from a read", ko="읽기 때문이 아닙니다")
        raise Wrong(at + bad_summary(prep, result, nan_means=not_a_read)
                    + reads_were_right(case), _figure(prep, result.logs, row, h))
    return figure


def reads_were_right(case) -> str:
    """What a wrong output whose reads were all the article's is told: where to look next."""
    note = far_below_zero(case) or far_below_peak(case)
    return say(en=".  The reads were the article's: what happens to each token's score and V?",
               ko=".  읽기는 글과 같습니다: 각 토큰의 점수와 V는 어떻게 쓰였나요?") \
        + (f"  {note}" if note else "")


def far_below_zero(case) -> str:
    """For a launch whose every score was drawn far below 0, a sentence: the scores' range,
    and what to look at ("" for any other launch)."""
    if case.score_band is None:
        return ""
    low, high = case.score_band
    return say(en=f"Every score of this launch lies between {low:.0f} and {high:.0f}, far "
                  "below 0: what does each token's `exp(score - current_max)` give, from the "
                  "running max your walk starts with?",
               ko=f"이 런치의 모든 점수는 {low:.0f}에서 {high:.0f} 사이로 0보다 한참 "
                  "아래입니다: 여러분의 루프가 시작하는 누적 최댓값에서, 각 토큰의 "
                  "`exp(score - current_max)`는 얼마가 되나요?")


def far_below_peak(case) -> str:
    """For a launch with one token far above the others, a sentence: how far, and what to
    look at ("" for any other launch)."""
    if case.far_below_peak is None:
        return ""
    low, high = case.far_below_peak
    return say(en=f"In this launch one token of the first block scores {low:g} to {high:g} "
                  "above every other token, whose V is scaled up so that together they weigh "
                  "about as much as it: does every token reach the softmax, however far below "
                  "the running max?",
               ko=f"이 런치에서는 첫 블록의 토큰 하나가 다른 모든 토큰보다 {low:g}-{high:g} 높고, "
                  "나머지 토큰의 V는 모두 합쳐 그 토큰만큼 무게가 나가도록 키워져 있습니다: "
                  "누적 최댓값보다 한참 아래인 토큰도 모두 softmax에 들어가나요?")


def unlogged_reads_hint(case) -> str:
    """What a wrong output can be told where no access log exists (on a GPU): the reads were
    not seen, so the verdict names what to check, idle threads first when the launch has
    them, and where the reads can be seen."""
    from paged_tutorial.backends.numba_cuda.kernels import attention

    threads = attention.block_threads(case.head_dim)
    idle = say(en=f"; at head_dim {case.head_dim} threads {case.head_dim}-{threads - 1} own no "
                  "dimension (owns_dim is False) and must read nothing: a read of theirs is "
                  "poisoned memory here",
               ko=f"; head_dim {case.head_dim}에서는 {case.head_dim}-{threads - 1}번 스레드가 "
                  "맡은 차원이 없어 (owns_dim은 False) 아무것도 읽으면 안 됩니다: 그 읽기가 "
                  "여기서는 오염된 메모리입니다") if threads > case.head_dim else ""
    return say(en=".  A GPU logs no reads, so which thread read what is not known here (the "
                  "simulator, without a GPU, names it): check the block count, the table index, "
                  "the last block's fill and each thread's K and V addresses" + idle,
               ko=".  GPU는 읽기를 기록하지 않아 어느 스레드가 무엇을 읽었는지 여기서는 알 수 "
                  "없습니다 (GPU 없이 시뮬레이터에서 채점하면 알려 줍니다): 블록 수, 테이블 "
                  "인덱스, 마지막 블록의 채움, 각 스레드의 K·V 주소를 확인하세요" + idle)


DOCSTRING = Text(
    en="Every thread of the block runs this: walk the sequence's logical blocks, look each\n"
       "one up in block_table (a flat [slots][N_LAYERS][MAX_BLOCKS_PER_SEQ] array), and for\n"
       "every token that block holds (only seq_len tokens in all) load this thread's K\n"
       "element, get the score with token_score(q_val, k, thread_id, scale, dot_products,\n"
       "score), load the V element and fold both in with\n"
       "softmax_update(current_max, d, acc, score, v).  Return (current_max, d, acc),\n"
       "starting from (-inf, 0, 0).\n\n"
       "Available by name: BLOCK_SIZE, N_LAYERS, MAX_BLOCKS_PER_SEQ, BLOCK_ELEMS, KV_DIM,\n"
       "HEAD_DIM, V_OFFSET_ELEMS (addresses in elements, not bytes), load(kv_cache, i),\n"
       "token_score, softmax_update, float32, math.  A thread with owns_dim False holds no\n"
       "dimension: it reads nothing and uses 0.0, but still calls token_score.",
    ko="블록의 모든 스레드가 실행합니다: 시퀀스의 논리 블록을 차례로 돌며 block_table (평평한\n"
       "[slots][N_LAYERS][MAX_BLOCKS_PER_SEQ] 배열)에서 물리 블록을 찾고, 그 블록이 담은\n"
       "토큰마다 (모두 합쳐 seq_len개) 이 스레드의 K 원소를 읽어\n"
       "token_score(q_val, k, thread_id, scale, dot_products, score)로 점수를 얻고, V 원소를\n"
       "읽어 softmax_update(current_max, d, acc, score, v)로 누적합니다.\n"
       "(-inf, 0, 0)에서 시작해 (current_max, d, acc)를 돌려주세요.\n\n"
       "이름만으로 쓸 수 있는 것: BLOCK_SIZE, N_LAYERS, MAX_BLOCKS_PER_SEQ, BLOCK_ELEMS, KV_DIM,\n"
       "HEAD_DIM, V_OFFSET_ELEMS (주소는 바이트가 아니라 원소 단위), load(kv_cache, i),\n"
       "token_score, softmax_update, float32, math.  owns_dim이 False인 스레드는 맡은 차원이\n"
       "없습니다: 아무것도 읽지 않고 0.0을 쓰지만 token_score는 호출합니다.")

HINT = Text(
    en="Two nested loops: logical blocks, then the tokens of one block; the last block may hold "
       "fewer than BLOCK_SIZE.  The table is indexed by the cache slot (slot), not the batch "
       "row; the K element of a token sits in its physical block's row, kv head and dimension, "
       "and V is V_OFFSET_ELEMS further.",
    ko="두 겹의 루프: 논리 블록, 그리고 한 블록의 토큰; 마지막 블록은 BLOCK_SIZE보다 적게 담을 수 "
       "있습니다.  블록 테이블은 배치 행이 아니라 캐시 슬롯(slot)으로 인덱스합니다; 토큰의 K 원소는 "
       "물리 블록의 그 행, KV 헤드, 차원에 있고 V는 V_OFFSET_ELEMS 뒤에 있습니다.")

PUZZLES = (
    Puzzle(
        "03.walk_blocks", Text(en="the loop over logical blocks: table lookup, partial last "
                                  "block, K and V addresses",
                               ko="논리 블록을 도는 루프: 블록 테이블 조회, 덜 찬 마지막 블록, "
                                  "K·V 주소"),
        "def walk_blocks(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id, "
        "owns_dim, q_val, scale, dot_products, score):",
        DOCSTRING, HINT,
        Text(en="the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a "
                "GPU), two launches drawn afresh for every check: head_dims with a partly used "
                "last warp, GQA ratios other than 4, two to four layers, rows in another order "
                "than their slots, one token far above the others whose V is scaled up, a sequence "
                "past eight blocks whose scores all lie far below 0",
             ko="글의 디코드 커널 (attention.py; CPU에서는 시뮬레이터, GPU에서는 GPU), "
                "채점할 때마다 새로 뽑는 런치 두 개: 마지막 워프를 일부만 쓰는 head_dim, 4가 "
                "아닌 GQA 비율, 레이어 두 개에서 네 개, 슬롯과 순서가 다른 배치 행, 나머지보다 "
                "한참 높은 토큰 하나와 V를 키운 나머지 토큰, 점수가 모두 "
                "0보다 한참 아래인, 여덟 블록을 넘는 시퀀스"),
        "kernels.cu:470-485", grade),
)
