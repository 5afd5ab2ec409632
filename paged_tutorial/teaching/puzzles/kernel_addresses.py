"""Puzzles on the decode kernel's addressing (the article's section on logical block ->
physical block -> byte address, ``kernels.cu:470-485``): the reader writes one step of the
kernel, the grader compiles it into the article's kernel (``attention.KernelParts``), runs it
on a poisoned cache and compares with the torch oracle.

- ``02.table_index``   the three-term index into the flat block table (kernels.cu:480)
- ``03.blocks_to_read`` how many logical blocks the loop visits (kernels.cu:470-471)
- ``03.tokens_in_block`` how many rows of a block hold tokens (kernels.cu:481)
- ``03.k_index``        one thread's K element (kernels.cu:484)
"""

from __future__ import annotations

import numpy as np

from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong, check_compiles
from paged_tutorial.teaching.puzzles.kernel_harness import (KernelCase, bad_summary, prepare, recorded_k_reads, replay, run)

RUNS_IN = "the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a GPU)"

TABLE_CASES = (KernelCase("two slots, three layers", rows=((1, 20), (0, 7)), num_layers=3,
                          max_slots=2, max_seq_len=64, layer=2, num_blocks=12, seed=1),)
# slot 1 holds max_seq_len tokens: one block too many would read past the end of the table
LOOP_CASES = (KernelCase("a partly filled last block, and a sequence of max_seq_len tokens",
                         rows=((0, 21), (1, 32)), max_slots=2, max_seq_len=32, num_blocks=8,
                         seed=2),)
K_CASES = (KernelCase("two kv heads", rows=((0, 18),), num_kv_heads=2, n_q_heads=2,
                      max_seq_len=32, num_blocks=6, seed=3),)

SAMPLE_ARGS = {
    "blocks_to_read": (21, 16),
    "block_table_index": (1, 2, 0, 3, 4),
    "tokens_in_block": (21, 1, 16),
    "k_index": (3, 2, 1, 5, 2048, 64, 32),
}


def element_name(config, element: int) -> str:
    """An element index of the cache buffer in the article's terms."""
    c = config
    block, rem = divmod(int(element), c.BLOCK_ELEMS)
    half = "K" if rem < c.V_OFFSET_ELEMS else "V"
    row, col = divmod(rem % c.V_OFFSET_ELEMS, c.KV_DIM)
    head, dim = divmod(col, c.head_dim)
    return f"{half} of row {row} of physical block {block}, kv head {head}, dim {dim}"


def entry_name(config, index: int) -> str:
    c = config
    slot, rem = divmod(int(index), c.num_layers * c.MAX_BLOCKS_PER_SEQ)
    layer, logical = divmod(rem, c.MAX_BLOCKS_PER_SEQ)
    return f"entry {index} = (slot {slot}, layer {layer}, logical block {logical})"


def _figure(prep, reps, result):
    """Reads of the first wrong thread block against the article's, in the cache buffer."""
    row, h = result.bad[0]
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


def _table_figure(prep, reps, result):
    row, h = result.bad[0]
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


def _grade(part: str, fn, cases, explain) -> None:
    from paged_tutorial.backends.numba_cuda.kernels import attention

    parts = attention.ARTICLE_PARTS.replace(**{part: fn})
    preps = [prepare(case) for case in cases]
    reps = [replay(prep, parts) for prep in preps]       # refuses reads outside memory
    check_compiles(fn, SAMPLE_ARGS[part])
    for prep, rep in zip(preps, reps):
        result = run(prep, parts)
        if not result.ok:
            raise Wrong(f"{bad_summary(prep, result)}.  {explain(prep, rep, result)}",
                        figure=(_table_figure if part == "block_table_index" else _figure)(
                            prep, rep, result))
        _no_extra_reads(prep, rep)


def _no_extra_reads(prep, reps) -> None:
    """A right output can hide a read the article's kernel does not make (an unassigned
    table entry whose block is then read for 0 tokens): refuse it too."""
    c = prep.case.config
    for rep in reps:
        trace = prep.traces[(rep.row, rep.q_head)]
        extra = sorted(set(rep.table_index) - set(trace.table_index.tolist()))
        if extra:
            slot, n = prep.case.rows[rep.row]
            raise Wrong(f"the output is right, but for slot {slot} (seq_len {n}) the kernel also "
                        f"reads {entry_name(c, extra[0])}, which holds no token of the sequence "
                        "(-1 in the engine's table); at max_seq_len it would lie past the "
                        "slot's row")
        if not set(rep.elements().tolist()) <= set(trace.k_index.ravel().tolist()):
            raise Wrong("the output is right, but the kernel reads cache elements the "
                        "article's kernel does not read")


# --- 02.table_index ----------------------------------------------------------------------

def _explain_table(prep, reps, result) -> str:
    c = prep.case.config
    for rep in reps:
        trace = prep.traces[(rep.row, rep.q_head)]
        for lb, (got, want) in enumerate(zip(rep.table_index, trace.table_index)):
            if got != want:
                slot = prep.case.rows[rep.row][0]
                return (f"For slot {slot}, layer {prep.case.layer}, logical block {lb} your index "
                        f"reads {entry_name(c, got)}; the block of (slot {slot}, layer "
                        f"{prep.case.layer}, logical block {lb}) is elsewhere in the "
                        f"[{c.max_slots}][{c.num_layers}][{c.MAX_BLOCKS_PER_SEQ}] table")
    return "The table entries read look right; check what else the function returns"


def grade_table_index(fn) -> str:
    _grade("block_table_index", fn, TABLE_CASES, _explain_table)
    return ("every block of 2 slots x 3 layers found through your index: the kernel's output "
            "equals the torch oracle's on a poisoned cache")


# --- 03.blocks_to_read / 03.tokens_in_block ----------------------------------------------

def _explain_loop(prep, reps, result) -> str:
    bs = prep.case.config.BLOCK_SIZE
    for rep in reps:
        trace = prep.traces[(rep.row, rep.q_head)]
        n = rep.seq_len
        if rep.num_blocks != trace.num_blocks:
            if rep.num_blocks < trace.num_blocks:
                return (f"For seq_len {n} the loop visits {rep.num_blocks} block(s); positions "
                        f"{rep.num_blocks * bs}..{n - 1} live in logical block(s) "
                        f"{rep.num_blocks}..{trace.num_blocks - 1}, never read")
            return (f"For seq_len {n} the loop visits {rep.num_blocks} blocks, but logical block "
                    f"{trace.num_blocks} holds no token of the sequence: its table entry is -1 "
                    "in the engine's table (here it points at an all-NaN block)")
        for lb, (got, want) in enumerate(zip(rep.tokens, trace.tokens_in_block)):
            if got != want:
                first = lb * bs
                if got < want:
                    return (f"For seq_len {n}, logical block {lb} (positions {first}..) is read "
                            f"for {got} token(s); it holds {want} (positions {first}.."
                            f"{first + want - 1})")
                return (f"For seq_len {n}, logical block {lb} is read for {got} rows; it holds "
                        f"{want} token(s): rows past {want - 1} are "
                        + ("the V half of the block" if got > bs else "not written yet (NaN)"))
    return "The loop bounds look right; check what else the function returns"


def grade_blocks_to_read(fn) -> str:
    _grade("blocks_to_read", fn, LOOP_CASES, _explain_loop)
    return "seq_len 21 (16 + 5 tokens) and 32 (two full blocks): the loop reads exactly the cache"


def grade_tokens_in_block(fn) -> str:
    _grade("tokens_in_block", fn, LOOP_CASES, _explain_loop)
    return ("a partly filled last block (21 = 16 + 5) and a full one (32): every row read holds "
            "a token")


# --- 03.k_index ---------------------------------------------------------------------------

def _explain_k(prep, reps, result) -> str:
    c = prep.case.config
    for rep in reps:
        trace = prep.traces[(rep.row, rep.q_head)]
        for t, (got, want) in enumerate(zip(rep.k_index, trace.k_index)):
            wrong = np.flatnonzero(got != want)
            if wrong.size:
                d = int(wrong[0])
                return (f"q head {rep.q_head} (kv head {rep.kv_head}), token {t}: thread {d} "
                        f"reads element {int(got[d])}, which is {element_name(c, got[d])}; it "
                        f"needs {element_name(c, want[d])}")
    return "The K elements read look right; check what else the function returns"


def grade_k_index(fn) -> str:
    _grade("k_index", fn, K_CASES, _explain_k)
    return ("both kv heads' K found for 18 tokens in 2 scattered blocks: the kernel's output "
            "equals the torch oracle's on a poisoned cache")


PUZZLES = (
    Puzzle(
        "02.table_index", "the three-term block-table index, inside the kernel",
        "def block_table_index(slot, layer, logical_block, N_LAYERS, MAX_BLOCKS_PER_SEQ):",
        "Return the position, in the flat block table, of the entry for (cache slot, layer,\n"
        "logical block).  The table is laid out as [slot][layer][logical block]: every slot has\n"
        "N_LAYERS rows of MAX_BLOCKS_PER_SEQ entries.  The kernel then reads\n"
        "physical_block = block_table[block_table_index(...)].",
        "How many entries does one whole slot take?  And one layer of one slot?",
        RUNS_IN + ", 2 slots x 3 layers", "kernels.cu:480", grade_table_index),
    Puzzle(
        "03.blocks_to_read", "how many logical blocks the kernel reads",
        "def blocks_to_read(seq_len, BLOCK_SIZE):",
        "Return how many logical blocks hold the first seq_len tokens of a sequence: the bound\n"
        "of the kernel's block loop.  seq_len already counts the token just written.",
        "A partly filled last block must be read too, but a sequence of exactly 32 tokens fills "
        "two blocks, not three.",
        RUNS_IN, "kernels.cu:470-471", grade_blocks_to_read),
    Puzzle(
        "03.tokens_in_block", "how many rows of a block hold tokens",
        "def tokens_in_block(seq_len, logical_block, BLOCK_SIZE):",
        "Return how many token rows of logical block `logical_block` hold data, for a\n"
        "sequence of seq_len tokens: the bound of the kernel's token loop.",
        "Every block before the last is full.  How many tokens come before this block, and how "
        "many are left for it?",
        RUNS_IN, "kernels.cu:481", grade_tokens_in_block),
    Puzzle(
        "03.k_index", "one thread's K address",
        "def k_index(physical_block, token, kv_head, thread_id, BLOCK_ELEMS, KV_DIM, HEAD_DIM):",
        "Return the element of the cache buffer that thread `thread_id` multiplies with q: the\n"
        "K value of dimension thread_id, kv head kv_head, token row `token` of physical_block.\n"
        "Counted in elements, not bytes (the article's byte address divided by 2 for bf16).\n"
        "A block holds BLOCK_ELEMS elements: BLOCK_SIZE rows of K, each KV_DIM = n_kv_heads x\n"
        "HEAD_DIM elements, then the same rows of V (which the kernel finds V_OFFSET_ELEMS\n"
        "further).",
        "Four terms: where the block starts, where the row starts inside it, where the head's "
        "slice starts inside the row, and the thread's own dimension.",
        RUNS_IN + ", 2 kv heads", "kernels.cu:484", grade_k_index),
)
