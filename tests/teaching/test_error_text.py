"""Python's and the simulator's English exception lines inside a Korean verdict are explained in
Korean, with the English quoted once after its label; an English verdict quotes them as they
are."""

from __future__ import annotations

import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.error_text import (ORIGINAL_LABEL, compile_error_text, compile_reason,
                                                error_text,
                                                in_korean)
from paged_tutorial.teaching.language import set_language
from test_language import english_sentence

SHARED = ("dot_products[1] read by thread 0 of block (0, 0), but dot_products has 1 cell(s) "
          "(0..0): on a GPU that access lands outside the array")


@pytest.mark.parametrize("kind,message,korean", [
    ("IndexError", "index 40 is out of bounds for axis 0 with size 32",
     "인덱스 40이 0번 축의 크기 32를 벗어났습니다"),
    ("IndexError", SHARED, "스레드 0이 `dot_products[1]`을 읽었는데, `dot_products`의 칸은 1개뿐"),
    ("IndexError", "pop from empty list", "빈 리스트에서 pop으로 꺼냈습니다"),
    ("ZeroDivisionError", "division by zero", "0으로 나눴습니다"),
    ("NameError", "name 'term' is not defined", "정의되지 않은 이름 `term`을 썼습니다"),
    ("KeyError", "7", "없는 키를 찾았습니다"),
    ("SomethingNew", "whatever it says", "예외가 발생했습니다"),
    ("TypingError", "Unknown attribute 'itemsize' of type int64",
     "`int64` 타입에는 `itemsize` 속성이 없습니다"),
    ("TypingError", "Unknown attribute 'comb' of type Module(<module 'math' from 'm.so'>)",
     "Numba가 아는 모듈 `math`에는 `comb`가 없습니다"),
    ("TypingError", "No implementation of function Function(<built-in function len>) found "
                    "for signature:", "`len`에는 이 인자 타입들을 받는 구현이 없습니다"),
    ("TypingError", "Untyped global name 'helper': Cannot determine Numba type of <class "
                    "'function'>", "Numba가 전역 이름 `helper`의 타입을 알 수 없습니다"),
    ("UnsupportedError", "Use of unsupported opcode (SETUP_WITH) found",
     "Numba가 지원하지 않는 바이트코드(SETUP_WITH)입니다"),
    ("TypingError", "Cannot unify int64 and float64 for 'x.2'",
     "한 변수가 서로 다른 타입의 값을 가집니다"),
    ("LoweringError", "something new", "Numba가 코드를 기계어로 옮기지 못했습니다"),
])
def test_each_message_is_said_in_korean(kind, message, korean):
    assert korean in in_korean(kind, message)
    set_language("ko")
    said = error_text(kind, message)
    assert said.startswith(korean.split("`")[0]) or korean in said
    assert said.count(f"{ORIGINAL_LABEL}: {kind}: {message}") == 1
    assert english_sentence(said) is None
    set_language("en")
    assert error_text(kind, message) == f"{kind}: {message}"


def _offset_raising(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                    ITEMSIZE):
    return [0, 1][token_in_block + 5]


def _k_index_raising(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM,
                     HEAD_DIM):
    return [token][thread_id + 5]


@pytest.mark.parametrize("name,answer", [("01.kv_offset", _offset_raising),
                                         ("03.k_index", _k_index_raising)])
def test_a_korean_verdict_explains_the_exception_and_quotes_it_once(name, answer):
    set_language("ko")
    verdict = ex.grade(name, answer)
    assert verdict.status == "wrong"
    assert "리스트의 인덱스가 범위를 벗어났습니다" in verdict.message, verdict.message
    assert verdict.message.count("IndexError") == 1
    assert f"{ORIGINAL_LABEL}: IndexError: list index out of range" in verdict.message
    assert english_sentence(verdict.message) is None, verdict.message


def test_the_line_of_a_numba_error_that_says_what_went_wrong_is_quoted():
    typing = Exception("Failed in nopython mode pipeline (step: nopython frontend)\n"
                       "Unknown attribute 'itemsize' of type int64\n\nFile \"<string>\", line 7:\n"
                       "<source missing, REPL/exec in use?>\n\nDuring: typing of get attribute")
    assert compile_reason(typing) == "Unknown attribute 'itemsize' of type int64"
    only_context = Exception("Failed in cuda mode pipeline (step: nopython frontend)\n"
                             "During: Pass nopython_type_inference")
    assert compile_reason(only_context) == \
        "Failed in cuda mode pipeline (step: nopython frontend)"
    assert compile_reason(Exception("")) == ""


def test_numbas_terminal_colours_are_dropped_and_a_float_index_is_named():
    coloured = Exception("Failed in cuda mode pipeline (step: nopython frontend)\n"
                         "\x1b[1m\x1b[1m\x1b[1mUnknown attribute 'bit_length' of type int64"
                         "\x1b[0m")
    assert compile_reason(coloured) == "Unknown attribute 'bit_length' of type int64"
    import numba
    import numpy as np

    @numba.njit
    def store_at_a_quotient(cells, thread_id):
        cells[thread_id / 32] = 1.0

    with pytest.raises(numba.core.errors.TypingError) as raised:
        store_at_a_quotient(np.zeros(4, np.float32), 3)
    reason = compile_reason(raised.value)
    assert "float index" in reason and "an array index must be an integer" in reason, reason
    set_language("ko")
    try:
        assert "배열 인덱스가 정수가 아니라 float64입니다" in compile_error_text(raised.value)
    finally:
        set_language("en")


def _k_index_numba_cannot_type(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS,
                               KV_DIM, HEAD_DIM):
    return (physical_block * BLOCK_ELEMS + token * KV_DIM + q_head // Q_PER_KV * HEAD_DIM
            + thread_id + token.bit_length() * 0)   # a Python int's method: not Numba's


@pytest.mark.parametrize("language", ["en", "ko"])
def test_a_verdict_on_code_numba_cannot_compile_quotes_numbas_reason(language):
    set_language(language)
    verdict = ex.grade("03.k_index", _k_index_numba_cannot_type)
    assert verdict.status == "wrong"
    assert "Failed in" not in verdict.message, verdict.message
    english = "TypingError: Unknown attribute 'bit_length' of type int64"
    assert verdict.message.count(english) == 1, verdict.message
    if language == "ko":
        assert "`int64` 타입에는 `bit_length` 속성이 없습니다" in verdict.message
        assert f"{ORIGINAL_LABEL}: {english}" in verdict.message
        assert english_sentence(verdict.message) is None, verdict.message


def test_a_damaged_remembered_answer_is_explained_in_korean(monkeypatch, tmp_path):
    from paged_tutorial.teaching.exercises import solved

    monkeypatch.setenv("PAGED_TUTORIAL_SOLVED", str(tmp_path))
    solved.clear()
    (tmp_path / "03.walk_blocks.py").write_text("def walk_blocks(:\n")
    set_language("ko")
    try:
        with pytest.raises(solved.SolvedFileError) as raised:
            solved.solved("03.walk_blocks")
    finally:
        solved.clear()
    message = str(raised.value)
    assert "구문" in message and message.count("SyntaxError") == 1, message
    assert f"{ORIGINAL_LABEL}: SyntaxError:" in message
    assert english_sentence(message) is None, message
