"""``viz.kernel_source``: the decode kernel shown piece by piece next to kernels.cu lines."""

from __future__ import annotations

import re

import pytest

from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.teaching.chapters.ch03_address_arithmetic.kernel_source import (
    departures, kernel_pieces, kernel_source)


def test_pieces_cover_the_kernel_in_order():
    pieces = kernel_pieces()
    firsts = [p.first for p in pieces]
    assert firsts == sorted(firsts) and firsts[0] == 461 and pieces[-1].lines == "kernels.cu:522"
    assert all(p.section for p in pieces)
    # every line of the kernel is in exactly one piece
    joined = "".join(p.code for p in pieces)
    assert "write_output(q, q_row_stride" in joined and "def paged_attention_kernel" in joined
    assert "def walk_blocks" in joined and "def token_score" in joined
    assert "cuda.shfl_down_sync(WARP_FULL_MASK, qk, 16)" in joined
    calls = {p.lines: [re.search(r"def (\w+)", s).group(1) for s in p.parts] for p in pieces}
    assert calls["kernels.cu:480"] == ["block_table_index"]
    assert calls["kernels.cu:484-485"] == ["k_index"]
    assert calls["kernels.cu:509-519"] == ["softmax_update"]
    assert calls["kernels.cu:503-508"] == ["combine_warps"]
    assert calls["kernels.cu:522"] == ["write_output"]


def test_selection_text_and_html():
    listing = kernel_source(481)
    assert [p.lines for p in listing.pieces] == ["kernels.cu:481"]
    text = str(listing)
    assert "kernels.cu:481" in text and "def tokens_in_block" in text
    html = listing._repr_html_()
    assert "kernels.cu:481" in html and "tokens_in_block" in html and "<" in html
    assert len(kernel_source("470-485").pieces) == 7
    assert "def k_index" not in str(kernel_source("484", with_parts=False))
    with pytest.raises(ValueError, match="pieces"):
        kernel_source(900)


def test_departures_list_is_the_module_data():
    d = departures()
    assert str(d).count("\n") == len(attention.DEPARTURES) - 1
    assert d._repr_html_().count("<li>") == len(attention.DEPARTURES)
    assert "race" in str(d) and "head_dim" in str(d)


def test_departures_of_some_lines():
    titles = [d.title for d in departures("486-508").items]
    assert any("head_dim" in t for t in titles) and any("race" in t for t in titles)
    assert any("scale" in t for t in titles)
    assert not any("storage dtypes" in t for t in titles)           # kernels.cu:461 only
    assert [d.title for d in departures(468).items] == ["any GQA ratio"]
    assert departures("900-901").items == ()


def test_a_fix_she_writes_in_a_puzzle_is_named_not_shown():
    """The race-free hand-off and the partial last warp are what 04.token_score asks of her:
    the page names the puzzle and keeps the port's fix (attention.py has it) off the page."""
    shown = str(departures()) + departures()._repr_html_()
    hidden = [d for d in attention.DEPARTURES if d.puzzle]
    assert hidden and all(d.fix for d in hidden)
    for d in hidden:
        assert d.fix not in shown and f"puzzle {d.puzzle}" in shown
    assert "score[0]" not in shown and "zero product" not in shown


ALL_PUZZLES = ("02.table_index", "03.k_index", "03.walk_blocks", "04.token_score",
               "05.softmax_update", "05.write_output")


def test_what_she_is_about_to_write_is_folded_until_solved():
    from paged_tutorial.teaching.answer_lines import found_in, puzzle_answer_lines

    answers = puzzle_answer_lines()
    for lines in ("461-469", "470-485", "486-508", "509-522"):
        for parts in (attention.ARTICLE_PARTS, attention.ARTICLE_LAYOUT_PARTS):
            text = str(kernel_source(lines, parts=parts, solved=()))
            for name in ALL_PUZZLES:
                assert not found_in(text, answers[name]), (lines, name)
    who = str(kernel_source("461-469", solved=()))
    assert "q_head // q_per_kv" not in who and "q_row_stride + q_head" not in who
    assert "folded until you solve 03.k_index" in who and "05.write_output" in who
    shuffle = str(kernel_source("486-493", with_parts=False,
                                parts=attention.ARTICLE_LAYOUT_PARTS, solved=()))
    assert "shfl_down_sync" not in shuffle and "04.token_score" in shuffle
    assert '"""' not in shuffle                           # the docstring is not shown either
    address = str(kernel_source(484, solved=()))
    assert "def k_index(" in address and "BLOCK_ELEMS +" not in address


def test_a_solved_part_is_shown_whole():
    text = str(kernel_source("461-522", solved=ALL_PUZZLES))
    assert "kv_head = q_head // q_per_kv" in text
    assert "cuda.shfl_down_sync(WARP_FULL_MASK, qk, 16)" in text
    assert "folded" not in text


def test_solved_is_read_from_her_progress_record():
    from paged_tutorial.teaching.exercises.progress import record
    from paged_tutorial.teaching.verdict import Verdict

    assert "q_head // q_per_kv" not in str(kernel_source("461-469"))
    record("03.k_index", Verdict("correct", "right"))
    assert "q_head // q_per_kv" in str(kernel_source("461-469"))
