"""Wrong versions of the kernel's body parts (puzzles 03.walk_blocks, 04.token_score,
05.write_output), written as a reader would write them in a notebook: device code naming the
helpers the kernel factory binds (cuda, float32, load, store, BLOCK_SIZE, token_score, ...),
hence no imports.  ``WRONG_BODIES[puzzle][what] = (function, text its verdict must contain)``.
"""

# flake8: noqa: F821  (the names are bound by attention.compile_parts)

from __future__ import annotations

import math


def _tree(qk, offsets):
    for off in offsets:
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    return qk


def skips_offset_4(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 16)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 8)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 2)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 1)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total * scale
    cuda.syncthreads()
    return score[0]


def no_barrier_after_publish(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total * scale
    cuda.syncthreads()
    return score[0]


def barrier_in_branch(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
        cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total * scale
    cuda.syncthreads()
    return score[0]


def two_warps_always(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        score[0] = (dot_products[0] + dot_products[1]) * scale
    cuda.syncthreads()
    return score[0]


def article_hand_off(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        dot_products[0] = total * scale
    cuda.syncthreads()
    return dot_products[0]


def at_most_two_warps(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = dot_products[0]
        if NUM_WARPS > 1:
            total += dot_products[1]
        score[0] = total * scale
    cuda.syncthreads()
    return score[0]


def no_scale(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total
    cuda.syncthreads()
    return score[0]


def _walk(block_count, table_index, token_count, v_reads=1, guard=True):
    def walk_blocks(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id, owns_dim,
                    q_val, scale, dot_products, score):
        current_max = float32(-math.inf)
        d = float32(0.0)
        acc = float32(0.0)
        for logical_block in range(block_count(seq_len, BLOCK_SIZE)):
            physical_block = block_table[table_index(slot, layer, logical_block, N_LAYERS,
                                                     MAX_BLOCKS_PER_SEQ)]
            for token in range(token_count(seq_len, logical_block, BLOCK_SIZE)):
                k_elem = (physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM
                          + thread_id)
                k = float32(0.0)
                if owns_dim or not guard:
                    k = load(kv_cache, k_elem)
                s = token_score(q_val, k, thread_id, scale, dot_products, score)
                v = float32(0.0)
                if owns_dim or not guard:
                    for _ in range(v_reads):
                        v = load(kv_cache, k_elem + V_OFFSET_ELEMS)
                current_max, d, acc = softmax_update(current_max, d, acc, s, v)
        return current_max, d, acc
    return walk_blocks


def _ceil(n, BS):
    return (n + BS - 1) // BS


def _article_index(s, l, lb, L, M):
    return s * L * M + l * M + lb


def _fill(n, lb, BS):
    return min(n - lb * BS, BS)


def _store(index, guard=True, divide=True):
    def write_output(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
        if thread_id < HEAD_DIM or not guard:
            store(q, index(q_row_stride, active_slot, q_head, thread_id, HEAD_DIM),
                  acc / d if divide else acc)
    return write_output


def _store_below_40(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    if thread_id < 40:
        store(q, active_slot * q_row_stride + q_head * HEAD_DIM + thread_id, acc / d)


def _in_place(stride, row, head, t, D):
    return row * stride + head * D + t


WRONG_BODIES = {
    "03.walk_blocks": {
        "off-by-one block count (seq_len // BLOCK_SIZE + 1)":
            (_walk(lambda n, BS: n // BS + 1, _article_index, _fill), "block-table entries"),
        "floor division: the partly filled block is skipped":
            (_walk(lambda n, BS: n // BS, _article_index, _fill), "block-table entries"),
        "wrong table index (slot and layer strides swapped)":
            (_walk(_ceil, lambda s, l, lb, L, M: s * M + l * L + lb, _fill), "logical block 0"),
        "the batch row's slot ignored (slot 0 always)":
            (_walk(_ceil, lambda s, l, lb, L, M: l * M + lb, _fill), "block_table["),
        "every block read as full": (_walk(_ceil, _article_index, lambda n, lb, BS: BS),
                                     "not its element of any token"),
        "V read twice": (_walk(_ceil, _article_index, _fill, v_reads=2), "2 times, not once"),
        "owns_dim ignored: threads past head_dim read too":
            (_walk(_ceil, _article_index, _fill, guard=False), "own no dimension"),
        "the table layout hard-coded (N_LAYERS 2, MAX_BLOCKS_PER_SEQ 3)":
            (_walk(_ceil, lambda s, l, lb, L, M: s * 2 * 3 + l * 3 + lb, _fill), "seed"),
    },
    "04.token_score": {
        "a shuffle offset sequence that skips 4": (skips_offset_4, "lanes 4-7, 12-15"),
        "no barrier between the publish and the combine": (no_barrier_after_publish, "race on"),
        "a barrier inside a divergent branch": (barrier_in_branch, "barrier round 1"),
        "dot_products[1] read with one warp (head_dim 32)":
            (two_warps_always, "dot_products[1] read by thread 0"),
        "the article's hand-off through dot_products[0]":
            (article_hand_off, "race on dot_products[0]"),
        "the scale never applied": (no_scale, "scale"),
        "a combine of at most two warps (the article's)": (at_most_two_warps, "3 warp(s)"),
    },
    "05.write_output": {
        "threads past HEAD_DIM write too": (_store(_in_place, guard=False), "own no dimension"),
        "row and head swapped": (_store(lambda st, r, h, t, D: h * st + r * D + t),
                                 "not the element it read its q from"),
        "acc not divided by d": (_store(_in_place, divide=False), "acc / d"),
        "head_dim hard-coded to 40":
            (_store(lambda st, r, h, t, D: r * st + h * 40 + t, guard=True), "seed"),
        "guard hard-coded to 40 threads": (_store_below_40, "seed"),
    },
}
