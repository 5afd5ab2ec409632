"""Korean particles follow the noun's final sound, as Korean reads digits and Latin letters."""

from __future__ import annotations

import pytest

from paged_tutorial.teaching.language import particle


@pytest.mark.parametrize("word, pair, expected", [
    ("스레드", "이/가", "스레드가"), ("블록", "이/가", "블록이"), ("스레드 0", "이/가", "스레드 0이"),
    ("스레드 2", "이/가", "스레드 2가"), ("스레드 1-31", "은/는", "스레드 1-31은"),
    ("스레드 1-4", "은/는", "스레드 1-4는"), ("10", "을/를", "10을"), ("100", "이/가", "100이"),
    ("20", "과/와", "20과"), ("9", "과/와", "9와"), ("표", "을/를", "표를"), ("값", "을/를", "값을"),
    ("1", "으로/로", "1로"), ("1-31", "으로/로", "1-31로"), ("3", "으로/로", "3으로"),
    ("2", "으로/로", "2로"), ("서울", "으로/로", "서울로"), ("집", "으로/로", "집으로"),
    ("L", "이/가", "L이"), ("L", "으로/로", "L로"), ("M", "은/는", "M은"), ("k", "은/는", "k는"),
    ("`block_table`", "을/를", "`block_table`를"), ("kv_head", "이/가", "kv_head가"),
    ("정답", "이다/다", "정답이다"), ("오류", "이다/다", "오류다"), ("7", "이다/다", "7이다"),
])
def test_the_particle_follows_the_final_sound(word, pair, expected):
    assert particle(word, pair) == expected


def test_an_unknown_pair_is_named():
    with pytest.raises(ValueError, match="의/에"):
        particle("스레드", "의/에")
