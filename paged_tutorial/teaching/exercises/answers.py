"""What an answer must be, and how it is compared: ``Integer``, ``Real``, ``Numbers``.

No coercion.  An integer answer must be an integer (a Python ``int`` or a NumPy integer):
``581.9``, ``581.0`` and ``"581"`` are wrong, and so is ``True`` (a bool is not a number
here); the feedback says which type was given and why it is not accepted.  A real answer may
be any real number (int or float, Python or NumPy) and is right when it agrees with the
expected value to 4 significant digits (within one unit of the 4th digit, so a hand-computed
``0.2231`` for 0.22313... is right, and so is a rounded ``0.2232`` for 0.22316...).  A
sequence answer is a tuple, a list or a 1-D NumPy array of the right length, compared element
by element with the same rules.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from paged_tutorial.teaching.language import particle, say

SIGNIFICANT_DIGITS = 4


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_problem_integer(value) -> str | None:
    """Why ``value`` is not an integer answer, or None if it is one."""
    v, kind = _describe(value), type(value).__name__
    if isinstance(value, (bool, np.bool_)):
        return say(en=f"{value!r} is a bool, not an integer: give the number itself",
                   ko=f"{particle(repr(value), '은/는')} bool이지 정수가 아닙니다: 수 자체를 답하세요")
    if isinstance(value, numbers.Integral):
        return None
    if isinstance(value, str):
        return say(en=f"{v} is text (a str), not a number: drop the quotes, e.g. 31 rather "
                      "than '31'",
                   ko=f"{particle(v, '은/는')} 문자열(str)이지 수가 아닙니다: 따옴표를 빼세요 ('31'이 아니라 31)")
    if isinstance(value, numbers.Real):
        return say(en=f"{v} is a {kind}, but this answer is an integer (a count, an index or a "
                      "number of bytes): compute it with integer arithmetic (// rather than /), "
                      "without rounding",
                   ko=f"{particle(v, '은/는')} {kind}인데, 이 답은 정수(개수, 인덱스, 바이트 수)입니다: 반올림 "
                      "없이 정수 연산으로 (/ 대신 //) 계산하세요")
    return say(en=f"{v} is a {kind}, not an integer", ko=f"{particle(v, '은/는')} {kind}이지 정수가 아닙니다")


def _type_problem_real(value) -> str | None:
    v, kind = _describe(value), type(value).__name__
    if isinstance(value, (bool, np.bool_)):
        return say(en=f"{value!r} is a bool, not a number",
                   ko=f"{particle(repr(value), '은/는')} bool이지 수가 아닙니다")
    if isinstance(value, str):
        return say(en=f"{v} is text (a str), not a number: drop the quotes",
                   ko=f"{particle(v, '은/는')} 문자열(str)이지 수가 아닙니다: 따옴표를 빼세요")
    if isinstance(value, numbers.Real):
        return None
    return say(en=f"{v} is a {kind}, not a real number",
               ko=f"{particle(v, '은/는')} {kind}이지 실수가 아닙니다")


def agrees_to_digits(got: float, expected: float, digits: int = SIGNIFICANT_DIGITS) -> bool:
    """True when ``got`` matches ``expected`` within one unit of its ``digits``-th significant
    digit (``expected`` 0 needs ``got`` within 1e-12)."""
    got, expected = float(got), float(expected)
    if math.isnan(got) or math.isnan(expected):
        return False
    if math.isinf(got) or math.isinf(expected):
        return got == expected
    if expected == 0.0:
        return abs(got) <= 1e-12
    unit = 10.0 ** (math.floor(math.log10(abs(expected))) - (digits - 1))
    return abs(got - expected) <= unit * (1 + 1e-9)


class Kind:
    """The shape and type of an answer."""

    @property
    def what(self) -> str:
        """How the answer is described to the reader ("an integer", "a tuple of 2 integers"),
        in the current language."""
        raise NotImplementedError

    def type_problem(self, value) -> str | None:
        """Why ``value`` cannot be this kind of answer (None if it can)."""
        raise NotImplementedError

    def equal(self, got, expected) -> bool:
        """Right value (``got`` already passed ``type_problem``)."""
        raise NotImplementedError

    def wrong_parts(self, got, expected) -> list[str]:
        """Names of the wrong parts (for a sequence); empty for a single number."""
        return []


@dataclass(frozen=True)
class Integer(Kind):
    @property
    def what(self) -> str:
        return say(en="an integer", ko="정수")

    def type_problem(self, value):
        return _type_problem_integer(value)

    def equal(self, got, expected):
        return int(got) == int(expected)


@dataclass(frozen=True)
class Real(Kind):
    @property
    def what(self) -> str:
        return say(en=f"a real number (checked to {SIGNIFICANT_DIGITS} significant digits)",
                   ko=f"실수 (유효숫자 {SIGNIFICANT_DIGITS}자리까지 비교)")

    def type_problem(self, value):
        problem = _type_problem_real(value)
        if problem is None and math.isnan(float(value)):
            return say(en="the answer is NaN (not a number)", ko="답이 NaN (수가 아님)입니다")
        return problem

    def equal(self, got, expected):
        return agrees_to_digits(got, expected)


@dataclass(frozen=True)
class Numbers(Kind):
    """A fixed-length sequence of ``item`` answers; ``labels`` name the elements in feedback
    (a ``Text`` where the name is words, a plain string where it is a code name)."""

    item: Kind
    length: int
    labels: tuple = ()

    @property
    def what(self) -> str:
        names = f" ({', '.join(str(label) for label in self.labels)})" if self.labels else ""
        integers = isinstance(self.item, Integer)
        return say(en=f"a tuple or list of {self.length} "
                      f"{'integers' if integers else 'real numbers'}{names}",
                   ko=f"{'정수' if integers else '실수'} {self.length}개의 튜플이나 리스트{names}")

    def _label(self, i: int) -> str:
        return str(self.labels[i]) if i < len(self.labels) else say(en=f"element {i}",
                                                                 ko=f"{i}번 원소")

    def type_problem(self, value):
        v, what = _describe(value), self.what
        if isinstance(value, (str, bytes)):
            return say(en=f"{v} is text (a str), not {what}",
                       ko=f"{particle(v, '은/는')} 문자열(str)입니다: "
                          f"{particle(what, '으로/로')} 답하세요")
        if isinstance(value, np.ndarray):
            if value.ndim != 1:
                return say(en=f"an array of shape {value.shape}: give {what}",
                           ko=f"모양이 {value.shape}인 배열입니다: {particle(what, '으로/로')} 답하세요")
            items = list(value)
        elif isinstance(value, (tuple, list)):
            items = list(value)
        else:
            return say(en=f"{v} is a {type(value).__name__}: give {what}",
                       ko=f"{particle(v, '은/는')} {type(value).__name__}입니다: "
                          f"{particle(what, '으로/로')} 답하세요")
        if len(items) != self.length:
            return say(en=f"{len(items)} element(s) given: give {what}",
                       ko=f"원소 {len(items)}개를 줬습니다: {particle(what, '으로/로')} 답하세요")
        for i, item in enumerate(items):
            problem = self.item.type_problem(item)
            if problem:
                return f"{self._label(i)}: {problem}"
        return None

    def equal(self, got, expected):
        return all(self.item.equal(g, e) for g, e in zip(list(got), list(expected)))

    def wrong_parts(self, got, expected):
        return [self._label(i) for i, (g, e) in enumerate(zip(list(got), list(expected)))
                if not self.item.equal(g, e)]


def as_plain(value):
    """An answer as plain Python numbers (for messages and comparisons with known mistakes)."""
    if isinstance(value, (tuple, list, np.ndarray)):
        return tuple(as_plain(v) for v in value)
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    return value
