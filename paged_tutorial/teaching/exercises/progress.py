"""Which exercises and puzzles the reader has solved: every verdict ``check`` prints is kept
here, in this process and in a small record file, so that ``progress()``
(``notebook_grading.py``) can show every chapter's table from any notebook (each notebook runs
in its own kernel).

The record file is JSON, ``{name: {"status": ..., "line": first line of the verdict}}``, the
newest verdict of each name.  It lives in the user's cache folder
(``$XDG_CACHE_HOME/paged-tutorial/progress.json``, by default ``~/.cache/...``); the environment
variable ``PAGED_TUTORIAL_PROGRESS`` names another file, or turns the file off with ``off``.
A record that cannot be written (a read-only home) is skipped: grading never fails for it.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

from paged_tutorial.teaching.language import Text, say

_SEEN: dict[str, dict] = {}
_COLLECTORS: list[dict] = []

STATUS = {"correct": Text(en="solved", ko="풀었음"),
          "wrong": Text(en="not yet", ko="아직"),
          "unsolved": Text(en="not yet", ko="아직"),
          None: Text(en="not tried", ko="시도 안 함")}


def record_file() -> Path | None:
    """Where verdicts are kept between processes, or None when the file is turned off."""
    chosen = os.environ.get("PAGED_TUTORIAL_PROGRESS")
    if chosen:
        return None if chosen.lower() == "off" else Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "paged-tutorial" / "progress.json"


def _read(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(name: str, verdict) -> None:
    """Keep ``verdict`` as the newest of ``name`` (called by ``check`` for every verdict)."""
    entry = {"status": verdict.status, "line": first_line(verdict.message)}
    _SEEN[name] = entry
    for collected in _COLLECTORS:
        collected[name] = entry
    path = record_file()
    if path is None:
        return
    try:
        saved = _read(path)
        saved[name] = entry
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(saved, ensure_ascii=False, indent=1, sort_keys=True))
    except OSError:
        pass


@contextmanager
def collecting():
    """Within the ``with`` block, every verdict is also put in the dict it yields."""
    collected: dict[str, dict] = {}
    _COLLECTORS.append(collected)
    try:
        yield collected
    finally:
        _COLLECTORS.remove(collected)


def first_line(message: str, width: int = 90) -> str:
    line = message.strip().splitlines()[0] if message.strip() else ""
    return line if len(line) <= width else line[:width - 3] + "..."


def known() -> dict[str, dict]:
    """The newest verdict of every name: the record file's, then this process's."""
    return {**_read(record_file()), **_SEEN}


def table(names: list[str], verdicts: dict[str, dict]) -> str:
    """A text table: one row per name, its status and its verdict's first line."""
    width = max([len(n) for n in names] + [4])
    head = say(en="exercise / puzzle", ko="연습문제 / 퍼즐")
    rows = [f"{head:<{width}}  {say(en='status', ko='상태'):<10}  "
            f"{say(en='verdict', ko='채점 결과')}"]
    for name in names:
        entry = verdicts.get(name)
        status = str(STATUS[entry["status"] if entry else None])
        rows.append(f"{name:<{width}}  {status:<10}  {entry['line'] if entry else ''}")
    return "\n".join(rows)
