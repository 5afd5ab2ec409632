"""Clever wrong answers, one or more per family of wrong answer that once passed a check:
written against the puzzles' signatures as a reader would (kernel parts name the helpers the
kernel factory binds, hence no imports), each with the text its verdict must contain.
``CLEVER[puzzle][what] = (answer, text)``."""

# flake8: noqa: F821  (kernel parts' names are bound by attention.compile_parts)

from __future__ import annotations

import math

import numpy as np

from paged_tutorial.cache import CacheFullError
from paged_tutorial.teaching.chapters.ch06_block_lifetime.allocator import AllocatorBase


# --- a named constant replaced by today's value ---------------------------------------------

def kv_offset_block_16(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                       ITEMSIZE):
    offset = (token_in_block * KV_DIM + kv_head * HEAD_DIM + dim) * ITEMSIZE
    return offset + (16 * KV_DIM * ITEMSIZE if is_value else 0)


def locate_block_16(block_table, slot, layer, position, BLOCK_SIZE):
    return int(block_table[slot, layer, position // 16]), position % 16


def k_index_head_stride_for_two_heads(physical_block, token, q_head, thread_id, Q_PER_KV,
                                      BLOCK_ELEMS, KV_DIM, HEAD_DIM):
    # KV_DIM - HEAD_DIM is HEAD_DIM when there are two KV heads
    return (physical_block * BLOCK_ELEMS + token * KV_DIM
            + (q_head // Q_PER_KV) * (KV_DIM - HEAD_DIM) + thread_id)


def walk_blocks_block_16(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id,
                         owns_dim, q_val, scale, dot_products, score):
    current_max, d, acc = float32(-math.inf), float32(0.0), float32(0.0)
    for logical_block in range((seq_len + 15) // 16):
        physical_block = block_table[slot * N_LAYERS * MAX_BLOCKS_PER_SEQ
                                     + layer * MAX_BLOCKS_PER_SEQ + logical_block]
        for token in range(min(seq_len - logical_block * 16, 16)):
            k_elem = physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM \
                + thread_id
            k = float32(0.0)
            v = float32(0.0)
            if owns_dim:
                k = load(kv_cache, k_elem)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            if owns_dim:
                v = load(kv_cache, k_elem + V_OFFSET_ELEMS)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def token_score_own_scale(q_val, k, thread_id, scale, dot_products, score):
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
        score[0] = total / math.sqrt(HEAD_DIM)          # not the scale it is given
    cuda.syncthreads()
    return score[0]


def write_output_stride_from_heads(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    if thread_id < HEAD_DIM:
        store(q, active_slot * cuda.gridDim.y * HEAD_DIM + q_head * HEAD_DIM + thread_id,
              acc / d)


# --- state kept across calls ----------------------------------------------------------------

_LOCATED: dict = {}


def locate_memoized(block_table, slot, layer, position, BLOCK_SIZE):
    key = (slot, layer, position)
    if key not in _LOCATED:
        _LOCATED[key] = (int(block_table[slot, layer, position // BLOCK_SIZE]),
                         position % BLOCK_SIZE)
    return _LOCATED[key]


class _ShareCache:
    by_length: dict = {}


def can_share_class_cache(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    key = (len(tokens), logical_block)
    if key not in _ShareCache.by_length:
        _ShareCache.by_length[key] = ((logical_block + 1) * BLOCK_SIZE < n_tokens
                                      and found.tokens == tokens
                                      and found.parent is previous)
    return _ShareCache.by_length[key]


_SCORE = np.zeros(1, dtype=np.float32)


def token_score_module_array(q_val, k, thread_id, scale, dot_products, score):
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
        _SCORE[0] = total * scale
    cuda.syncthreads()
    return _SCORE[0]


def token_score_float_warp_index(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id / WARP_SIZE] = qk         # a float index: no GPU compiles it
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total * scale
    cuda.syncthreads()
    return score[0]


# --- reductions and guards hard-coded to what is drawn --------------------------------------

def token_score_three_warps(q_val, k, thread_id, scale, dot_products, score):
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
        if NUM_WARPS > 2:
            total += dot_products[2]
        score[0] = total * scale
    cuda.syncthreads()
    return score[0]


def write_output_idle_lanes_mod_32(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    if thread_id < (NUM_WARPS - 1) * WARP_SIZE + HEAD_DIM % WARP_SIZE:
        store(q, active_slot * q_row_stride + q_head * HEAD_DIM + thread_id, acc / d)


def write_output_skips_zero(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    if thread_id < HEAD_DIM and acc != 0:
        store(q, active_slot * q_row_stride + q_head * HEAD_DIM + thread_id, acc / d)


# --- approximations that ride the tolerance -------------------------------------------------

def softmax_drops_far_below(current_max, d, acc, score, v):
    if score < current_max - 10.0:
        return current_max, d, acc
    new_max = max(current_max, score)
    correction = math.exp(current_max - new_max)
    e = math.exp(score - new_max)
    return new_max, d * correction + e, acc * correction + e * v


def softmax_lazy_rescale(current_max, d, acc, score, v):
    if current_max == -math.inf or score > current_max + 100.0:
        new_max = score
        correction = math.exp(current_max - new_max)
        return new_max, d * correction + 1.0, acc * correction + v
    e = math.exp(score - current_max)
    return current_max, d + e, acc + e * v


# --- work behind the engine's back ----------------------------------------------------------

class WritesEntriesDirectly(AllocatorBase):
    def ensure_capacity(self, slot, new_len):
        c = self.config
        needed = [(layer, lb) for layer in range(c.num_layers)
                  for lb in range(c.blocks_for_tokens(new_len))
                  if self.table.entries[slot, layer, lb] == -1]
        if len(needed) > len(self.free_blocks):
            raise CacheFullError(f"slot {slot} needs {len(needed)} blocks")
        for layer, lb in needed:
            self.table.entries[slot, layer, lb] = self.free_blocks.pop()

    def release(self, slot):
        pushed = []
        for layer in range(self.config.num_layers):
            for lb in range(self.config.MAX_BLOCKS_PER_SEQ):
                if self.table.entries[slot, layer, lb] != -1:
                    pushed.append(self.table.unassign(slot, layer, lb))
                    self.free_blocks.append(pushed[-1])
        return pushed


class FindsThePackageAllocator(AllocatorBase):
    def ensure_capacity(self, slot, new_len):
        base = [k for k in AllocatorBase.__mro__[1].__subclasses__()
                if k.__name__ == "FreeListAllocator"][0]
        return base.ensure_capacity(self, slot, new_len)

    def release(self, slot):
        base = [k for k in AllocatorBase.__mro__[1].__subclasses__()
                if k.__name__ == "FreeListAllocator"][0]
        return base.release(self, slot)


def can_share_through_sys_modules(found, tokens, previous, logical_block, n_tokens,
                                  BLOCK_SIZE):
    import sys
    rule = getattr(getattr(sys, "modules")["paged_tutorial.cache.prefix_cache"], "may_share")
    return rule(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE)


# --- can_share shortcuts --------------------------------------------------------------------

def _last_rule(logical_block, n_tokens, BLOCK_SIZE):
    return (logical_block + 1) * BLOCK_SIZE < n_tokens


def can_share_multiset(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    return (_last_rule(logical_block, n_tokens, BLOCK_SIZE)
            and sorted(found.tokens) == sorted(tokens) and found.parent is previous)


def can_share_first_and_last(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    return (_last_rule(logical_block, n_tokens, BLOCK_SIZE)
            and found.tokens[0] == tokens[0] and found.tokens[-1] == tokens[-1]
            and found.parent is previous)


def can_share_parents_tokens(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    same_parent = (found.parent is None and previous is None) or (
        found.parent is not None and previous is not None
        and found.parent.tokens == previous.tokens)
    return (_last_rule(logical_block, n_tokens, BLOCK_SIZE)
            and found.tokens == tokens and same_parent)


def can_share_parentless_anywhere(found, tokens, previous, logical_block, n_tokens,
                                  BLOCK_SIZE):
    return (_last_rule(logical_block, n_tokens, BLOCK_SIZE)
            and found.tokens == tokens
            and (found.parent is None or found.parent is previous))


CLEVER = {
    "01.kv_offset": {"V_OFFSET from a 16-token block": (kv_offset_block_16, "BLOCK_SIZE")},
    "02.locate": {
        "the literal 16 for BLOCK_SIZE": (locate_block_16, "BLOCK_SIZE"),
        "a lookup memoized in a module-level dict": (locate_memoized, "keeps state"),
    },
    "03.k_index": {"a head stride right for two KV heads":
                   (k_index_head_stride_for_two_heads, "kv head")},
    "03.walk_blocks": {"the literal 16 for BLOCK_SIZE": (walk_blocks_block_16, "BLOCK_SIZE")},
    "04.token_score": {
        "1/sqrt(HEAD_DIM) where scale is passed": (token_score_own_scale, "scale"),
        "the score handed over in a module-level array": (token_score_module_array,
                                                          "keeps state"),
        "a combine of at most three warps": (token_score_three_warps, "warp"),
        "the warp's cell indexed by thread_id / WARP_SIZE (a float)":
            (token_score_float_warp_index, "float index"),
    },
    "05.softmax_update": {
        "drops tokens far below the running max": (softmax_drops_far_below, "below"),
        "rescales only when the max rises by 100": (softmax_lazy_rescale, "climbing"),
    },
    "05.write_output": {
        "row stride from the heads, not q_row_stride": (write_output_stride_from_heads,
                                                        "q_row_stride"),
        "idle lanes taken as HEAD_DIM % 32": (write_output_idle_lanes_mod_32, "0 time(s)"),
        "store guarded by acc != 0": (write_output_skips_zero, "0 time(s)"),
    },
    "06.allocator": {
        "writes table.entries directly": (WritesEntriesDirectly, "self.table.entries"),
        "finds the package's allocator through __subclasses__": (FindsThePackageAllocator,
                                                                 "reaches the running program"),
    },
    "09.can_share": {
        "the engine's rule through getattr(sys, 'modules')": (can_share_through_sys_modules,
                                                             "sys"),
        "a class-level cache keyed by length": (can_share_class_cache, "keeps state"),
        "tokens compared as a multiset": (can_share_multiset, ""),
        "only the first and last token compared": (can_share_first_and_last, ""),
        "the parent's tokens instead of the parent block": (can_share_parents_tokens, ""),
        "a parentless record accepted anywhere": (can_share_parentless_anywhere, ""),
    },
}
