"""Grade a reader's own notebook: run its code cells as she left them, in order, in a fresh
namespace, and collect the verdict of every ``check(...)`` they call; and ``progress()``, the
same table for every chapter from the verdicts kept (``progress.py``).

    pt.exercises.grade_notebook("notebooks/06_block_lifetime.ipynb")
    python -m paged_tutorial.teaching.exercises grade notebooks/06_block_lifetime.ipynb

Cells run with the notebook's folder as the working directory and their printed output
hidden; shell and magic lines (``!pip ...``, ``%matplotlib``) are skipped; a cell that raises
is reported and the next cells still run.  A cell that ends the program (``sys.exit``,
``raise SystemExit``, ``exit()``, ``os._exit``, ``os.abort``) or is interrupted stops the
grading there: the notebook is reported as stopped at that cell and is not all solved; a cell
still running after ``CELL_LIMIT_S`` is stopped the same way.  The chapter's exercises and
puzzles are the names that start with the notebook's two digits; one that no cell checked is
"not tried".  A file that is not a notebook (not JSON, not an object with a list of cells, a
cell without a ``cell_type``) raises ``NotANotebook`` naming the file.  The language chosen by
the caller is restored afterwards.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from paged_tutorial.teaching.exercises.progress import collecting, known_with_notes, table
from paged_tutorial.teaching.exercises.registry import names as all_names
from paged_tutorial.teaching.error_text import exception_text
from paged_tutorial.teaching.language import language, particle, pinned, say, set_language
from paged_tutorial.teaching.time_limit import TimeLimitExceeded, time_limit

#: a cell of a chapter notebook runs for seconds to a minute or two in the simulator; one still
#: running after this long is stuck
CELL_LIMIT_S = 900.0


class NotANotebook(ValueError):
    """The file given is not a Jupyter notebook this grader can run."""


class _ProcessExit(SystemExit):
    """``os._exit`` or ``os.abort`` called by a cell while it is graded."""


@dataclass
class NotebookGrade:
    """What ``grade_notebook`` found: every verdict by name, and the cells that raised."""

    path: Path
    names: list[str]
    verdicts: dict[str, dict]
    errors: list[str] = field(default_factory=list)
    stopped: str | None = None          # why the run stopped before its last cell

    @property
    def all_solved(self) -> bool:
        return self.stopped is None and bool(self.names) and all(
            self.verdicts.get(n, {}).get("status") == "correct" for n in self.names)

    def summary(self) -> str:
        done = sum(1 for n in self.names if self.verdicts.get(n, {}).get("status") == "correct")
        lines = [say(en=f"{self.path.name}: {done} of {len(self.names)} solved",
                     ko=f"{self.path.name}: {len(self.names)}개 중 {done}개 풀었음"),
                 table(self.names, self.verdicts)]
        lines += self.errors
        if self.stopped:
            lines.append(self.stopped)
        return "\n".join(lines)


def _python_only(source: str) -> str:
    """The cell without IPython-only lines (shell escapes and magics)."""
    kept = []
    for line in source.splitlines():
        stripped = line.lstrip()
        kept.append("" if stripped.startswith(("!", "%")) else line)
    return "\n".join(kept)


def _chapter(path: Path) -> str:
    match = re.match(r"(\d{2})_", path.name)
    if not match:
        raise ValueError(say(
            en=f"{path.name}: a chapter notebook is named NN_title.ipynb (e.g. "
               "06_block_lifetime.ipynb); rename it or pass the chapter's notebook",
            ko=f"{path.name}: 장 노트북의 이름은 NN_제목.ipynb 꼴입니다 (예: "
               "06_block_lifetime.ipynb); 이름을 바꾸거나 장의 노트북을 넘기세요"))
    return match.group(1)


def _text_of(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as inner:
        return f"<its message raised {type(inner).__name__}>"


def read_cells(path: Path) -> list[str]:
    """The sources of the notebook's code cells; ``NotANotebook`` naming the file and what is
    wrong with it otherwise."""
    def refuse(en: str, ko: str) -> NotANotebook:
        return NotANotebook(say(en=f"{path.name}: not a notebook: {en}; pass the chapter's "
                                   ".ipynb file as Jupyter saved it",
                                ko=f"{path.name}: 노트북이 아닙니다: {ko}; Jupyter가 저장한 "
                                   "장의 .ipynb 파일을 넘기세요"))
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise refuse(f"its bytes are not UTF-8 text (byte {exc.start})",
                     f"바이트가 UTF-8 텍스트가 아닙니다 (바이트 {exc.start})") from None
    except ValueError as exc:
        line = getattr(exc, "lineno", "?")
        raise refuse(f"its text is not JSON (line {line}: {getattr(exc, 'msg', exc)})",
                     f"내용이 JSON이 아닙니다 ({line}번 줄: {getattr(exc, 'msg', exc)})") from None
    except OSError as exc:
        raise refuse(f"it cannot be read ({exc.strerror or exc})",
                     f"읽을 수 없습니다 ({exc.strerror or exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        kind = type(data).__name__ if not isinstance(data, dict) else "object without cells"
        raise refuse(f"it holds a JSON {kind}, not an object with a list of cells",
                     f"셀 목록이 있는 객체가 아니라 JSON {kind}입니다")
    sources = []
    for number, cell in enumerate(data["cells"], 1):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise refuse(f"cell {number} has no cell_type",
                         f"{number}번 셀에 cell_type이 없습니다")
        if cell["cell_type"] != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(part, str) for part in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise refuse(f"cell {number}'s source is not text",
                         f"{number}번 셀의 source가 문자열이 아닙니다")
        sources.append(source)
    return sources


@contextlib.contextmanager
def _process_exits_caught():
    """``os._exit`` and ``os.abort`` raise ``_ProcessExit`` in the block instead of ending the
    grader's process."""
    originals = os._exit, os.abort

    def leave(code=0):
        raise _ProcessExit(code)

    def abort():
        raise _ProcessExit("abort")
    os._exit, os.abort = leave, abort
    try:
        yield
    finally:
        os._exit, os.abort = originals


def _stop_message(number: int, exc: BaseException) -> str:
    if isinstance(exc, TimeLimitExceeded):
        return say(en=f"stopped at code cell {number}: it was still running after "
                      f"{CELL_LIMIT_S:g} s (a loop that never ends?); the cells after it did not "
                      "run",
                   ko=f"코드 셀 {number}에서 멈췄습니다: {CELL_LIMIT_S:g}초가 지나도 끝나지 "
                      "않았습니다 (끝나지 않는 루프?); 그 뒤의 셀은 실행되지 않았습니다")
    if isinstance(exc, KeyboardInterrupt):
        return say(en=f"stopped at code cell {number}: it was interrupted (KeyboardInterrupt); "
                      "the cells after it did not run",
                   ko=f"코드 셀 {number}에서 멈췄습니다: 중단되었습니다 (KeyboardInterrupt); 그 "
                      "뒤의 셀은 실행되지 않았습니다")
    call = (f"os._exit({exc.code!r})" if exc.code != "abort" else "os.abort()") \
        if isinstance(exc, _ProcessExit) else f"sys.exit({exc.code!r}) (SystemExit)"
    return say(en=f"stopped at code cell {number}: it called {call}, which would end the "
                  "notebook's kernel; the cells after it did not run, so the notebook is not "
                  "graded as solved",
               ko=f"코드 셀 {number}에서 멈췄습니다: 셀이 {particle(str(call), '을/를')} 호출해 노트북 커널을 끝내려 "
                  "했습니다; 그 뒤의 셀은 실행되지 않았으므로 다 푼 것으로 채점하지 않습니다")


def run_notebook(path: str | os.PathLike, language_code: str | None = None) -> NotebookGrade:
    """Run the notebook's code cells in a fresh namespace and collect its verdicts;
    ``language_code`` pins the language of every verdict (else the notebook's own choice)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(say(
            en=f"no notebook at {path}: pass the path of an .ipynb file",
            ko=f"{path}에 노트북이 없습니다: .ipynb 파일 경로를 넘기세요"))
    chapter = _chapter(path)
    sources = read_cells(path)
    namespace: dict = {"__name__": "__main__"}
    errors: list[str] = []
    stopped = None
    spoken, here = language(), os.getcwd()
    import matplotlib

    matplotlib.use("Agg")
    speaking = pinned(language_code) if language_code else contextlib.nullcontext()
    try:
        os.chdir(path.resolve().parent)
        with collecting() as verdicts, speaking, _process_exits_caught():
            for number, source in enumerate(sources, 1):
                source = _python_only(source)
                try:
                    with contextlib.redirect_stdout(io.StringIO()), \
                            contextlib.redirect_stderr(io.StringIO()), \
                            time_limit(CELL_LIMIT_S):
                        exec(compile(source, f"<{path.name}, code cell {number}>", "exec"),
                             namespace)
                except (SystemExit, KeyboardInterrupt, TimeLimitExceeded) as exc:
                    stopped = _stop_message(number, exc)
                    break
                except Exception as exc:          # the reader's cell: report, go on
                    errors.append(say(
                        en=f"code cell {number} raised {type(exc).__name__}: {_text_of(exc)}",
                        ko=f"코드 셀 {number}에서 예외가 발생했습니다: {exception_text(exc)}"))
    finally:
        os.chdir(here)
        set_language(spoken)
        import matplotlib.pyplot as plt

        plt.close("all")
    return NotebookGrade(path, all_names(chapter + "."), dict(verdicts), errors, stopped)


def grade_notebook(path: str | os.PathLike) -> bool:
    """Run the notebook as the reader left it and print a table: every exercise and puzzle of
    its chapter, solved or not yet, with its verdict's first line.  Returns True when all are
    solved."""
    result = run_notebook(path)
    print(result.summary())
    return result.all_solved


def statuses(prefix: str = "") -> dict[str, str]:
    """{name: "correct" | "revealed" | "wrong" | "unsolved" | "not tried"} for every exercise and puzzle
    (of one chapter with ``prefix="06."``), from the verdicts kept."""
    verdicts = known_with_notes()[0]
    return {n: verdicts[n]["status"] if n in verdicts else "not tried" for n in all_names(prefix)}


def progress(prefix: str = "") -> None:
    """Print, chapter by chapter, every exercise and puzzle with its newest verdict (from this
    process and the record file; a solved one stays solved, a later try noted beside it).
    ``prefix="06."`` shows one chapter.  Returns nothing (``statuses()`` gives the table as a
    dict)."""
    verdicts, notes = known_with_notes()
    for note in notes:
        print(note)
    chosen = all_names(prefix)
    chapters = sorted({n.split(".")[0] for n in chosen})
    for chapter in chapters:
        mine = [n for n in chosen if n.startswith(chapter + ".")]
        done = sum(1 for n in mine if verdicts.get(n, {}).get("status") == "correct")
        print(say(en=f"chapter {chapter}: {done} of {len(mine)} solved",
                  ko=f"{chapter}장: {len(mine)}개 중 {done}개 풀었음"))
        print(table(mine, verdicts))
        print()
