"""What grading an answer says: a ``Verdict``, shared by the exercises and the puzzles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Verdict:
    """The result of grading one answer.  ``figure``, when set, draws what went wrong (called
    only where a figure can be shown)."""

    status: str                                  # "correct" | "wrong" | "unsolved"
    message: str
    figure: Callable[[], Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "correct"


def unsolved(answer) -> bool:
    """The placeholder a notebook cell starts with: ``answer = ...`` (or None)."""
    return answer is None or answer is Ellipsis
