"""The language the notebooks' puzzles, hints and verdicts speak: English (the default) or
Korean, the article's language.

Every text a learner reads from the checker is written in both languages, as a ``Text`` (kept
in a registry and shown later) or through ``say`` (built at grading time, e.g. a verdict that
names the wrong element).  ``set_language`` chooses once, at the top of a notebook; code,
identifiers and figures stay in English.

    from paged_tutorial.teaching.language import Text, say, set_language
    set_language("ko")
    print(Text(en="not yet", ko="아직 아닙니다"))        # 아직 아닙니다
    say(en=f"thread {t} read row {r}", ko=f"스레드 {t}가 {r}번 행을 읽었습니다")
"""

from __future__ import annotations

from dataclasses import dataclass

LANGUAGES = {"en": "English", "ko": "한국어 (Korean)"}
_current = ["en"]


def set_language(code: str) -> str:
    """Choose the language of prompts, hints and verdicts: ``"en"`` or ``"ko"``.  Returns the
    code chosen."""
    if not isinstance(code, str) or code.lower() not in LANGUAGES:
        choices = ", ".join(f"{c!r} ({name})" for c, name in LANGUAGES.items())
        raise ValueError(f"set_language({code!r}): the checker speaks {choices}; pass one of "
                         f"those codes")
    _current[0] = code.lower()
    return _current[0]


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
#: Latin letters as Korean reads them (엘, 엠, 엔, 알 end in a consonant; 에이, 비, 씨... do not)
_LETTER_FINAL = {"l": "ㄹ", "r": "ㄹ", "m": "other", "n": "other"}
#: what a word's ending may carry that Korean does not read aloud
_SILENT_TAIL = " \t\n`'\")]}*.,:;!?_"


def _final_sound(word: str):
    """The final sound of ``word`` as Korean reads it: None (a vowel), "ㄹ" or "other"."""
    text = word.rstrip(_SILENT_TAIL) or word
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
    return _LETTER_FINAL.get(last.lower())


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
