"""Exercises of notebook 02 (the block table's three-term index).  Right answers come from a
``PagedKVCache`` with the article's shapes (2 slots x 16 layers x 128 logical blocks)."""

from __future__ import annotations

import numpy as np

from paged_tutorial.teaching.exercises.answers import Integer, Numbers
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import small_article_cache

FLAT = dict(slot=1, layer=5, logical=3)
UNRAVEL_FLAT = 3000
LENGTHS = {0: 100, 1: 20}


def _flat_index():
    return small_article_cache().flat_index(FLAT["slot"], FLAT["layer"], FLAT["logical"])


def _swapped_flat_index():
    c = small_article_cache().config
    return FLAT["layer"] * c.max_slots * c.MAX_BLOCKS_PER_SEQ + FLAT["slot"] * \
        c.MAX_BLOCKS_PER_SEQ + FLAT["logical"]


def _entries_used():
    c = small_article_cache().config
    cache = small_article_cache(
        num_blocks=sum(c.blocks_for_tokens(n) for n in LENGTHS.values()) * c.num_layers)
    for slot, n in LENGTHS.items():
        cache.ensure_capacity(slot, n)
    return int((cache.block_table >= 0).sum())


EXERCISES = (
    Exercise(
        "02.flat_index",
        "Index into the article's flat block table (2 x 16 x 128 entries) of slot {slot}, "
        "layer {layer}, logical block {logical}.".format(**FLAT),
        Integer(), _flat_index,
        explain=lambda e: (f"{e} = {FLAT['slot']}*16*128 + {FLAT['layer']}*128 + "
                           f"{FLAT['logical']}"),
        hint="slot * N_LAYERS * MAX_BLOCKS_PER_SEQ + layer * MAX_BLOCKS_PER_SEQ + logical",
        mistakes=(
            Mistake(_swapped_flat_index,
                    "slot and layer swapped: the table is [slot][layer][logical block], so the "
                    "slot's stride is N_LAYERS * MAX_BLOCKS_PER_SEQ"),
        )),
    Exercise(
        "02.unravel",
        f"Which (slot, layer, logical block) does flat entry {UNRAVEL_FLAT} of the article's "
        "table belong to?",
        Numbers(Integer(), 3, ("slot", "layer", "logical")),
        lambda: tuple(int(i) for i in np.unravel_index(UNRAVEL_FLAT,
                                                       small_article_cache().block_table.shape)),
        explain=lambda e: f"(slot, layer, logical) = {e}",
        hint=("divide by N_LAYERS*MAX_BLOCKS_PER_SEQ for the slot, then the rest by "
              "MAX_BLOCKS_PER_SEQ for the layer; what remains is the logical block")),
    Exercise(
        "02.entries_used",
        "Table entries that hold a physical block when slot 0 caches {0} tokens and slot 1 "
        "caches {1} (article's table).".format(LENGTHS[0], LENGTHS[1]),
        Integer(), _entries_used,
        explain=lambda e: (f"{e} entries hold a physical block; "
                           f"{small_article_cache().config.block_table_entries - e} are -1"),
        hint="per slot: ceil(tokens / BLOCK_SIZE) logical blocks, in each of the 16 layers",
        mistakes=(
            Mistake(lambda: sum(small_article_cache().config.blocks_for_tokens(n)
                                for n in LENGTHS.values()),
                    "every layer owns its own blocks: multiply by N_LAYERS"),
            Mistake(lambda: sum(n // 16 for n in LENGTHS.values()) * 16,
                    "a partly filled last block is still a block: round the division up"),
        )),
)
