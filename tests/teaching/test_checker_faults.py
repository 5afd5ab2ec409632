"""The checker never blames the learner for its own fault: an exception raised in the checker's
code, with none of hers on the way, is reported as the checker's (with its traceback), while one
raised in her code stays a verdict on her answer."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.cache import paged_cache
from paged_tutorial.teaching.language import set_language
from paged_tutorial.teaching.chapters.ch06_block_lifetime import allocator
from paged_tutorial.teaching.harness import base, faults, mistakes
from paged_tutorial.teaching.chapters.ch01_block_layout import block_layout


def test_frames_are_told_apart_by_whose_code_they_run():
    assert faults.origin(base.__file__) == "checker"
    assert faults.origin(paged_cache.__file__) == "package"
    assert faults.origin(np.__file__) == "library"
    assert faults.origin(__file__) == "learner"
    cell = Path(tempfile.gettempdir()) / "ipykernel_1234" / "567.py"   # a notebook cell
    assert faults.origin(str(cell)) == "learner"
    assert faults.origin(mistakes.__file__) == "learner"        # a demonstrated answer


def _offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM, ITEMSIZE):
    return ((token_in_block * KV_DIM + kv_head * HEAD_DIM + dim) * ITEMSIZE
            + (BLOCK_SIZE * KV_DIM * ITEMSIZE if is_value else 0))


@pytest.mark.parametrize("language", ["en", "ko"])
def test_a_fault_in_the_checkers_code_is_reported_as_the_checkers(monkeypatch, language):
    # a right answer; the checker's own call of need_int breaks (as a name it never imported
    # would): TypeError raised in block_layout.py, with no frame of hers on the way
    monkeypatch.setattr(block_layout, "need_int", None)
    set_language(language)
    verdict = ex.grade("01.kv_offset", _offset)
    assert verdict.status == "unsolved", verdict.message
    assert ("checker itself failed" if language == "en" else "채점기 자신이 실패") \
        in verdict.message
    assert "block_layout.py" in verdict.message and "TypeError" in verdict.message
    assert "while your" not in verdict.message and "여러분의 kv_byte_offset 실행 중" \
        not in verdict.message


def test_an_exception_in_her_code_stays_hers():
    def kv_byte_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                       ITEMSIZE):
        return {}[token_in_block]
    verdict = ex.grade("01.kv_offset", kv_byte_offset)
    assert verdict.status == "wrong"
    assert "KeyError" in verdict.message and "checker" not in verdict.message


def test_her_frame_on_the_way_makes_it_hers_even_when_the_checker_raised():
    def calls_back(fn):
        return fn()

    def checker_code():
        raise RuntimeError("raised below her frame")
    try:
        calls_back(checker_code)
    except RuntimeError as exc:
        assert not faults.is_checker_fault(exc)


class _Step:
    def __init__(self, index, kind, table, free):
        self.index, self.kind, self.block_table, self.free_blocks = index, kind, table, free


@pytest.mark.parametrize("language", ["en", "ko"])
@pytest.mark.parametrize("what", ["table", "free", "tokens", "length"])
def test_the_allocators_difference_is_described_in_both_languages(language, what):
    set_language(language)
    mine_table = np.full((2, 2, 3), -1)
    stock_table = mine_table.copy()
    stock_table[1, 0, 2] = 5
    mine = [_Step(4, "decode", mine_table, [1, 2, 3])]
    stock = [_Step(4, "decode", stock_table, [1, 2, 4])]
    text = allocator._describe_difference(mine, stock, 0, what)
    if what == "table":
        assert "block_table[1, 0, 2]" in text and "5" in text
    if what == "free":
        assert "[1, 2, 3]" in text and "[1, 2, 4]" in text
    if language == "ko" and what != "length":
        assert "디코드" in text and "decode" not in text
