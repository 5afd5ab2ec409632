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

SIGNIFICANT_DIGITS = 4


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_problem_integer(value) -> str | None:
    """Why ``value`` is not an integer answer, or None if it is one."""
    if isinstance(value, (bool, np.bool_)):
        return f"{value!r} is a bool, not an integer: give the number itself"
    if isinstance(value, numbers.Integral):
        return None
    if isinstance(value, str):
        return (f"{_describe(value)} is text (a str), not a number: drop the quotes, e.g. "
                f"31 rather than '31'")
    if isinstance(value, numbers.Real):
        return (f"{_describe(value)} is a {type(value).__name__}, but this answer is an integer "
                "(a count, an index or a number of bytes): compute it with integer arithmetic "
                "(// rather than /), without rounding")
    return f"{_describe(value)} is a {type(value).__name__}, not an integer"


def _type_problem_real(value) -> str | None:
    if isinstance(value, (bool, np.bool_)):
        return f"{value!r} is a bool, not a number"
    if isinstance(value, str):
        return f"{_describe(value)} is text (a str), not a number: drop the quotes"
    if isinstance(value, numbers.Real):
        return None
    return f"{_describe(value)} is a {type(value).__name__}, not a real number"


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

    #: how the answer is described to the reader ("an integer", "a tuple of 2 integers")
    what: str = "an answer"

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
    what: str = "an integer"

    def type_problem(self, value):
        return _type_problem_integer(value)

    def equal(self, got, expected):
        return int(got) == int(expected)


@dataclass(frozen=True)
class Real(Kind):
    what: str = f"a real number (checked to {SIGNIFICANT_DIGITS} significant digits)"

    def type_problem(self, value):
        problem = _type_problem_real(value)
        if problem is None and math.isnan(float(value)):
            return "the answer is NaN (not a number)"
        return problem

    def equal(self, got, expected):
        return agrees_to_digits(got, expected)


@dataclass(frozen=True)
class Numbers(Kind):
    """A fixed-length sequence of ``item`` answers; ``labels`` name the elements in feedback."""

    item: Kind
    length: int
    labels: tuple[str, ...] = ()

    @property
    def what(self) -> str:  # type: ignore[override]
        names = f" ({', '.join(self.labels)})" if self.labels else ""
        noun = self.item.what.replace("an integer", "integers").replace(
            "a real number", "real numbers")
        return f"a tuple or list of {self.length} {noun}{names}"

    def _label(self, i: int) -> str:
        return self.labels[i] if i < len(self.labels) else f"element {i}"

    def type_problem(self, value):
        if isinstance(value, (str, bytes)):
            return f"{_describe(value)} is text (a str), not {self.what}"
        if isinstance(value, np.ndarray):
            if value.ndim != 1:
                return f"an array of shape {value.shape}: give {self.what}"
            items = list(value)
        elif isinstance(value, (tuple, list)):
            items = list(value)
        else:
            return f"{_describe(value)} is a {type(value).__name__}: give {self.what}"
        if len(items) != self.length:
            return f"{len(items)} element(s) given: give {self.what}"
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
