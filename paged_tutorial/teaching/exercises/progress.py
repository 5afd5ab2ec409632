"""Which exercises and puzzles the reader has solved: every verdict ``check`` prints is kept
here, in this process and in a small record file, so that ``progress()``
(``notebook_grading.py``) can show every chapter's table from any notebook (each notebook runs
in its own kernel).

The record file is JSON, ``{name: {"status": ..., "line": first line of the verdict}}``.  A
solved item stays solved: once a name's verdict is correct, a later wrong try does not replace
it but is noted beside it (``"later"``), and a later correct one replaces it.  Both of her
records, this file and the remembered answers (``solved.py``), live in one folder of the
user's cache (``records_folder()``: ``$XDG_CACHE_HOME/paged_tutorial``, by default
``~/.cache/paged_tutorial``); the environment variable ``PAGED_TUTORIAL_PROGRESS`` names
another file, or turns the file off with ``off``.

Every change is a read, a change and a write under a file lock (``<file>.lock``,
``record_lock.py``), written to a
temporary file and renamed over the record, so notebooks writing at once lose nothing and a
reader never sees half a file.  A record that is not what this module writes is never a
crash: a file that is not JSON (or not an object) is set aside as ``<file>.corrupt`` and a new
one begun; an entry of the wrong shape is left out; each with a note that ``progress()``
prints.  A record that cannot be written (a read-only home) is skipped: grading never fails
for it.
"""

from __future__ import annotations

import json
import os
import tempfile
import unicodedata
from contextlib import contextmanager
from pathlib import Path

from paged_tutorial.teaching.exercises.record_lock import held
from paged_tutorial.teaching.language import Text, particle, say

_SEEN: dict[str, dict] = {}
_COLLECTORS: list[dict] = []

STATUS = {"correct": Text(en="solved", ko="풀었음"),
          "revealed": Text(en="revealed, not solved", ko="풀이를 봄, 풀지 않음"),
          "wrong": Text(en="not yet", ko="아직"),
          "unsolved": Text(en="not yet", ko="아직"),
          None: Text(en="not tried", ko="시도 안 함")}
#: the statuses a verdict can have
STATUSES = ("correct", "wrong", "unsolved", "revealed")
#: puzzles whose worked solution ``reveal`` handed out in this process before they were solved
_REVEALED: set[str] = set()


def records_folder() -> Path:
    """The folder of both of her records: ``$XDG_CACHE_HOME/paged_tutorial`` (by default
    ``~/.cache/paged_tutorial``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "paged_tutorial"


def record_file() -> Path | None:
    """Where verdicts are kept between processes, or None when the file is turned off."""
    chosen = os.environ.get("PAGED_TUTORIAL_PROGRESS")
    if chosen:
        return None if chosen.lower() == "off" else Path(chosen)
    return records_folder() / "progress.json"


def entry_problem(name, entry) -> str | None:
    """What is wrong with one entry of the record file, or None when it is one this module
    writes."""
    if not isinstance(name, str) or not name:
        return say(en=f"the entry named {name!r} is not an exercise name",
                   ko=f"{name!r} 항목은 연습문제 이름이 아닙니다")
    if not isinstance(entry, dict):
        return say(en=f"the entry {name!r} is {json.dumps(entry)[:40]}, not "
                      '{"status": ..., "line": ...}',
                   ko=f"{name!r} 항목이 {json.dumps(entry)[:40]}입니다 "
                      '({"status": ..., "line": ...}이어야 합니다)')
    if entry.get("status") not in STATUSES:
        return say(en=f"the entry {name!r} has status {entry.get('status')!r}; a status is one "
                      f"of {', '.join(STATUSES)}",
                   ko=f"{name!r} 항목의 상태가 {entry.get('status')!r}입니다; 상태는 "
                      f"{', '.join(STATUSES)} 중 하나입니다")
    if not isinstance(entry.get("line"), str):
        return say(en=f"the entry {name!r} has no verdict line (\"line\")",
                   ko=f"{name!r} 항목에 채점 결과 줄(\"line\")이 없습니다")
    if not isinstance(entry.get("later", ""), str):
        return say(en=f"the entry {name!r} has a \"later\" that is not text",
                   ko=f"{name!r} 항목의 \"later\"가 문자열이 아닙니다")
    return None


def read_record(path: Path | None) -> tuple[dict, list[str]]:
    """The entries of the record file that are well formed, and a note for everything else
    (a file that is not JSON, or not an object; each entry left out)."""
    if path is None or not path.is_file():
        return {}, []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {}, [say(en=f"the progress record {path} cannot be read ({type(exc).__name__}); "
                           "it is set aside as .corrupt and a new record begun at the next "
                           "verdict",
                        ko=f"진행 기록 {particle(str(path), '을/를')} 읽을 수 없습니다 "
                           f"({type(exc).__name__}); 다음 채점 때 .corrupt로 옮겨 두고 새 "
                           "기록을 시작합니다")]
    if not isinstance(data, dict):
        return {}, [say(en=f"the progress record {path} holds a JSON {type(data).__name__}, not "
                           "an object of verdicts; it is set aside as .corrupt and a new record "
                           "begun at the next verdict",
                        ko=f"진행 기록 {path}에 채점 결과 객체가 아니라 JSON "
                           f"{particle(str(type(data).__name__), '이/가')} 있습니다; "
                           f"다음 채점 때 .corrupt로 옮겨 두고 "
                           "새 기록을 시작합니다")]
    entries, notes = {}, []
    for name, entry in data.items():
        problem = entry_problem(name, entry)
        if problem is None:
            entries[name] = entry
        else:
            notes.append(say(en=f"progress record {path}: {problem}: left out",
                             ko=f"진행 기록 {path}: {problem}: 빼고 봅니다"))
    return entries, notes


def _read(path: Path | None) -> dict:
    return read_record(path)[0]


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                         dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with _quietly():
            os.unlink(temporary)
        raise


@contextmanager
def _quietly():
    try:
        yield
    except OSError:
        pass


def merged(old: dict | None, new: dict) -> dict:
    """The entry to keep when ``new`` follows ``old``: a correct verdict stays, with a later
    try that is not correct noted beside it."""
    if old and old.get("status") == "correct" and new["status"] != "correct":
        return {**old, "later": new["line"]}
    return new


def _save(path: Path, name: str, entry: dict) -> None:
    with held(path):
        saved, notes = read_record(path)
        if notes and not saved and path.is_file():
            # not ours to overwrite: keep what was there for her to look at
            os.replace(path, path.with_name(path.name + ".corrupt"))
        saved[name] = merged(saved.get(name), entry)
        write_atomically(path, json.dumps(saved, ensure_ascii=False, indent=1, sort_keys=True))


def record(name: str, verdict) -> None:
    """Keep ``verdict`` as the newest of ``name`` (called by ``check`` for every verdict)."""
    entry = {"status": verdict.status, "line": first_line(verdict.message)}
    _SEEN[name] = merged(_SEEN.get(name), entry)
    for collected in _COLLECTORS:
        collected[name] = entry
    path = record_file()
    if path is None:
        return
    try:
        _save(path, name, entry)
    except OSError:
        pass


def mark_revealed(name: str) -> None:
    """Note that ``reveal`` showed puzzle ``name``'s worked solution: unless she had already
    solved it, a right answer checked from now on is recorded as revealed, not solved."""
    if (_SEEN.get(name) or {}).get("status") == "correct" or \
            (_read(record_file()).get(name) or {}).get("status") == "correct":
        return
    _REVEALED.add(name)
    record(name, _Revealed())


def was_revealed(name: str) -> bool:
    """Whether puzzle ``name``'s worked solution was revealed before she solved it (in this
    process, or kept in the record file)."""
    if name in _REVEALED:
        return True
    return (_read(record_file()).get(name) or {}).get("status") == "revealed"


class _Revealed:
    """The record's entry for a puzzle whose worked solution was revealed."""

    status = "revealed"

    @property
    def message(self) -> str:
        return say(en="the worked solution was revealed (pt.exercises.reveal) before this "
                      "puzzle was solved",
                   ko="퍼즐을 풀기 전에 풀이 예시를 보았습니다 (pt.exercises.reveal)")


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


def known_with_notes() -> tuple[dict[str, dict], list[str]]:
    """The newest verdict of every name (the record file's, then this process's, a solved one
    kept), and the notes on what of the file was left out."""
    saved, notes = read_record(record_file())
    verdicts = dict(saved)
    for name, entry in _SEEN.items():
        verdicts[name] = entry if name not in saved else _newer(saved[name], entry)
    return verdicts, notes


def _newer(saved: dict, mine: dict) -> dict:
    """This process's entry over the file's, except that a solved one stays solved."""
    if saved.get("status") == "correct" and mine.get("status") != "correct":
        return {**saved, "later": mine.get("later") or mine["line"]}
    return mine


def known() -> dict[str, dict]:
    """The newest verdict of every name: the record file's, then this process's."""
    return known_with_notes()[0]


def _padded(text: str, width: int) -> str:
    """``text`` padded to ``width`` columns as a terminal shows it (Hangul takes two)."""
    shown = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(width - shown, 0)


def table(names: list[str], verdicts: dict[str, dict]) -> str:
    """A text table: one row per name, its status and its verdict's first line (a later try
    of a solved one noted after it)."""
    width = max([len(n) for n in names] + [4])
    head = say(en="exercise / puzzle", ko="연습문제 / 퍼즐")
    rows = [f"{_padded(head, width)}  {_padded(say(en='status', ko='상태'), 10)}  "
            f"{say(en='verdict', ko='채점 결과')}"]
    for name in names:
        entry = verdicts.get(name)
        status = str(STATUS[entry["status"] if entry else None])
        line = entry["line"] if entry else ""
        if entry and entry.get("later"):
            line += say(en=f"  (a later try: {entry['later']})",
                        ko=f"  (나중 시도: {entry['later']})")
        rows.append(f"{_padded(name, width)}  {_padded(status, 10)}  {line}".rstrip())
    return "\n".join(rows)
