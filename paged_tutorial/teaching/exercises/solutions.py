"""Worked solutions of every exercise and puzzle (``reveal(name)`` returns them).

An exercise's solution is the arithmetic a reader would do by hand, from the article's numbers:
the checker computes the right answer independently, from the package, and the tests check
that the two agree.  A puzzle's solution is a function with the puzzle's signature (a class,
for ``06.allocator``); where the package's own code *is* the answer (the kernel's parts in
``attention.py``, the sharing rule in ``prefix_cache.py``), the solution is that code, named
in ``PACKAGE_CODE`` and imported only when revealed: importing this module imports no kernel,
and no grader imports this module.  ``reveal`` shows a puzzle's solution as its source code.
"""

from __future__ import annotations

import importlib
import math

from paged_tutorial.teaching.chapters.ch06_block_lifetime.allocator import AllocatorBase

from paged_tutorial.cache.block_allocator import CacheFullError
from paged_tutorial.teaching.exercises.registry import get
from paged_tutorial.teaching.exercises.solution_code import Solution

# --- the article's numbers -------------------------------------------------------------
N_LAYERS, KV_DIM, BF16, BLOCK_SIZE = 16, 8 * 64, 2, 16
V_OFFSET = BLOCK_SIZE * KV_DIM * BF16                 # 16384
BLOCK_BYTES = 2 * V_OFFSET                            # 32768
MAX_BLOCKS_PER_SEQ = 2048 // BLOCK_SIZE               # 128
TOKEN_BYTES = N_LAYERS * 2 * KV_DIM * BF16            # K and V of one token, all layers


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


EXERCISE_SOLUTIONS = {
    # 00: why page the cache
    "00.kv_bytes_per_token": TOKEN_BYTES,
    "00.decode_read_bytes": 1000 * TOKEN_BYTES,
    "00.contiguous_vs_paged_waste": ((2048 - 100) * TOKEN_BYTES,
                                     (_ceil_div(100, BLOCK_SIZE) * BLOCK_SIZE - 100) * TOKEN_BYTES),
    # 01: one block's layout
    "01.float32_constants": (BLOCK_SIZE * KV_DIM * 4, 2 * BLOCK_SIZE * KV_DIM * 4,
                             2 * 1024 ** 3 // (2 * BLOCK_SIZE * KV_DIM * 4)),
    "01.v_byte_offset": (1000 * BLOCK_BYTES + (21 % BLOCK_SIZE) * KV_DIM * BF16 + 5 * 64 * BF16
                         + 10 * BF16 + V_OFFSET),
    "01.smollm2_block32": (3 * 64, 32 * 3 * 64 * BF16, 2048 // 32),
    # 02: the block table
    "02.flat_index": 1 * N_LAYERS * MAX_BLOCKS_PER_SEQ + 5 * MAX_BLOCKS_PER_SEQ + 3,
    "02.unravel": (3000 // (N_LAYERS * MAX_BLOCKS_PER_SEQ),
                   3000 % (N_LAYERS * MAX_BLOCKS_PER_SEQ) // MAX_BLOCKS_PER_SEQ,
                   3000 % MAX_BLOCKS_PER_SEQ),
    "02.entries_used": (_ceil_div(100, BLOCK_SIZE) + _ceil_div(20, BLOCK_SIZE)) * N_LAYERS,
    # 03: addresses
    "03.flat_index": 1 * N_LAYERS * MAX_BLOCKS_PER_SEQ + 3 * MAX_BLOCKS_PER_SEQ + 5,
    "03.v_byte_offset": 3 * BLOCK_BYTES + V_OFFSET + 5 * KV_DIM * BF16 + 2 * 64 * BF16 + 10 * BF16,
    "03.blocks_for_33": (_ceil_div(33, BLOCK_SIZE), min(33 - 2 * BLOCK_SIZE, BLOCK_SIZE)),
    "03.blocks_for_48": (_ceil_div(48, BLOCK_SIZE), min(48 - 2 * BLOCK_SIZE, BLOCK_SIZE)),
    "03.gqa_reads": 32 // 8,
    # 04: warp shuffles
    "04.shfl_down_8": tuple(i + 8 if i + 8 < 32 else i for i in range(32)),
    "04.article_terms_80": 32 + 32,
    "04.shared_floats": tuple(_ceil_div(d, 32) for d in (64, 80, 128)),
    "04.scale_error_128": math.sqrt(128) / 8,
    # 05: online softmax
    "05.corrections": (0.0, math.exp(0.5 - 2.0), 1.0, math.exp(2.0 - 3.0)),
    "05.denominator": sum(math.exp(s - 3.0) for s in (0.5, 2.0, 1.0, 3.0)),
    "05.q_index": 2 * (4 * 64) + 1 * 64 + 5,
    # 06: block lifetime
    "06.table_bytes_per_decode_step": 2 * N_LAYERS * MAX_BLOCKS_PER_SEQ * 4 * N_LAYERS,
    "06.next_pop": 60,                 # slot 0 popped 63, 62 (layer 0), 61, 60 (layer 1)
    "06.peak_blocks": _ceil_div(40 + 9 - 1, BLOCK_SIZE) * 30,
    # 07: the full model
    "07.steps_for_three_requests": 1 + 9 + 1 + 20,
    "07.sequences_in_2gib": (2 * 1024 ** 3 // BLOCK_BYTES) // (MAX_BLOCKS_PER_SEQ * N_LAYERS),
    "07.smollm2_kv_bytes_per_token": 30 * 2 * 3 * 64 * 4,
    # 09: prefix caching (beyond the article)
    "09.second_prefill_tokens": BLOCK_SIZE,          # 3 of 4 blocks cached; the 4th computed
    "09.blocks_saved": (8 - 1) * (100 // BLOCK_SIZE) * 30,   # full shared blocks x copies x layers
}

def kv_byte_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                   ITEMSIZE):
    """01.kv_offset: the article's block layout (main.cpp:866-872), in bytes."""
    V_OFFSET = BLOCK_SIZE * KV_DIM * ITEMSIZE          # all the K rows come first
    offset = (token_in_block * KV_DIM + kv_head * HEAD_DIM + dim) * ITEMSIZE
    if is_value:
        offset += V_OFFSET
    return offset


def locate(block_table, slot, layer, position, BLOCK_SIZE):
    """02.locate: the token's logical block through the table, and its row in the block."""
    logical_block, row = divmod(position, BLOCK_SIZE)
    return int(block_table[slot, layer, logical_block]), row


class ArticleAllocator(AllocatorBase):
    """06.allocator: the article's block manager (main.cpp:266-272, 859-865, 1018-1029)."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        self.check_length(slot, new_len)
        needed = [(layer, logical) for layer in range(c.num_layers)
                  for logical in range(c.blocks_for_tokens(new_len))
                  if self.table.entries[slot, layer, logical] == -1]   # rules 1 and 2
        if len(needed) > len(self.free_blocks):
            raise CacheFullError(f"slot {slot} needs {len(needed)} blocks, "
                                 f"{len(self.free_blocks)} free")
        for layer, logical in needed:
            self.table.assign(slot, layer, logical, self.free_blocks.pop())

    def release(self, slot):
        pushed = []
        for layer in range(self.config.num_layers):
            for logical in range(self.config.MAX_BLOCKS_PER_SEQ):
                if self.table.entries[slot, layer, logical] != -1:
                    block = self.table.unassign(slot, layer, logical)
                    self.free_blocks.append(block)
                    pushed.append(block)
        return pushed


def sync_table(host_table, device_table, changed):
    """06.table_sync: send only the entries that changed since the last sync."""
    for i in changed:
        device_table[i] = host_table[i]


def block_table_index(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
    """02.table_index: the row length rounded up, then the article's three terms
    (kernels.cu:16-19, 480)."""
    blocks_per_row = -(-MAX_SEQ_LEN // BLOCK_SIZE)
    return slot * N_LAYERS * blocks_per_row + layer * blocks_per_row + logical_block


def k_index(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM, HEAD_DIM):
    """03.k_index: the query head's KV head, then the article's four terms (kernels.cu:468,
    484, in elements)."""
    kv_head = q_head // Q_PER_KV
    return physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM + thread_id


def walk_blocks(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id, owns_dim,
                q_val, scale, dot_products, score):
    """03.walk_blocks: the kernel's loop over logical blocks with every step written out
    (kernels.cu:470-485: the block count, the table index, the fill of the last block, the K
    and V addresses); the score and the online softmax are the parts of notebooks 04 and 05.
    The kernel's build binds its constants, ``load`` and those two parts."""
    current_max = float32(-math.inf)  # noqa: F821 - bound by the kernel's build
    d = float32(0.0)  # noqa: F821
    acc = float32(0.0)  # noqa: F821
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        physical_block = block_table[slot * N_LAYERS * MAX_BLOCKS_PER_SEQ
                                     + layer * MAX_BLOCKS_PER_SEQ + logical_block]
        for token in range(min(seq_len - logical_block * BLOCK_SIZE, BLOCK_SIZE)):
            k_elem = (physical_block * BLOCK_ELEMS + token * KV_DIM  # noqa: F821
                      + kv_head * HEAD_DIM + thread_id)  # noqa: F821
            k = float32(0.0)  # noqa: F821
            if owns_dim:
                k = load(kv_cache, k_elem)  # noqa: F821
            s = token_score(q_val, k, thread_id, scale, dot_products, score)  # noqa: F821
            v = float32(0.0)  # noqa: F821
            if owns_dim:
                v = load(kv_cache, k_elem + V_OFFSET_ELEMS)  # noqa: F821
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)  # noqa: F821
    return current_max, d, acc


PUZZLE_SOLUTIONS = {
    "02.table_index": block_table_index,
    "03.k_index": k_index,
    "03.walk_blocks": walk_blocks,
    "02.locate": locate,
    "01.kv_offset": kv_byte_offset,
    "06.allocator": ArticleAllocator,
    "06.table_sync": sync_table,
}

_KERNEL = "paged_tutorial.backends.numba_cuda.kernels.attention"
#: puzzles whose answer is the package's own code: (module, function)
PACKAGE_CODE = {
    "04.token_score": (_KERNEL, "token_score"),
    "05.softmax_update": (_KERNEL, "softmax_update"),
    "05.write_output": (_KERNEL, "write_output"),
    "09.can_share": ("paged_tutorial.cache.prefix_cache", "may_share"),
}


def solved() -> list[str]:
    """Every name that has a worked solution, sorted."""
    return sorted({**EXERCISE_SOLUTIONS, **PUZZLE_SOLUTIONS, **PACKAGE_CODE})


def solution_of(name: str):
    """The worked solution itself: a value for an exercise, the function or class for a
    puzzle (what tests and ``check`` take)."""
    get(name)                                    # a KeyError naming the known ones, if unknown
    if name in PACKAGE_CODE:
        module, function = PACKAGE_CODE[name]
        return getattr(importlib.import_module(module), function)
    if name in EXERCISE_SOLUTIONS:
        return EXERCISE_SOLUTIONS[name]
    return PUZZLE_SOLUTIONS[name]


def reveal(name: str):
    """The worked solution of ``name``: an exercise's value as it is; a puzzle's function or
    class as a ``Solution``, which shows its source code (highlighted in a notebook) and is
    passed to ``check`` or called like the code itself."""
    code = solution_of(name)
    if name in EXERCISE_SOLUTIONS:
        return code
    return Solution(name, code)
