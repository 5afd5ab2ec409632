"""Korean particles follow the noun's final sound, as Korean reads digits and Latin letters;
a closing parenthetical is an aside, so the word before it decides."""

from __future__ import annotations

import pytest

from paged_tutorial.teaching.language import particle, set_language, term


@pytest.mark.parametrize("word, pair, expected", [
    ("스레드", "이/가", "스레드가"), ("블록", "이/가", "블록이"), ("스레드 0", "이/가", "스레드 0이"),
    ("스레드 2", "이/가", "스레드 2가"), ("스레드 1-31", "은/는", "스레드 1-31은"),
    ("스레드 1-4", "은/는", "스레드 1-4는"), ("10", "을/를", "10을"), ("100", "이/가", "100이"),
    ("20", "과/와", "20과"), ("9", "과/와", "9와"), ("표", "을/를", "표를"), ("값", "을/를", "값을"),
    ("1", "으로/로", "1로"), ("1-31", "으로/로", "1-31로"), ("3", "으로/로", "3으로"),
    ("2", "으로/로", "2로"), ("서울", "으로/로", "서울로"), ("집", "으로/로", "집으로"),
    ("L", "이/가", "L이"), ("L", "으로/로", "L로"), ("M", "은/는", "M은"), ("k", "은/는", "k는"),
    ("`block_table`", "을/를", "`block_table`을"), ("kv_head", "이/가", "kv_head가"),
    ("정답", "이다/다", "정답이다"), ("오류", "이다/다", "오류다"), ("7", "이다/다", "7이다"),
])
def test_the_particle_follows_the_final_sound(word, pair, expected):
    assert particle(word, pair) == expected


@pytest.mark.parametrize("word, pair, expected", [
    # decimals and exponents by their last digit
    ("0.825", "과/와", "0.825와"), ("31.0", "은/는", "31.0은"), ("3.4e38", "을/를", "3.4e38을"),
    ("-7", "은/는", "-7은"), ("'31'", "은/는", "'31'은"),
    # a bracket is read by what it holds: its last item
    ("block_table[36]", "을/를", "block_table[36]을"), ("[5]", "을/를", "[5]를"),
    ("block_table[0, 0, 2]", "이/가", "block_table[0, 0, 2]가"),
])
def test_numbers_in_code_are_read_by_their_last_digit(word, pair, expected):
    assert particle(word, pair) == expected


@pytest.mark.parametrize("word, pair, expected", [
    ("K(케이)", "이/가", "K(케이)가"), ("스레드 블록 (행 3)", "이/가", "스레드 블록 (행 3)이"),
    ("원소 1520 (물리 블록 1의 6번 행)", "을/를", "원소 1520 (물리 블록 1의 6번 행)을"),
    ("원소 2 (물리 블록 1의 6번 행)", "을/를", "원소 2 (물리 블록 1의 6번 행)를"),
    ("스텝 3 (디코드)", "이/가", "스텝 3 (디코드)이"),
    ("ensure_capacity(slot=0, new_len=17)", "이/가", "ensure_capacity(slot=0, new_len=17)가"),
    ("(슬롯 0, 레이어 1)", "을/를", "(슬롯 0, 레이어 1)을"),
])
def test_a_parenthetical_is_an_aside_the_word_before_it_decides(word, pair, expected):
    assert particle(word, pair) == expected


@pytest.mark.parametrize("word, pair, expected", [
    ("MyAllocator", "을/를", "MyAllocator를"), ("IndexError", "이/가", "IndexError가"),
    ("V_OFFSET", "은/는", "V_OFFSET은"), ("slot", "이/가", "slot이"), ("block", "이/가", "block이"),
    ("table", "으로/로", "table로"), ("bool", "은/는", "bool은"), ("write_output", "으로/로",
                                                                  "write_output으로"),
    ("cell_type", "이/가", "cell_type이"), ("HEAD_DIM", "을/를", "HEAD_DIM을"),
    ("pop", "을/를", "pop을"), ("loop", "이/가", "loop가"), ("check", "을/를", "check를"),
    ("float32", "으로/로", "float32로"), ("NaN", "이/가", "NaN이"), ("line", "이/가", "line이"),
    ("GPU", "은/는", "GPU는"), ("KV", "을/를", "KV를"), ("EOS", "이/가", "EOS가"),
    ("thread_id", "이/가", "thread_id가"), ("`score`", "을/를", "`score`를"),
])
def test_latin_words_are_read_as_korean_says_them(word, pair, expected):
    assert particle(word, pair) == expected


def test_an_unknown_pair_is_named():
    with pytest.raises(ValueError, match="의/에"):
        particle("스레드", "의/에")


def test_engine_words_take_their_glossary_term_in_korean():
    assert term("decode") == "decode" and term("prefill") == "prefill"
    set_language("ko")
    try:
        assert term("decode") == "디코드" and term("prefill") == "프리필"
        assert term("warmup") == "warmup"           # a word with no term stays as it is
    finally:
        set_language("en")
