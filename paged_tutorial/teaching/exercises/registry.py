"""One checker for every exercise and puzzle of the notebooks.

An *exercise* asks for a number (or a few): ``Exercise`` holds the question, the kind of
answer (``answers.py``), a function that computes the right answer from the package, the
known wrong answers with what each one means, and a hint.  A *puzzle* asks for a function that
runs inside the engine or the kernel (``paged_tutorial.teaching.chapters``).  Both grade an
answer into a ``Verdict``; ``check`` prints it and returns whether it is right.

The graders never see the worked solutions: those live apart, in ``solutions.py``, whose
``reveal(name)`` returns one.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from paged_tutorial.teaching.exercises import solved
from paged_tutorial.teaching.exercises.answers import Kind, as_plain
from paged_tutorial.teaching.exercises.progress import record, was_revealed
from paged_tutorial.teaching.exercises.solution_code import Solution
from paged_tutorial.teaching.error_text import exception_text
from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.verdict import Verdict, unsolved

#: the first word of every verdict line, by status
MARKS = {"correct": Text(en="✔ correct", ko="✔ 정답"),
         "revealed": Text(en="✔ revealed", ko="✔ 풀이 봄"),
         "wrong": Text(en="✘ not yet", ko="✘ 아직 아닙니다"),
         "unsolved": Text(en="✘ not solved yet", ko="✘ 아직 풀지 않았습니다")}


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer: ``value()`` computes it (from the package, like the right one);
    ``says`` tells the reader what it means."""

    value: Callable[[], Any]
    says: Text


_EXPECTED: dict = {}


@dataclass(frozen=True)
class Exercise:
    name: str                                    # "NN.short_name", NN = the notebook
    question: Text
    kind: Kind
    expected: Callable[[], Any]                  # the right answer, computed from the package
    explain: Callable[[Any], str]                # said when right (gets the expected value;
    #                                              built with ``say`` in both languages)
    hint: Text                                   # said when wrong and no known mistake matches
    mistakes: tuple[Mistake, ...] = field(default=())

    def right_answer(self):
        """``expected()``, computed once (some run an engine)."""
        if self.name not in _EXPECTED:
            _EXPECTED[self.name] = self.expected()
        return _EXPECTED[self.name]

    def grade(self, answer) -> Verdict:
        what = self.kind.what
        if unsolved(answer):
            return Verdict("unsolved", say(en=f"replace ... with your answer ({what})",
                                           ko=f"`...` 자리에 답을 쓰세요 ({what})"))
        problem = self.kind.type_problem(answer)
        if problem:
            return Verdict("wrong", say(en=f"{problem}.  Expected {what}.",
                                        ko=f"{problem}.  답은 {what}입니다."))
        expected = self.right_answer()
        if self.kind.equal(answer, expected):
            return Verdict("correct", str(self.explain(expected)))
        for mistake in self.mistakes:
            wrong = mistake.value()
            if self.kind.type_problem(wrong) is None and self.kind.equal(answer, wrong):
                return Verdict("wrong", str(mistake.says))
        parts = self.kind.wrong_parts(answer, expected)
        where = say(en=f"{', '.join(parts)} wrong; ",
                    ko=f"{particle(', '.join(parts), '이/가')} 틀렸습니다; ") \
            if parts else ""
        return Verdict("wrong", f"{where}{self.hint}")


# --- the registry --------------------------------------------------------------------------

_ITEMS: dict[str, Any] = {}


def _load() -> dict:
    """Exercises from each chapter's ``exercises.py`` (their ``EXERCISES``) and the puzzles of
    ``paged_tutorial.teaching.chapters`` (its ``PUZZLES``), by name."""
    if not _ITEMS:
        from paged_tutorial.teaching import chapters

        items = []
        for info in sorted(pkgutil.iter_modules(chapters.__path__), key=lambda i: i.name):
            if (Path(chapters.__path__[0]) / info.name / "exercises.py").exists():
                module = importlib.import_module(f"{chapters.__name__}.{info.name}.exercises")
                items += list(module.EXERCISES)
        items += list(chapters.PUZZLES)
        for item in items:
            if item.name in _ITEMS:
                raise RuntimeError(f"two exercises are named {item.name!r}")
            _ITEMS[item.name] = item
    return _ITEMS


def names(prefix: str = "") -> list[str]:
    """Every exercise and puzzle (of one notebook with ``prefix="03."``), sorted."""
    return sorted(n for n in _load() if n.startswith(prefix))


def get(name: str):
    """The ``Exercise`` or ``Puzzle`` called ``name``."""
    items = _load()
    if name not in items:
        known = ", ".join(sorted(items))
        raise KeyError(say(en=f"no exercise or puzzle named {name!r}; known: {known}",
                           ko=f"{name!r}라는 연습문제나 퍼즐은 없습니다; 있는 것: {known}"))
    return items[name]


def grade(name: str, answer) -> Verdict:
    """Grade ``answer`` without printing anything.  A worked solution from ``reveal`` is
    graded as the code it shows.  Whatever the answer does while it is graded (raises in
    ``__eq__`` or ``__repr__``, calls ``sys.exit``, is interrupted) ends in a verdict that says
    so, never in an exception."""
    item = get(name)
    try:
        worked = isinstance(answer, Solution)
        if worked:
            answer = answer.code
        if isinstance(item, Exercise):
            return item.grade(answer)
        return item.grade(answer, worked=worked)
    except SystemExit as exit_:
        from paged_tutorial.teaching.harness.base import exit_verdict

        return Verdict("wrong", exit_verdict(exit_))
    except KeyboardInterrupt:
        return Verdict("unsolved", say(
            en="grading was interrupted (KeyboardInterrupt) before it finished: nothing was "
               "graded; run the check again",
            ko="채점이 끝나기 전에 중단되었습니다 (KeyboardInterrupt): 채점된 것이 없습니다. 다시 "
               "실행하세요"))
    except Exception as exc:          # her object's __eq__, __hash__, __len__... raised
        return Verdict("wrong", say(
            en=f"your answer raised {type(exc).__name__} while it was being compared "
               f"({_text_of(exc)}): an answer is a plain value ({_what(item)})",
            ko=f"답을 비교하는 동안 예외가 발생했습니다 ({exception_text(exc)}): 답은 평범한 "
               f"값입니다 ({_what(item)})"))


def _what(item) -> str:
    return item.kind.what if isinstance(item, Exercise) else say(en="a function", ko="함수")


def _text_of(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as inner:
        return f"<its message raised {type(inner).__name__}>"


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def check(name: str, answer, draw: bool | None = None, remember: bool = True) -> bool:
    """Check ``answer`` to exercise or puzzle ``name`` (e.g. ``"01.v_offset"``): print a
    one-line verdict and return True when it is right and hers: a right answer to a puzzle
    whose worked solution was revealed first prints "revealed" and returns False (it is
    recorded as revealed, not solved).  For a puzzle, a figure of the graded
    run (what went wrong, or what the right answer did) is drawn too (by default only inside a
    notebook; ``draw`` forces it on or off).  A puzzle's function that is right is remembered
    (``solved.py``): the closing kernel notebook assembles the learner's kernel from them.
    ``remember=False``: an answer that is not the learner's own (a chapter's demonstration of
    a classic mistake, which a GPU may grade right by its output alone) is neither remembered
    nor recorded in her progress."""
    verdict = grade(name, answer)
    if verdict.ok and not isinstance(get(name), Exercise) and was_revealed(name):
        verdict = Verdict("revealed", say(
            en=f"right, but this puzzle's worked solution was revealed "
               f"(pt.exercises.reveal({name!r})) before it was solved, so it is recorded as "
               "revealed, not solved, and your kernel does not take this answer as yours.  "
               f"{verdict.message}",
            ko=f"맞지만, 이 퍼즐은 풀기 전에 풀이 예시를 보았으므로 "
               f"(pt.exercises.reveal({name!r})) 푼 것이 아니라 풀이를 본 것으로 기록하고, "
               f"여러분의 커널은 이 답을 여러분의 것으로 쓰지 않습니다.  {verdict.message}"),
            verdict.figure)
    if remember and verdict.ok and not isinstance(get(name), Exercise):
        solved.remember(name, answer)
    if remember:
        record(name, verdict)
    print(f"{MARKS[verdict.status]} [{name}]: {verdict.message}")
    if verdict.figure is not None and (_in_notebook() if draw is None else draw):
        try:
            figure = verdict.figure()
        except Exception as exc:      # a picture of her run that cannot be drawn
            print(say(en=f"(the figure could not be drawn: {type(exc).__name__}: {exc})",
                      ko=f"(그림을 그릴 수 없습니다: {exception_text(exc)})"))
            return verdict.ok
        if figure is not None and _in_notebook():
            import matplotlib.pyplot as plt
            from IPython.display import display

            display(figure)
            plt.close(figure)
    return verdict.ok


def expected_answer(name: str):
    """The right answer of an exercise as the checker computes it from the package (for
    tests, which compare it with the worked solution); puzzles have none."""
    item = get(name)
    if not isinstance(item, Exercise):
        raise TypeError(f"{name} is a puzzle: its answer is code, see reveal({name!r})")
    return as_plain(item.right_answer())
