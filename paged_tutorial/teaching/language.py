"""The language the notebooks' puzzles, hints and verdicts speak: English (the default) or
Korean, the article's language.

Every text a learner reads from the checker is written in both languages, as a ``Text`` (kept
in a registry and shown later) or through ``say`` (built at grading time, e.g. a verdict that
names the wrong element).  ``set_language`` chooses once, at the top of a notebook; code,
identifiers and figures stay in English.

    from paged_tutorial.teaching.language import Text, say, set_language
    set_language("ko")
    print(Text(en="not yet", ko="아직 아닙니다"))        # 아직 아닙니다
    say(en=f"thread {t} read row {r}", ko=f"스레드 {particle(t, '이/가')} {r}번 행을 읽었습니다")
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass

LANGUAGES = {"en": "English", "ko": "한국어 (Korean)"}
_current = ["en"]
_pinned: list[str] = []


def set_language(code: str) -> str:
    """Choose the language of prompts, hints and verdicts: ``"en"`` or ``"ko"``.  Returns the
    code in use (while ``pinned``, the pinned one)."""
    if not isinstance(code, str) or code.lower() not in LANGUAGES:
        choices = ", ".join(f"{c!r} ({name})" for c, name in LANGUAGES.items())
        raise ValueError(f"set_language({code!r}): the checker speaks {choices}; pass one of "
                         f"those codes")
    if not _pinned:
        _current[0] = code.lower()
    return _current[0]


@contextmanager
def pinned(code: str):
    """Speak ``code`` inside the block whatever ``set_language`` is asked (a notebook graded
    in the language its grader chose); the language before it is restored after."""
    before = _current[0]
    set_language(code)
    _pinned.append(code)
    try:
        yield
    finally:
        _pinned.pop()
        _current[0] = before


def language() -> str:
    """The code of the language in use (``"en"`` until ``set_language`` says otherwise)."""
    return _current[0]


def say(en: str, ko: str) -> str:
    """``en`` or ``ko``, whichever the current language is."""
    return ko if _current[0] == "ko" else en


@dataclass(frozen=True)
class Text:
    """A text in both languages; ``str()`` gives the current one."""

    en: str
    ko: str

    def __post_init__(self):
        for code in LANGUAGES:
            value = getattr(self, code)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Text: the {LANGUAGES[code]} text is missing ({value!r}); "
                                 f"every learner-facing text needs both languages")

    def __str__(self) -> str:
        return say(self.en, self.ko)

    def in_language(self, code: str) -> str:
        if code not in LANGUAGES:
            raise ValueError(f"Text.in_language({code!r}): choose one of {sorted(LANGUAGES)}")
        return getattr(self, code)


#: the Korean terms every learner-facing text uses: English term -> (Korean term, variants a
#: Korean text must not use for it).  Code names stay as they are, in backticks where they stand
#: alone (`block_table`, `free_blocks`); docs/korean-review.md explains the choices.
GLOSSARY = {
    "the article": ("글", ("아티클",)),
    "block table": ("블록 테이블", ("block table", "블록 table", "표 항목", "글의 표")),
    "physical block": ("물리 블록", ("physical block",)),
    "logical block": ("논리 블록", ("logical block",)),
    "slot": ("슬롯", ()),
    "free list": ("빈 블록 목록", ("free list",)),
    "KV head": ("KV 헤드", ("kv 헤드", "kv head", "KV head")),
    "query head": ("q 헤드", ("query 헤드", "query head", "쿼리 헤드")),
    "warp": ("워프", ()),
    "lane": ("레인", ()),
    "shared memory": ("공유 메모리", ("shared memory",)),
    "barrier": ("배리어", ()),
    "race": ("경합(race)", ("경쟁 상태", "race 없", "race와", "race 검사")),
    "publish": ("공유 메모리에 올리다", ("publish",)),
    "prefill": ("프리필", ("prefill 스텝", "(prefill)")),
    "decode": ("디코드", ("decode 스텝", "(decode)")),
    "prefix caching": ("프리픽스 캐싱", ("prefix caching", "prefix cache")),
    "online softmax": ("온라인 소프트맥스", ("online softmax",)),
    "running max": ("누적 최댓값", ("running max", "최대값")),
    "logits": ("로짓", ("logits",)),
    "stride": ("보폭", ("stride",)),
    "sync (of the device table)": ("동기화", ()),
    "cache": ("캐시", ()),
    "stock engine": ("표준 엔진", ("기본 엔진",)),
    "your code": ("여기에 코드를 쓰세요", ("your code", "TODO")),
}

#: engine words that reach a verdict as data (a step's kind), with their Korean glossary terms
TERMS = {"prefill": "프리필", "decode": "디코드"}


def term(word: str) -> str:
    """``word``, an engine word such as a step's kind, in the current language: the Korean
    glossary term in Korean (``term("decode")`` is "디코드"), the word itself in English."""
    return TERMS.get(word, word) if _current[0] == "ko" else word


# -- Korean particles ------------------------------------------------------------------------
#: the particle pairs ``particle`` knows: the form after a final consonant, then the form after
#: a vowel (for 으로/로 a final ㄹ takes the vowel's form, 로)
PARTICLE_PAIRS = {"이/가": ("이", "가"), "은/는": ("은", "는"), "을/를": ("을", "를"),
                  "과/와": ("과", "와"), "으로/로": ("으로", "로"), "이다/다": ("이다", "다")}
_HANGUL_FIRST, _HANGUL_LAST, _FINALS = 0xAC00, 0xD7A3, 28
_RIEUL = 8                                           # the index of ㄹ among the final consonants
#: how Korean reads a digit's final sound: None (a vowel), "ㄹ", or "other" (another consonant)
_DIGIT_FINAL = {"0": "other", "1": "ㄹ", "2": None, "3": "other", "4": None, "5": None,
                "6": "other", "7": "ㄹ", "8": "ㄹ", "9": None}
#: Latin letters read by their names (엘, 알 end in ㄹ; 엠, 엔 in another consonant; 에이, 비,
#: 씨... in a vowel): a lone letter, and the last letter of an acronym in ``_ACRONYMS``
_LETTER_FINAL = {"l": "ㄹ", "r": "ㄹ", "m": "other", "n": "other"}
#: capitalised words read letter by letter (GPU 지피유); any other run of capitals is read as a word
_ACRONYMS = {"GPU", "CPU", "EOS", "KV", "ID", "LLM", "SM", "API", "CLI", "HF", "OK", "JIT"}
#: how the end of an English word sounds in Korean: (ending, final) pairs, the longest ending
#: that matches decides; a word that matches none ends in a vowel (헤드, 인덱스, 리스트, 컴퓨터)
_WORD_ENDINGS = (("check", None), ("ck", "other"), ("ng", "other"), ("ype", "other"),
                 ("at", "other"), ("oat", None), ("et", "other"), ("ot", "other"),
                 ("oot", None), ("ut", "other"),
                 ("oop", None), ("ap", "other"), ("ep", "other"), ("ip", "other"),
                 ("op", "other"), ("up", "other"), ("ab", "other"), ("eb", "other"),
                 ("ock", "other"), ("ack", "other"), ("ick", "other"),
                 ("le", "ㄹ"), ("l", "ㄹ"), ("me", "other"), ("ne", "other"), ("m", "other"),
                 ("n", "other"))
#: what a word's ending may carry that Korean does not read aloud
_SILENT_TAIL = " \t\n`'\"]}*.,:;!?_"


def _before_parenthesis(text: str):
    """``text`` without its closing parenthetical, or None when ``text`` does not end in one."""
    if not text.endswith(")"):
        return None
    depth = 0
    for at in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[at], 0)
        if depth == 0:
            return text[:at].rstrip()
    return None


def _latin_final(text: str):
    """The final sound of the Latin word ``text`` ends in, as Korean reads it."""
    word = re.search(r"[A-Za-z]+$", text).group()
    if len(word) == 1 or word in _ACRONYMS:
        return _LETTER_FINAL.get(word[-1].lower())
    if len(word) > 1 and word.isupper() and len(word) <= 3 and not set(word) & set("AEIOU"):
        return _LETTER_FINAL.get(word[-1].lower())       # no vowel to read: spelled out
    lower = word.lower()
    for ending, final in sorted(_WORD_ENDINGS, key=lambda pair: -len(pair[0])):
        if lower.endswith(ending):
            return final
    return None


def _final_sound(word: str):
    """The final sound of ``word`` as Korean reads it: None (a vowel), "ㄹ" or "other".  A
    closing parenthetical is an aside: the word before it decides (``K(케이)``, ``스레드 0 (행
    3)``); a bracket is read by what it holds, its last item."""
    text = word.rstrip(_SILENT_TAIL) or word
    before = _before_parenthesis(text)
    if before is not None:
        return _final_sound(before or text[1:-1])
    text = text.rstrip(_SILENT_TAIL) or text
    last = text[-1:]
    if not last:
        return None
    code = ord(last)
    if _HANGUL_FIRST <= code <= _HANGUL_LAST:
        final = (code - _HANGUL_FIRST) % _FINALS
        return None if final == 0 else ("ㄹ" if final == _RIEUL else "other")
    if last.isdigit() and last in _DIGIT_FINAL:
        digits = len(text) - len(text.rstrip("0123456789"))
        number = text[-digits:]
        if last == "0" and number.strip("0"):
            return "other"                       # 십, 백, 천, 만: every round number ends in one
        return _DIGIT_FINAL[last]
    if last.isascii() and last.isalpha():
        return _latin_final(text)
    return None


def particle(word: str, pair: str) -> str:
    """``word`` followed by the form of the particle ``pair`` its final sound takes:
    ``particle("스레드 0", "이/가")`` is "스레드 0이" (영), ``particle("스레드 2", "이/가")`` is
    "스레드 2가" (이), ``particle("1-31", "으로/로")`` is "1-31로" (일).  Digits and Latin letters
    are read as Korean reads them; a range by its last number; ``pair`` is one of
    ``PARTICLE_PAIRS``."""
    if pair not in PARTICLE_PAIRS:
        raise ValueError(f"particle({word!r}, {pair!r}): the pair must be one of "
                         f"{', '.join(PARTICLE_PAIRS)}")
    after_consonant, after_vowel = PARTICLE_PAIRS[pair]
    final = _final_sound(str(word))
    if final is None or (final == "ㄹ" and pair == "으로/로"):
        return f"{word}{after_vowel}"
    return f"{word}{after_consonant}"
