"""The puzzle answers the learner got right, remembered so that later notebooks can use them.

``check`` remembers a puzzle's function when its verdict is correct (``remember``); the
closing kernel notebook asks for them back (``solved``) and assembles her kernel from them
(``your_kernel.py``).  Each notebook runs in its own Python process, so a remembered function
is also written down as its source code, one file per puzzle, in a folder of the user's
(``store_folder()``: ``$PAGED_TUTORIAL_SOLVED``, else ``solved`` in the folder of her records,
``~/.cache/paged_tutorial/solved`` by default, beside ``progress.json``); another process
rebuilds it from there.  A file is written whole or not at all (a temporary file renamed over
it), under its file lock (``record_lock.py``), so two notebooks solving the same puzzle at
once leave one whole answer.  A file that no longer holds one function (edited, truncated, damaged) is reported with
its path and the way out (``SolvedFileError``), never as a bare ``SyntaxError``.  A function
whose source cannot be read (typed at a plain Python prompt) is remembered in this process
only.

``clear()`` forgets everything, here and in the folder.
"""

from __future__ import annotations

import inspect
import math
import os
import textwrap
from pathlib import Path
from typing import Callable

from paged_tutorial.teaching.error_text import exception_text
from paged_tutorial.teaching.exercises.progress import records_folder, write_atomically
from paged_tutorial.teaching.exercises.record_lock import held
from paged_tutorial.teaching.language import particle, say
from paged_tutorial.teaching.time_limit import TimeLimitExceeded, time_limit

_REMEMBERED: dict[str, Callable] = {}
#: rebuilding a remembered answer defines one function; a file that runs longer is not one
REBUILD_LIMIT_S = 10.0


class SolvedFileError(ValueError):
    """A file of the solved store that does not hold one function: ``path`` says which."""

    def __init__(self, path: Path, problem: str):
        self.path = path
        super().__init__(say(
            en=f"the remembered answer {path} cannot be used: {problem}.  Delete that file and "
               f"check the puzzle {path.stem} again in its notebook (a right answer is written "
               "afresh), or fix the file by hand",
            ko=f"기억된 답 {particle(str(path), '을/를')} 쓸 수 없습니다: {problem}.  그 파일을 "
               f"지우고 노트북에서 퍼즐 {particle(path.stem, '을/를')} 다시 `check`로 채점하세요 (맞힌 답은 새로 기록됩니다). "
               f"또는 파일을 "
               "직접 고치세요"))


def store_folder() -> Path:
    """Where remembered answers are written: ``$PAGED_TUTORIAL_SOLVED``, else ``solved`` in
    the folder of her records (``progress.records_folder()``)."""
    folder = os.environ.get("PAGED_TUTORIAL_SOLVED")
    return Path(folder) if folder else records_folder() / "solved"


def _file_of(name: str) -> Path:
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"solved: {name!r} is not a puzzle name (like '03.k_index')")
    return store_folder() / f"{name}.py"


def _source_of(fn: Callable) -> str | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    if not source.lstrip().startswith("def "):          # a lambda or a decorated function
        return None
    return source


def remember(name: str, fn: Callable) -> None:
    """Remember ``fn`` as the learner's right answer to puzzle ``name``: in this process, and
    as source code in ``store_folder()`` when its source can be read."""
    if not callable(fn):
        raise TypeError(f"solved.remember({name!r}, ...): expected the function, got "
                        f"{type(fn).__name__}")
    path = _file_of(name)
    _REMEMBERED[name] = fn
    source = _source_of(fn)
    if source is None:
        return
    try:
        with held(path):
            write_atomically(path, f"# {name}: {fn.__name__}, remembered when its verdict was "
                                   f"correct\n{source}")
    except OSError:                                      # a read-only home: this process only
        pass


def solved(name: str) -> Callable | None:
    """The learner's right answer to puzzle ``name`` (remembered in this process, or rebuilt
    from the source another notebook wrote down), or None while it is not solved."""
    if name in _REMEMBERED:
        return _REMEMBERED[name]
    path = _file_of(name)
    if not path.is_file():
        return None
    try:
        source = path.read_text(encoding="utf-8")
        with time_limit(REBUILD_LIMIT_S):
            fn = rebuild(source, str(path))
    except TimeLimitExceeded:
        raise SolvedFileError(path, say(en=f"running it took more than {REBUILD_LIMIT_S:g} s",
                                        ko=f"실행에 {REBUILD_LIMIT_S:g}초 넘게 걸립니다")) from None
    except (Exception, SystemExit) as exc:
        raise SolvedFileError(path, exception_text(exc)) from None
    _REMEMBERED[name] = fn
    return fn


def rebuild(source: str, filename: str = "<solved>") -> Callable:
    """The function defined by ``source``, with the names the notebooks import in reach
    (``math``, ``np``, and Numba's ``cuda``, ``float32``, ``int32``).  The kernel builder gives
    a kernel part the names of its own build (``load``, the layout constants, the other parts)
    when it compiles it."""
    import numpy as np
    from numba import cuda, float32, int32

    namespace = {"__name__": "paged_tutorial_solved", "math": math, "np": np, "numpy": np,
                 "cuda": cuda, "float32": float32, "int32": int32}
    exec(compile(source, filename, "exec"), namespace)
    functions = [v for v in namespace.values()
                 if inspect.isfunction(v) and v.__module__ == "paged_tutorial_solved"]
    if len(functions) != 1:
        raise ValueError(f"{filename}: expected one function, found {len(functions)}")
    return functions[0]


def names() -> list[str]:
    """Every puzzle remembered as solved, here or in ``store_folder()``, sorted."""
    found = set(_REMEMBERED)
    folder = store_folder()
    if folder.is_dir():
        found |= {p.name[:-3] for p in folder.glob("*.py")}
    return sorted(found)


def clear() -> None:
    """Forget every remembered answer, in this process and in ``store_folder()``."""
    _REMEMBERED.clear()
    folder = store_folder()
    if folder.is_dir():
        for path in folder.glob("*.py"):
            with held(path):
                path.unlink(missing_ok=True)
