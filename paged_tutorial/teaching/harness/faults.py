"""Whose fault an exception is: the checker's own code, or the learner's.

An exception that reaches a puzzle's runner was raised somewhere along its traceback.  When
one of the frames runs her code (a function from her notebook or her file, anything outside
the package and the installed libraries), it happened while her code ran and the verdict is
hers to read.  When none does and the frame that raised it is the checker's own
(``paged_tutorial/teaching/``), the checker failed by itself: the verdict says so, shows the
checker's traceback, and does not call her answer wrong.
"""

from __future__ import annotations

import importlib.metadata
import site
import sys
import sysconfig
import traceback
from functools import lru_cache
from pathlib import Path

from paged_tutorial.teaching.language import particle, say

#: the package's folder, and the checker's folder inside it
PACKAGE_DIR = Path(__file__).resolve().parents[2]
CHECKER_DIR = PACKAGE_DIR / "teaching"
#: answers the package itself ships (the mistakes a chapter demonstrates, the worked
#: solutions): graded like hers, so their frames count as an answer's, not the checker's
ANSWER_FILES = (CHECKER_DIR / "harness" / "mistakes.py",
                CHECKER_DIR / "exercises" / "solutions.py")
#: how many of the checker's frames a fault report shows, innermost last
SHOWN_FRAMES = 6


def _library_dirs() -> tuple[Path, ...]:
    """Folders of the interpreter's own modules and the installed libraries."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    found.update(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib",
                                                            "purelib", "platlib"))
    found.update(site.getsitepackages())
    return tuple(Path(p).resolve() for p in found if p)


_LIBRARIES = _library_dirs()


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


@lru_cache(maxsize=1)
def _installed_names() -> frozenset[str]:
    """Top-level names that installed distributions provide (numpy, torch, ...), wherever on
    ``sys.path`` they were installed (a ``--target`` folder on PYTHONPATH too)."""
    return frozenset(importlib.metadata.packages_distributions())


def _installed_elsewhere(path: Path) -> bool:
    """Whether ``path`` lies in a distribution installed into a folder of ``sys.path`` that
    is not one of the interpreter's own (``_LIBRARIES``)."""
    for entry in sys.path:
        try:
            folder = Path(entry or ".").resolve()
        except (OSError, ValueError):
            continue
        if path != folder and _within(path, folder):
            top = path.relative_to(folder).parts[0]
            if top.removesuffix(".py") in _installed_names():
                return True
    return False


def origin(filename: str) -> str:
    """Whose code a frame of ``filename`` runs: "checker" (``paged_tutorial/teaching``),
    "package" (the rest of the package), "library" (the interpreter, installed libraries,
    frozen modules) or "learner" (anything else: a notebook cell, her own file, or an answer
    the package ships: ``ANSWER_FILES``)."""
    if filename.startswith("<frozen") or filename.startswith("<__array_function__"):
        return "library"
    try:
        path = Path(filename).resolve()
    except (OSError, ValueError):
        return "learner"
    if path in ANSWER_FILES:
        return "learner"
    if _within(path, CHECKER_DIR):
        return "checker"
    if _within(path, PACKAGE_DIR):
        return "package"
    if any(_within(path, folder) for folder in _LIBRARIES) or _installed_elsewhere(path):
        return "library"
    return "learner"


def _frames(exc: BaseException):
    return list(traceback.extract_tb(exc.__traceback__))


def is_checker_fault(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by the checker's own code with none of hers on the way: no
    frame of its traceback runs the learner's code, and the innermost frame of the package's
    runs the checker's."""
    frames = _frames(exc)
    origins = [origin(frame.filename) for frame in frames]
    if "learner" in origins:
        return False
    ours = [o for o in origins if o in ("checker", "package")]
    return bool(ours) and ours[-1] == "checker"


def checker_traceback(exc: BaseException) -> str:
    """The innermost frames of ``exc``'s traceback, as Python prints them, and its line."""
    frames = _frames(exc)[-SHOWN_FRAMES:]
    lines = traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip()


def checker_fault_message(exc: BaseException, function_name: str) -> str:
    """The verdict's text for a fault of the checker's own: not her answer's, with the
    checker's traceback."""
    trace = checker_traceback(exc)
    return say(en=f"the checker itself failed while grading {function_name}: "
                  f"{type(exc).__name__} was raised in the checker's own code, not in yours.  "
                  "This is a bug in the checker, so nothing was graded and your answer is "
                  "neither right nor wrong yet; please report it with this traceback:\n"
                  f"{trace}",
               ko=f"{particle(function_name, '을/를')} 채점하던 채점기 자신이 실패했습니다: "
                  f"예외 {particle(type(exc).__name__, '이/가')} 여러분의 코드가 아니라 채점기의 코드에서 "
                  "발생했습니다.  채점기의 버그이므로 아무것도 채점되지 않았고, 답은 아직 맞지도 "
                  "틀리지도 않았습니다.  아래의 트레이스백(영어 원문)과 함께 알려 주세요:\n"
                  f"{trace}")
