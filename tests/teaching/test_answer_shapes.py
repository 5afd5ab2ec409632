"""answer_shapes finds the giveaways a reader of the notebooks found, written with other names and
constants than the worked solutions', and lets through what a page must be able to say."""

from __future__ import annotations

import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.answer_shapes import formulas_in, gives_away, shapes_in, shapes_of


def _solution(name):
    return shapes_of(ex.reveal(name).source)


GIVEAWAYS = [
    # the byte offset, in prose with middle dots
    ("01.kv_offset", False, "Bit-for-bit equal: the formula `physical·BLOCK_BYTES + token·KV_DIM·itemsize + "
                            "head·head_dim·itemsize (+ V_OFFSET)` finds exactly what the model wrote"),
    # the same, printed with the numbers of one token
    ("01.kv_offset", False, "K bytes start at 24832 = 3*8192 + 5*192*4 + 1*64*4"),
    # the table index and the element address inside a notebook's code
    ("02.table_index", True, "physical = flat_table[slot * n_layers * M + layer * M + pos // c.BLOCK_SIZE].long()"),
    ("03.k_index", True, "start = physical * c.BLOCK_ELEMS + (pos % c.BLOCK_SIZE) * c.KV_DIM"),
    # the lookup's halves, in prose
    ("02.locate", False, "1. logical block = position // `BLOCK_SIZE`, token in block = position % `BLOCK_SIZE`;"),
    # the KV head with the ratio written out
    ("03.k_index", False, "ratio: 8 query heads share 2 KV heads, so `kv_head = q_head // 4` as in the article."),
    # the release order as a NumPy call
    ("06.allocator", False, "In NumPy's C order that walk is exactly `block_table[slot].ravel()`, so"),
    ("06.allocator", True, "walk = [int(b) for b in prev.block_table[slot].reshape(-1) if b >= 0]"),
]


@pytest.mark.parametrize("puzzle, is_code, text", GIVEAWAYS)
def test_a_giveaway_in_other_names_is_found(puzzle, is_code, text):
    assert gives_away(shapes_in(text, is_code), _solution(puzzle)), text


SAYABLE = [
    # the block's start, the article's overflow question (not a puzzle's line)
    "The kernel finds a block's bytes with `(char *)kv_cache + physical_block * BLOCK_BYTES + ...`",
    # one constant from the article
    "V_OFFSET = BLOCK_SIZE x KV_DIM x 2 B = 16 x 512 x 2 = 16384 B",
    # a worked example with other quantities, one product at a time
    "A row is 2 × 3 × 2 = 12 bytes, so token 1's K row starts at byte 12; the 4 K rows take 48 bytes",
    # the public API
    "byte offset = `cache.k_byte_offset(physical, token_in_block, kv_head)`",
    "assert logical * c.BLOCK_SIZE + token_in_block == position",
]


@pytest.mark.parametrize("text", SAYABLE)
def test_what_a_page_may_say_is_not_a_giveaway(text):
    for name in ("01.kv_offset", "02.locate", "02.table_index", "03.k_index", "06.allocator"):
        assert not gives_away(shapes_in(text, is_code="assert" in text), _solution(name)), (name, text)


def test_a_hint_that_lists_a_rule_holds_a_formula_and_a_question_does_not():
    assert formulas_in("Rule 2 (decode): a new block only when p % BLOCK_SIZE == 0.")
    assert not formulas_in("Which entries must name a block, and which already do?  K/V depend on "
                           "every earlier token; a -1 entry names no block.")
