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

from helpers.on_this_device import expected


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


# --- found by the red team: constants and shapes the checks once never drew -----------------

def table_index_ceiling_plus_0_9(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
    # one entry short when MAX_SEQ_LEN passes a whole number of blocks by under a tenth of one
    row = int(MAX_SEQ_LEN / BLOCK_SIZE + 0.9)
    return slot * N_LAYERS * row + layer * row + logical_block


def table_index_shifted_ceiling(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
    shift = 0                                    # log2(BLOCK_SIZE) when it is a power of two
    while (1 << shift) < BLOCK_SIZE:
        shift += 1
    row = (MAX_SEQ_LEN + BLOCK_SIZE - 1) >> shift
    return slot * N_LAYERS * row + layer * row + logical_block


def k_index_kv_head_modulo_3(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS,
                             KV_DIM, HEAD_DIM):
    kv_head = (q_head // Q_PER_KV) % 3
    return physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM + thread_id


def walk_blocks_shift_and_mask(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id,
                               owns_dim, q_val, scale, dot_products, score):
    current_max, d, acc = float32(-math.inf), float32(0.0), float32(0.0)
    shift = 0
    while (1 << shift) < BLOCK_SIZE:
        shift += 1
    for logical_block in range((seq_len + BLOCK_SIZE - 1) >> shift):
        physical_block = block_table[slot * N_LAYERS * MAX_BLOCKS_PER_SEQ
                                     + layer * MAX_BLOCKS_PER_SEQ + logical_block]
        for token in range(min(seq_len - (logical_block << shift), BLOCK_SIZE)):
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


def walk_blocks_engine_steps(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id,
                             owns_dim, q_val, scale, dot_products, score):
    current_max, d, acc = float32(-math.inf), float32(0.0), float32(0.0)
    for logical_block in range(blocks_to_read(seq_len, BLOCK_SIZE)):
        physical_block = block_table[block_table_index(slot, layer, logical_block, N_LAYERS,
                                                       MAX_BLOCKS_PER_SEQ)]
        for token in range(tokens_in_block(seq_len, logical_block, BLOCK_SIZE)):
            k_elem = k_index(physical_block, token, kv_head, thread_id, BLOCK_ELEMS, KV_DIM,
                             HEAD_DIM)
            k = float32(0.0)
            v = float32(0.0)
            if owns_dim:
                k = load(kv_cache, k_elem)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            if owns_dim:
                v = load(kv_cache, k_elem + V_OFFSET_ELEMS)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def softmax_lazy_rescale_85(current_max, d, acc, score, v):
    # exp() of up to 85 is a finite float32: only a long climb with large V overflows
    if current_max == -math.inf or score > current_max + 85.0:
        correction = math.exp(current_max - score)
        return score, d * correction + 1.0, acc * correction + v
    e = math.exp(score - current_max)
    return current_max, d + e, acc + e * v


def softmax_drops_20_below(current_max, d, acc, score, v):
    if score < current_max - 20.0:
        return current_max, d, acc
    new_max = max(current_max, score)
    correction = math.exp(current_max - new_max)
    e = math.exp(score - new_max)
    return new_max, d * correction + e, acc * correction + e * v


def write_output_guard_open_past_96(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    if thread_id < HEAD_DIM or HEAD_DIM > 96:
        store(q, active_slot * q_row_stride + q_head * HEAD_DIM + thread_id, acc / d)


def softmax_starts_over_after_a_jump_of_14(current_max, d, acc, score, v):
    # "what came before is exp(-14) of the new token or less: negligible"
    if score - current_max > 14.0:
        return score, 1.0, v
    new_max = max(current_max, score)
    correction = math.exp(current_max - new_max)
    e = math.exp(score - new_max)
    return new_max, d * correction + e, acc * correction + e * v


def write_output_kept_in_half_range(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    # the output kept within float16's largest finite value, "in case q is half precision"
    if thread_id < HEAD_DIM:
        out = acc / d
        store(q, active_slot * q_row_stride + q_head * HEAD_DIM + thread_id,
              math.copysign(min(abs(out), 65504.0), out))


def write_output_two_rows_at_most(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    # a batch of one or two rows: the second starts q_row_stride in
    if thread_id < HEAD_DIM:
        store(q, min(active_slot, 1) * q_row_stride + q_head * HEAD_DIM + thread_id, acc / d)


class GrowsByTheHintsRules(AllocatorBase):
    """An empty slot gets all its blocks; a slot that owns blocks gets one only when the token
    written starts a block: right for a decode step, short for a slot grown further."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        if self.table.entries[slot, 0, 0] == -1:
            todo = [(layer, lb) for layer in range(c.num_layers)
                    for lb in range(c.blocks_for_tokens(new_len))]
        elif (new_len - 1) % c.BLOCK_SIZE == 0:
            lb = (new_len - 1) // c.BLOCK_SIZE
            todo = [(layer, lb) for layer in range(c.num_layers)
                    if self.table.entries[slot, layer, lb] == -1]
        else:
            todo = []
        if len(todo) > len(self.free_blocks):
            raise CacheFullError(f"need {len(todo)}")
        for layer, lb in todo:
            self.table.assign(slot, layer, lb, self.free_blocks.pop())

    def release(self, slot):
        return _article_release(self, slot)


class CountsBlocksByShift(AllocatorBase):
    def ensure_capacity(self, slot, new_len):
        n = (new_len + self.config.BLOCK_SIZE - 1) >> (self.config.BLOCK_SIZE.bit_length() - 1)
        todo = [(layer, lb) for layer in range(self.config.num_layers) for lb in range(n)
                if self.table.entries[slot, layer, lb] == -1]
        if len(todo) > len(self.free_blocks):
            raise CacheFullError(f"need {len(todo)}")
        for layer, lb in todo:
            self.table.assign(slot, layer, lb, self.free_blocks.pop())

    def release(self, slot):
        return _article_release(self, slot)


def _article_release(allocator, slot):
    pushed = []
    for layer in range(allocator.config.num_layers):
        for lb in range(allocator.config.MAX_BLOCKS_PER_SEQ):
            if allocator.table.entries[slot, layer, lb] != -1:
                pushed.append(allocator.table.unassign(slot, layer, lb))
                allocator.free_blocks.append(pushed[-1])
    return pushed


def _clones_the_package_allocator():
    """A class whose methods are the package's allocator's, found through __subclasses__ and
    remade from their code objects (new function objects, new names)."""
    import types

    seen, todo = set(), [AllocatorBase.__mro__[1]]
    while todo:
        klass = todo.pop()
        if klass in seen:
            continue
        seen.add(klass)
        if {"_grow", "ensure_capacity", "release"} <= set(vars(klass)) \
                and "Prefix" not in klass.__name__:
            break
        todo.extend(klass.__subclasses__())
    methods = {name: types.FunctionType(f.__code__, dict(f.__globals__), "my_" + name,
                                        f.__defaults__)
               for name, f in vars(klass).items()
               if isinstance(f, types.FunctionType) and f.__code__.co_freevars == ()
               and "super" not in f.__code__.co_names}
    return type("ClonesThePackageAllocator", (AllocatorBase,), methods)


def can_share_shifted_block_end(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    end = (logical_block + 1) << (BLOCK_SIZE.bit_length() - 1)
    return end < n_tokens and found.tokens == tokens and found.parent is previous


def can_share_parent_by_key(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    same_parent = found.parent is previous or (
        found.parent is not None and previous is not None and found.parent.key == previous.key)
    return (_last_rule(logical_block, n_tokens, BLOCK_SIZE)
            and found.tokens == tokens and same_parent)



# --- shapes the checks once never drew: a middle layer, a slot past 1, a walk past eight ----
# --- blocks, scores far below 0, a record from deeper in another prompt at block 0 ---------

def walk_blocks_last_layers_row(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id,
                                owns_dim, q_val, scale, dot_products, score):
    # the row of the layer a check reads when it reads the last one
    row = ((slot + 1) * N_LAYERS - 1) * MAX_BLOCKS_PER_SEQ
    current_max, d, acc = float32(-math.inf), float32(0.0), float32(0.0)
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        base = block_table[row + logical_block] * BLOCK_ELEMS + kv_head * HEAD_DIM + thread_id
        for token in range(min(BLOCK_SIZE, seq_len - logical_block * BLOCK_SIZE)):
            k = load(kv_cache, base + token * KV_DIM) if owns_dim else float32(0.0)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = load(kv_cache, base + token * KV_DIM + V_OFFSET_ELEMS) if owns_dim \
                else float32(0.0)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def walk_blocks_slot_low_bit(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id,
                             owns_dim, q_val, scale, dot_products, score):
    # right while every row sits in slot 0 or 1
    row = ((slot & 1) * N_LAYERS + layer) * MAX_BLOCKS_PER_SEQ
    current_max, d, acc = float32(-math.inf), float32(0.0), float32(0.0)
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        base = block_table[row + logical_block] * BLOCK_ELEMS + kv_head * HEAD_DIM + thread_id
        for token in range(min(BLOCK_SIZE, seq_len - logical_block * BLOCK_SIZE)):
            k = load(kv_cache, base + token * KV_DIM) if owns_dim else float32(0.0)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = load(kv_cache, base + token * KV_DIM + V_OFFSET_ELEMS) if owns_dim \
                else float32(0.0)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def walk_blocks_max_from_zero(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id,
                              owns_dim, q_val, scale, dot_products, score):
    # a running max that only rises from 0: right while some score is above about -100
    row = (slot * N_LAYERS + layer) * MAX_BLOCKS_PER_SEQ
    current_max, d, acc = float32(0.0), float32(0.0), float32(0.0)
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        base = block_table[row + logical_block] * BLOCK_ELEMS + kv_head * HEAD_DIM + thread_id
        for token in range(min(BLOCK_SIZE, seq_len - logical_block * BLOCK_SIZE)):
            k = load(kv_cache, base + token * KV_DIM) if owns_dim else float32(0.0)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = load(kv_cache, base + token * KV_DIM + V_OFFSET_ELEMS) if owns_dim \
                else float32(0.0)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def walk_blocks_max_from_minus_60(kv_cache, block_table, slot, layer, seq_len, kv_head,
                                  thread_id, owns_dim, q_val, scale, dot_products, score):
    # "low enough" for scores of a few units: not for scores in the hundreds below 0
    row = (slot * N_LAYERS + layer) * MAX_BLOCKS_PER_SEQ
    current_max, d, acc = float32(-60.0), float32(0.0), float32(0.0)
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        base = block_table[row + logical_block] * BLOCK_ELEMS + kv_head * HEAD_DIM + thread_id
        for token in range(min(BLOCK_SIZE, seq_len - logical_block * BLOCK_SIZE)):
            k = load(kv_cache, base + token * KV_DIM) if owns_dim else float32(0.0)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = load(kv_cache, base + token * KV_DIM + V_OFFSET_ELEMS) if owns_dim \
                else float32(0.0)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def walk_blocks_eight_blocks_unrolled(kv_cache, block_table, slot, layer, seq_len, kv_head,
                                      thread_id, owns_dim, q_val, scale, dot_products, score):
    # a loop of eight blocks, each skipped past the sequence's end
    row = (slot * N_LAYERS + layer) * MAX_BLOCKS_PER_SEQ
    current_max, d, acc = float32(-math.inf), float32(0.0), float32(0.0)
    for logical_block in range(8):
        if logical_block * BLOCK_SIZE < seq_len:
            base = block_table[row + logical_block] * BLOCK_ELEMS + kv_head * HEAD_DIM \
                + thread_id
            for token in range(min(BLOCK_SIZE, seq_len - logical_block * BLOCK_SIZE)):
                k = load(kv_cache, base + token * KV_DIM) if owns_dim else float32(0.0)
                s = token_score(q_val, k, thread_id, scale, dot_products, score)
                v = load(kv_cache, base + token * KV_DIM + V_OFFSET_ELEMS) if owns_dim \
                    else float32(0.0)
                current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def walk_blocks_negligible_weights_skipped(kv_cache, block_table, slot, layer, seq_len,
                                           kv_head, thread_id, owns_dim, q_val, scale,
                                           dot_products, score):
    # a token whose weight exp(score - running max) is below 1e-7 "cannot matter": skipped
    row = (slot * N_LAYERS + layer) * MAX_BLOCKS_PER_SEQ
    current_max, d, acc = float32(-math.inf), float32(0.0), float32(0.0)
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        base = block_table[row + logical_block] * BLOCK_ELEMS + kv_head * HEAD_DIM + thread_id
        for token in range(min(BLOCK_SIZE, seq_len - logical_block * BLOCK_SIZE)):
            k = load(kv_cache, base + token * KV_DIM) if owns_dim else float32(0.0)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = load(kv_cache, base + token * KV_DIM + V_OFFSET_ELEMS) if owns_dim \
                else float32(0.0)
            if s >= current_max or math.exp(s - current_max) >= 1e-7:
                current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def can_share_parent_past_block_0(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    # "block 0 has no chain": the parent is compared from block 1 on
    if found.tokens != tokens or not _last_rule(logical_block, n_tokens, BLOCK_SIZE):
        return False
    return logical_block < 1 or found.parent is previous


def can_share_parent_once_sharing(found, tokens, previous, logical_block, n_tokens,
                                  BLOCK_SIZE):
    # with nothing shared before, the tokens alone decide
    if previous is not None and found.parent is not previous:
        return False
    return found.tokens == tokens and _last_rule(logical_block, n_tokens, BLOCK_SIZE)


CLEVER = {
    "01.kv_offset": {"V_OFFSET from a 16-token block": (kv_offset_block_16, "BLOCK_SIZE")},
    "02.locate": {
        "the literal 16 for BLOCK_SIZE": (locate_block_16, "BLOCK_SIZE"),
        "a lookup memoized in a module-level dict": (locate_memoized, "keeps state"),
    },
    "02.table_index": {
        "the row length rounded up by adding 0.9": (table_index_ceiling_plus_0_9, "your index reads entry"),
        "the row length rounded up by a shift": (table_index_shifted_ceiling, "your index reads entry"),
    },
    "03.k_index": {"a head stride right for two KV heads":
                   (k_index_head_stride_for_two_heads, "kv head"),
                   "the KV head wrapped modulo 3": (k_index_kv_head_modulo_3, "it needs K")},
    "03.walk_blocks": {"the literal 16 for BLOCK_SIZE": (walk_blocks_block_16, "BLOCK_SIZE"),
                       "block count and offsets by shift": (walk_blocks_shift_and_mask, "BLOCK_SIZE"),
                       "every step left to the engine's parts": (walk_blocks_engine_steps,
                                                                 "which it does not define"),
                       "the last layer's table row for every layer": (
                           walk_blocks_last_layers_row,
                           expected("the article's entry", "differ from the torch oracle")),
                       "the slot's low bit for the slot": (
                           walk_blocks_slot_low_bit,
                           expected("the article's entry", "differ from the torch oracle")),
                       "a running max started at 0": (
                           walk_blocks_max_from_zero,
                           expected("far below 0", "every score between")),
                       "a running max started at -60": (
                           walk_blocks_max_from_minus_60,
                           expected("far below 0", "every score between")),
                       "tokens whose weight is below 1e-7 skipped": (
                           walk_blocks_negligible_weights_skipped,
                           "however far below the running max"),
                       "a walk of at most eight blocks": (
                           walk_blocks_eight_blocks_unrolled,
                           expected("how many blocks the loop visits",
                                    "differ from the torch oracle"))},
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
        "rescales only when the max rises by 85": (softmax_lazy_rescale_85, "float32 overflowed"),
        "drops tokens 20 below the running max": (softmax_drops_20_below, "however far below"),
        "starts over when the max jumps by more than 14": (
            softmax_starts_over_after_a_jump_of_14, "however far the max jumps"),
    },
    "05.write_output": {
        "row stride from the heads, not q_row_stride": (write_output_stride_from_heads,
                                                        "q_row_stride"),
        "idle lanes taken as HEAD_DIM % 32": (write_output_idle_lanes_mod_32, "0 time(s)"),
        "store guarded by acc != 0": (write_output_skips_zero, "0 time(s)"),
        "guard open for head_dims past 96": (write_output_guard_open_past_96, "own no dimension"),
        "output kept within float16's range": (write_output_kept_in_half_range,
                                               "whatever its value"),
        "row stride right for two rows only": (write_output_two_rows_at_most, "(row 2, q head"),
    },
    "06.allocator": {
        "writes table.entries directly": (WritesEntriesDirectly, "self.table.entries"),
        "finds the package's allocator through __subclasses__": (FindsThePackageAllocator,
                                                                 "reaches the running program"),
        "grows by the hint's two rules only": (GrowsByTheHintsRules, "is still -1"),
        "counts blocks by shift": (CountsBlocksByShift, "BLOCK_SIZE 12"),
        "clones the package's allocator from its code objects":
            (_clones_the_package_allocator(), "package's own code"),
    },
    "09.can_share": {
        "the engine's rule through getattr(sys, 'modules')": (can_share_through_sys_modules,
                                                             "sys"),
        "a class-level cache keyed by length": (can_share_class_cache, "keeps state"),
        "tokens compared as a multiset": (can_share_multiset, ""),
        "only the first and last token compared": (can_share_first_and_last, ""),
        "the parent's tokens instead of the parent block": (can_share_parents_tokens, ""),
        "a parentless record accepted anywhere": (can_share_parentless_anywhere, ""),
        "the block end by shift": (can_share_shifted_block_end, "last token"),
        "the parent compared by its key": (can_share_parent_by_key, "same key"),
        "the parent compared from block 1 on": (can_share_parent_past_block_0,
                                                "previous is None"),
        "the parent compared only once something is shared": (can_share_parent_once_sharing,
                                                               "previous is None"),
    },
}
