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
