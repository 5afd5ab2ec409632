"""Exercises of notebook 02 (the block table's three-term index).  Expected answers come from a
``PagedKVCache`` with the article's shapes (2 slots x 16 layers x 128 logical blocks)."""

from __future__ import annotations

import numpy as np

from .ch01 import as_int, compare_tuple, small_article_cache


def _flat_index(answer):
    cache = small_article_cache()
    slot, layer, logical = 1, 5, 3
    expected = cache.flat_index(slot, layer, logical)
    got = as_int(answer)
    if got is None:
        return False, "give one integer: an index into the 4096-entry table"
    if got == expected:
        m = cache.MAX_BLOCKS_PER_SEQ
        return True, (f"{expected} = {slot}*{cache.config.num_layers}*{m} + {layer}*{m} + "
                      f"{logical}")
    return False, "slot * N_LAYERS * MAX_BLOCKS_PER_SEQ + layer * MAX_BLOCKS_PER_SEQ + logical"


def _unravel(answer):
    cache = small_article_cache()
    flat = 3000
    expected = tuple(int(i) for i in np.unravel_index(flat, cache.block_table.shape))
    return compare_tuple(answer, expected, "slot, layer, logical",
                         "divide by N_LAYERS*MAX_BLOCKS_PER_SEQ for the slot, then by "
                         "MAX_BLOCKS_PER_SEQ for the layer; the rest is the logical block")


def _entries_used(answer):
    lengths = {0: 100, 1: 20}
    c = small_article_cache().config
    cache = small_article_cache(
        num_blocks=sum(c.blocks_for_tokens(n) for n in lengths.values()) * c.num_layers)
    for slot, n in lengths.items():
        cache.ensure_capacity(slot, n)
    expected = int((cache.block_table >= 0).sum())
    got = as_int(answer)
    if got is None:
        return False, "give one integer: how many entries are not -1"
    if got == expected:
        return True, f"{expected} entries hold a physical block; {cache.block_table.size - expected} are -1"
    if got == sum(c.blocks_for_tokens(n) for n in lengths.values()):
        return False, "every layer owns its own blocks: multiply by N_LAYERS"
    return False, (f"per slot: ceil(tokens / BLOCK_SIZE) logical blocks, in each of the "
                   f"{c.num_layers} layers")


CHECKS = {
    "02.flat_index": _flat_index,
    "02.unravel": _unravel,
    "02.entries_used": _entries_used,
}
