"""The checker speaks Korean as well as English: every prompt, hint and verdict of the
exercises and puzzles of chapters 00, 01, 02, 06, 07 and 09 and every generic message exists in
both, and a Korean verdict is Korean."""

from __future__ import annotations

import re

import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.exercises import answers, registry
from paged_tutorial.teaching.exercises.registry import Exercise
from paged_tutorial.teaching.language import Text, set_language
from paged_tutorial.teaching.puzzles.base import Puzzle

CHAPTERS = ("00.", "01.", "02.", "06.", "07.", "09.")
#: puzzles of these chapters whose texts live with the kernel's puzzles (notebooks 03-05)
ELSEWHERE = {"02.table_index"}
OWNED = [n for n in ex.names() if n.startswith(CHAPTERS) and n not in ELSEWHERE]
EXERCISES = [n for n in OWNED if isinstance(ex.get(n), Exercise)]
PUZZLES = [n for n in OWNED if isinstance(ex.get(n), Puzzle)]
HANGUL = re.compile(r"[\uac00-\ud7a3]")


def korean(text: str) -> bool:
    return bool(HANGUL.search(text))


def test_every_stored_text_has_both_languages():
    for name in EXERCISES:
        item = ex.get(name)
        texts = [item.question, item.hint] + [m.says for m in item.mistakes]
        assert all(isinstance(t, Text) for t in texts), name
        assert all(korean(t.ko) and not korean(t.en) for t in texts), name
    for name in PUZZLES:
        item = ex.get(name)
        for text in (item.title, item.docstring, item.hint, item.runs_in):
            assert isinstance(text, Text), (name, text)
            assert korean(text.ko) and not korean(text.en), (name, text)
    from paged_tutorial.teaching.puzzles import allocator

    for text in (allocator.ENSURE_DOC, allocator.RELEASE_DOC):
        assert korean(text.ko) and not korean(text.en)
    for mark in registry.MARKS.values():
        assert korean(mark.ko) and not korean(mark.en)
    with pytest.raises(ValueError, match="missing"):
        Text(en="only English", ko="")


@pytest.mark.parametrize("name", EXERCISES)
def test_exercise_verdicts_in_korean(name, capsys):
    solution = ex.reveal(name)
    set_language("ko")
    right = ex.grade(name, solution)
    assert right.ok and (korean(right.message) or re.fullmatch(r"[\w\s(),=*+.-]+",
                                                               right.message)), right.message
    mistakes = ex.get(name).mistakes
    wrong_value = mistakes[0].value() if mistakes else (-7, -7, -7)[:len(solution)] \
        if isinstance(solution, tuple) else -7
    for answer in (wrong_value, ..., "31", True):
        verdict = ex.grade(name, answer)
        assert not verdict.ok and korean(verdict.message), (answer, verdict.message)
    ex.check(name, ...)
    assert capsys.readouterr().out.startswith(f"✘ 아직 풀지 않았습니다 [{name}]")
    set_language("en")
    assert not korean(ex.grade(name, ...).message)


def test_answer_kinds_describe_themselves_in_both():
    kinds = (answers.Integer(), answers.Real(), answers.Numbers(answers.Integer(), 2, ("a", "b")))
    for kind in kinds:
        english = kind.what
        set_language("ko")
        assert korean(kind.what) and korean(kind.type_problem("12"))
        set_language("en")
        assert kind.what == english and not korean(english)


@pytest.mark.slow
@pytest.mark.parametrize("name", PUZZLES)
def test_puzzle_verdicts_in_korean(name):
    from test_puzzles import WRONG

    set_language("ko")
    right = ex.grade(name, ex.reveal(name))
    assert right.ok and korean(right.message), right.message
    what, wrong = next(iter(WRONG[name].items()))
    verdict = ex.grade(name, wrong)
    assert verdict.status == "wrong" and korean(verdict.message), (what, verdict.message)
    assert korean(ex.grade(name, ...).message)
    assert korean(ex.puzzle(name).describe())
