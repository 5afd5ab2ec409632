"""An exception's text for a verdict, in the language in use.

Python's and the simulator's exception messages are English.  An English verdict quotes them as
they are ("IndexError: index 40 is out of bounds for axis 0 with size 32").  A Korean verdict
says in Korean what went wrong -- from the message itself where its form is known (an index past
an array's end, a shared array's cell out of range, a name never defined, Numba's "unknown
attribute" and "no implementation"), else from the exception's kind -- and quotes the English
once, labelled as the original:
"인덱스 40이 0번 축의 크기 32를 벗어났습니다 (영어 원문: IndexError: index 40 is out ...)".
"""

from __future__ import annotations

import re

from paged_tutorial.teaching.language import particle, say

#: the label before the quoted English message in a Korean verdict
ORIGINAL_LABEL = "영어 원문"

#: what an exception's kind means, in Korean, when its message has no form known below
KIND_IN_KOREAN = {
    "IndexError": "인덱스가 범위를 벗어났습니다",
    "KeyError": "없는 키를 찾았습니다",
    "TypeError": "값의 타입이 맞지 않습니다",
    "ValueError": "받아들일 수 없는 값입니다",
    "ZeroDivisionError": "0으로 나눴습니다",
    "AttributeError": "없는 속성을 찾았습니다",
    "NameError": "정의되지 않은 이름을 썼습니다",
    "UnboundLocalError": "값을 넣기 전의 지역 변수를 읽었습니다",
    "OverflowError": "수가 너무 커서 나타낼 수 없습니다",
    "RecursionError": "재귀 호출이 너무 깊어졌습니다",
    "AssertionError": "assert 조건이 거짓이었습니다",
    "FloatingPointError": "부동소수점 연산이 실패했습니다",
    "NotImplementedError": "아직 작성되지 않은 부분을 불렀습니다",
    "RuntimeError": "실행 중 오류가 났습니다",
    "SyntaxError": "파이썬 구문이 올바르지 않습니다",
    "IndentationError": "들여쓰기가 올바르지 않습니다",
    "SystemExit": "프로그램을 끝내려 했습니다",
    # Numba's compile errors
    "TypingError": "Numba가 코드의 타입을 정하지 못했습니다",
    "UnsupportedError": "Numba가 지원하지 않는 파이썬 코드입니다",
    "LoweringError": "Numba가 코드를 기계어로 옮기지 못했습니다",
    "NumbaError": "Numba가 코드를 컴파일하지 못했습니다",
}
GENERIC_IN_KOREAN = "예외가 발생했습니다"


def _axis_bounds(m) -> str:
    index, axis, size = m.group(1), m.group(2), m.group(3)
    return (f"인덱스 {particle(index, '이/가')} {axis}번 축의 크기 {particle(size, '을/를')} "
            "벗어났습니다")


def _shared_cell(m) -> str:
    name, index, op, thread, block, cells = m.groups()
    cell = f"`{name}[{index}]`"
    access = f"{particle(cell, '을/를')} 읽었는데" if op == "read" else f"{cell}에 썼는데"
    return (f"블록 ({block})의 스레드 {particle(thread, '이/가')} {access}, "
            f"`{name}`의 칸은 {cells}개뿐입니다: GPU에서는 배열 밖에 닿는 접근입니다")


#: message forms known from Python and the simulator: (pattern, its Korean)
KNOWN_MESSAGES = (
    (re.compile(r"index (-?\d+) is out of bounds for axis (\d+) with size (\d+)"), _axis_bounds),
    (re.compile(r"(\w+)\[(-?\d+)\] (read|written) by thread (\d+) of block \(([^)]*)\), but "
                r"\w+ has (\d+) cell"), _shared_cell),
    (re.compile(r"pop from empty list"), lambda m: "빈 리스트에서 pop으로 꺼냈습니다"),
    (re.compile(r"(?:integer |float )?division (?:or modulo )?by zero"),
     lambda m: "0으로 나눴습니다"),
    (re.compile(r"name '(\w+)' is not defined"),
     lambda m: f"정의되지 않은 이름 {particle(f'`{m.group(1)}`', '을/를')} 썼습니다"),
    (re.compile(r"list index out of range"), lambda m: "리스트의 인덱스가 범위를 벗어났습니다"),
    (re.compile(r"tuple index out of range"), lambda m: "튜플의 인덱스가 범위를 벗어났습니다"),
    (re.compile(r"math range error"), lambda m: "수가 너무 커서 나타낼 수 없습니다"),
    # Numba's compile errors
    (re.compile(r"Unknown attribute '(\w+)' of type Module\(<module '([\w.]+)'"),
     lambda m: f"Numba가 아는 모듈 `{m.group(2)}`에는 {particle(f'`{m.group(1)}`', '이/가')} "
               "없습니다"),
    (re.compile(r"Unknown attribute '(\w+)' of type (\S+)"),
     lambda m: f"`{m.group(2)}` 타입에는 `{m.group(1)}` 속성이 없습니다"),
    (re.compile(r"No implementation of function Function\(<built-in function (\w+)>\)"),
     lambda m: f"`{m.group(1)}`에는 이 인자 타입들을 받는 구현이 없습니다"),
    (re.compile(r"Unsupported array index type (\w+)"),
     lambda m: f"배열 인덱스가 정수가 아니라 {m.group(1)}입니다 (정수로 나누려면 //)"),
    (re.compile(r"Untyped global name '(\w+)'"),
     lambda m: f"Numba가 전역 이름 `{m.group(1)}`의 타입을 알 수 없습니다"),
    (re.compile(r"Use of unsupported opcode \((\w+)\)"),
     lambda m: f"Numba가 지원하지 않는 바이트코드({m.group(1)})입니다"),
    (re.compile(r"Cannot unify"), lambda m: "한 변수가 서로 다른 타입의 값을 가집니다"),
)


def in_korean(kind: str, message: str) -> str:
    """What exception ``kind`` with English ``message`` means, in Korean, without the quote."""
    for pattern, words in KNOWN_MESSAGES:
        match = pattern.search(message)
        if match:
            return words(match)
    return KIND_IN_KOREAN.get(kind, GENERIC_IN_KOREAN)


def error_text(kind: str, message: str) -> str:
    """``kind: message`` in English; in Korean, what it means and then the English quoted once,
    labelled."""
    original = f"{kind}: {message}" if message else kind
    return say(en=original,
               ko=f"{in_korean(kind, message)} ({ORIGINAL_LABEL}: {original})")


def text_of(exc: BaseException) -> str:
    """``str(exc)``, or what went wrong making it."""
    try:
        return str(exc)
    except Exception as inner:
        return f"<its message raised {type(inner).__name__}>"


def exception_text(exc: BaseException) -> str:
    """``error_text`` for an exception object."""
    return error_text(type(exc).__name__, text_of(exc))


#: lines of a Numba error that say where it happened, not what went wrong
_NUMBA_CONTEXT = re.compile(r"^(Failed in .* pipeline|During:|File \"|<source missing)")
#: the terminal colour codes Numba puts in its messages where it thinks a terminal shows them
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Numba's reason, deep in a "No implementation of function setitem/getitem" error, when an
#: array was indexed with something that is not an integer
_BAD_INDEX = re.compile(r"Unsupported array index type (\w+)")


def compile_reason(exc: BaseException) -> str:
    """The line of Numba's compile error ``exc`` that says what went wrong: the first that is
    not its pipeline header ("Failed in nopython mode pipeline ..."), a "During:" line or a
    source location; the first line when every line is one of those.  An array indexed with a
    float is said as such (Numba says it only deep in its list of candidates).  Terminal colour
    codes are dropped."""
    text = _TERMINAL_CODES.sub("", text_of(exc))
    bad_index = _BAD_INDEX.search(text)
    if bad_index:
        kind = bad_index.group(1)
        what = "a float index" if kind.startswith("float") else f"a {kind} index"
        return (f"{bad_index.group(0)}: {what}; an array index must be an integer "
                "(// divides to one)")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if not _NUMBA_CONTEXT.match(line)]
    return (said or lines or [""])[0]


def compile_error_text(exc: BaseException) -> str:
    """``error_text`` for Numba's compile error ``exc``, from the line that says what went
    wrong."""
    return error_text(type(exc).__name__, compile_reason(exc))
