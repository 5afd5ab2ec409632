"""The checker speaks Korean as well as English: every prompt, hint and verdict of the
exercises and puzzles of chapters 00, 01, 02, 06, 07 and 09 and every generic message exists in
both, and a Korean verdict is Korean.  The Korean text as a whole, read from every say(...) and
Text(...) of the learner's tools: particles written against their noun and chosen by particle()
after a computed value, the glossary's terms only (docs/korean-review.md)."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.exercises import answers, registry
from paged_tutorial.teaching.exercises.registry import Exercise
from paged_tutorial.teaching.error_text import ORIGINAL_LABEL
from paged_tutorial.teaching.language import GLOSSARY, Text, set_language
from paged_tutorial.teaching.harness.base import Puzzle

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
    from paged_tutorial.teaching.chapters.ch06_block_lifetime import allocator

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
    assert english_sentence(right.message) is None, right.message
    assert english_sentence(str(ex.get(name).question) + str(ex.get(name).hint)) is None
    mistakes = ex.get(name).mistakes
    wrong_value = mistakes[0].value() if mistakes else (-7, -7, -7)[:len(solution)] \
        if isinstance(solution, tuple) else -7
    for answer in (wrong_value, ..., "31", True):
        verdict = ex.grade(name, answer)
        assert not verdict.ok and korean(verdict.message), (answer, verdict.message)
        assert english_sentence(verdict.message) is None, (answer, verdict.message)
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
    wrong_verdicts = [ex.grade(name, wrong) for wrong in WRONG[name].values()]
    for (what, _), verdict in zip(WRONG[name].items(), wrong_verdicts):
        assert verdict.status == "wrong" and korean(verdict.message), (what, verdict.message)
    assert korean(ex.grade(name, ...).message)
    assert korean(ex.puzzle(name).describe())
    prose = "\n".join(line for line in ex.puzzle(name).describe().splitlines()
                      if not re.match(r"\s*(def|class|from|import|\.\.\.)\b", line))
    for text in [right.message, prose] + [v.message for v in wrong_verdicts]:
        assert english_sentence(text) is None, text


# -- the Korean text as a whole: static checks over every say(...) and Text(...) -----------------
TEACHING = pathlib.Path(ex.__file__).resolve().parents[1]
PLACEHOLDER = "\x00"
#: a particle whose form depends on the noun before it
ALTERNATING = r"(?:은|는|이|가|을|를|과|와|으로|로)"
#: particles, endings and counters that attach to the word before them
ATTACHED = (ALTERNATING[3:-1] + "|의|에|에서|에서는|에는|에도|에서만|입니다|인|인데|이면|이지만|"
            "인가요|이나|나|들|도|만|까지|까지의|부터|부터의|보다|마다|만큼|개|개의|짜리|번째|쌍")


def _text(node) -> str | None:
    """A string expression as text, every computed part as PLACEHOLDER (None: not a string)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else PLACEHOLDER
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else PLACEHOLDER
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (_text(node.left) or PLACEHOLDER) + (_text(node.right) or PLACEHOLDER)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "format":
        return re.sub(r"\{[^{}]*\}", PLACEHOLDER, _text(node.func.value) or PLACEHOLDER)
    if isinstance(node, ast.IfExp):
        return f"{_text(node.body) or PLACEHOLDER} {_text(node.orelse) or PLACEHOLDER}"
    return PLACEHOLDER


def _bilingual_texts():
    """(where, English, Korean) of every say(en=..., ko=...) and Text(en=..., ko=...) in the
    learner's tools, read from the source."""
    found = []
    for path in sorted(TEACHING.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = getattr(node, "func", None)
            name = getattr(name, "id", getattr(name, "attr", None))
            if isinstance(node, ast.Call) and name in ("say", "Text"):
                given = {k.arg: k.value for k in node.keywords}
                if {"en", "ko"} <= set(given):
                    found.append((f"{path.name}:{node.lineno}", _text(given["en"]),
                                  _text(given["ko"])))
    return found


TEXTS = _bilingual_texts()


def _outside_code(text: str) -> str:
    return re.sub(r"`[^`]*`", "`code`", text)


def test_every_text_has_a_korean_side_that_is_korean():
    assert len(TEXTS) > 300
    for where, en, ko in TEXTS:
        assert ko.strip(), where
        if re.search(r"[A-Za-z]{2,}", en.replace(PLACEHOLDER, "")):    # words, not a bare label
            assert korean(ko) and ko != en, (where, ko)


def test_no_particle_stands_apart_from_its_noun():
    """'스레드 0 이', 'K 와 V 를', '{value} 는': a particle is written against its noun."""
    apart = re.compile(r"[A-Za-z0-9_)\]`'%\x00] (?:" + ATTACHED + r")(?=[ .,:;)!?\n\x00]|$)")
    apart_ones = []
    for where, _, ko in TEXTS:
        text = _outside_code(ko)
        for match in apart.finditer(text):
            before = text[max(match.start() - 12, 0):match.end()]
            if before.endswith(") 이") and text[match.end():].startswith(" "):
                continue                               # 이 as "this": "(...) 이 스레드의"
            apart_ones.append(f"{where}: {before!r}")
    assert not apart_ones, "particles apart from their noun:\n" + "\n".join(apart_ones)


def test_a_particle_after_a_computed_word_is_chosen_by_particle():
    """A fixed 이/가, 은/는... after a value computed at grading time is right for some values
    only ('스레드 {t}가' reads '스레드 0가'); particle() chooses it."""
    fixed = re.compile(r"\x00(?:\]| ?\([^()]*\))?" + ALTERNATING + r"(?![\uac00-\ud7a3])")
    fixed_ones = [f"{where}: {ko[max(m.start() - 20, 0):m.end()]!r}" for where, _, ko in TEXTS
                  for m in fixed.finditer(ko)]
    assert not fixed_ones, "fixed particles after computed words:\n" + "\n".join(fixed_ones)


def test_the_glossary_terms_are_the_only_ones_used():
    off_glossary = [f"{where}: {variant!r} where the glossary says {korean_term!r} ({english})"
                    for where, _, ko in TEXTS for english, (korean_term, variants) in
                    GLOSSARY.items() for variant in variants
                    if re.search(r"(?<![\w.])" + re.escape(variant) + r"(?![A-Za-z0-9_])",
                                 _outside_code(ko))]
    assert not off_glossary, "\n".join(off_glossary)


#: words a Korean verdict may show as they are: code names, units, data types, numbers' words
ENGLISH_ALLOWED = {"nan", "inf", "bf16", "float32", "float64", "int32", "int", "float", "str",
                   "bool", "dict", "torch", "exp", "sqrt", "ceil", "min", "max", "sum", "x"}


def english_sentence(text: str) -> str | None:
    """The first run of three or more English words in ``text`` outside code (backticks, names
    with _ or digits, calls), or None."""
    # Python's own message, quoted once after its label, runs to the next Korean word
    text = re.sub(rf"{ORIGINAL_LABEL}: [^\uac00-\ud7a3]*", " ", text)
    plain = re.sub(r"`[^`]*`|\S*[_\d(=\[.]\S*", " ", text)
    words = [w for w in re.findall(r"[A-Za-z]+|[^\sA-Za-z]+", plain)]
    run = []
    for word in words:
        if word.isalpha() and word.isascii() and word.lower() not in ENGLISH_ALLOWED \
                and not word.isupper():
            run.append(word)
            if len(run) >= 3:
                return " ".join(run)
        elif word.strip():
            run = []
    return None


def test_english_sentence_finds_english_and_spares_code():
    assert english_sentence("[4 layers, slot 0 holding 35 tokens] 블록이 모자랍니다") == \
        "slot holding tokens"
    assert english_sentence("함수에서 예외가 발생했습니다: 인덱스 2가 2번 축의 크기 2를 "
                            "벗어났습니다 (영어 원문: IndexError: index 2 is out of bounds for "
                            "axis 2) (호출 인자 slot=0)") is None        # Python's own words
    assert english_sentence("함수에서 IndexError가 발생했습니다: index 2 is out of bounds for "
                            "axis 2 (호출 인자 slot=0)") is not None     # unlabelled, unexplained
    assert english_sentence("스레드 0이 `block_table[3]`을 읽었습니다") is None
    assert english_sentence("the loop reads every block") == "the loop reads"
    assert english_sentence("커널 출력이 torch 오라클과 같습니다 (head_dim 24, q 헤드 2개)") is None
