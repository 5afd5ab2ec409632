"""Grade a reader's own notebook: run its code cells as she left them, in order, in a fresh
namespace, and collect the verdict of every ``check(...)`` they call; and ``progress()``, the
same table for every chapter from the verdicts kept (``progress.py``).

    pt.exercises.grade_notebook("notebooks/06_block_lifetime.ipynb")
    python -m paged_tutorial.teaching.exercises grade notebooks/06_block_lifetime.ipynb

Cells run with the notebook's folder as the working directory and their printed output
hidden; shell and magic lines (``!pip ...``, ``%matplotlib``) are skipped; a cell that raises
is reported and the next cells still run.  The chapter's exercises and puzzles are the names
that start with the notebook's two digits; one that no cell checked is "not tried".  The
language chosen by the caller is restored afterwards.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from paged_tutorial.teaching.exercises.progress import collecting, known, table
from paged_tutorial.teaching.exercises.registry import names as all_names
from paged_tutorial.teaching.language import language, say, set_language


@dataclass
class NotebookGrade:
    """What ``grade_notebook`` found: every verdict by name, and the cells that raised."""

    path: Path
    names: list[str]
    verdicts: dict[str, dict]
    errors: list[str] = field(default_factory=list)

    @property
    def all_solved(self) -> bool:
        return bool(self.names) and all(
            self.verdicts.get(n, {}).get("status") == "correct" for n in self.names)

    def summary(self) -> str:
        done = sum(1 for n in self.names if self.verdicts.get(n, {}).get("status") == "correct")
        lines = [say(en=f"{self.path.name}: {done} of {len(self.names)} solved",
                     ko=f"{self.path.name}: {len(self.names)}개 중 {done}개 풀었음"),
                 table(self.names, self.verdicts)]
        lines += self.errors
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


def run_notebook(path: str | os.PathLike) -> NotebookGrade:
    """Run the notebook's code cells in a fresh namespace and collect its verdicts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(say(en=f"no notebook at {path}: pass the path of an .ipynb file",
                                    ko=f"{path} 에 노트북이 없습니다: .ipynb 파일 경로를 넘기세요"))
    chapter = _chapter(path)
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    namespace: dict = {"__name__": "__main__"}
    errors: list[str] = []
    spoken, here = language(), os.getcwd()
    import matplotlib

    matplotlib.use("Agg")
    try:
        os.chdir(path.resolve().parent)
        with collecting() as verdicts:
            for number, cell in enumerate(cells, 1):
                source = _python_only("".join(cell["source"]))
                try:
                    with contextlib.redirect_stdout(io.StringIO()), \
                            contextlib.redirect_stderr(io.StringIO()):
                        exec(compile(source, f"<{path.name}, code cell {number}>", "exec"),
                             namespace)
                except Exception as exc:          # the reader's cell: report, go on
                    errors.append(say(
                        en=f"code cell {number} raised {type(exc).__name__}: {exc}",
                        ko=f"코드 셀 {number} 에서 {type(exc).__name__} 발생: {exc}"))
    finally:
        os.chdir(here)
        set_language(spoken)
        import matplotlib.pyplot as plt

        plt.close("all")
    return NotebookGrade(path, all_names(chapter + "."), dict(verdicts), errors)


def grade_notebook(path: str | os.PathLike) -> bool:
    """Run the notebook as the reader left it and print a table: every exercise and puzzle of
    its chapter, solved or not yet, with its verdict's first line.  Returns True when all are
    solved."""
    result = run_notebook(path)
    print(result.summary())
    return result.all_solved


def progress(prefix: str = "") -> dict[str, str]:
    """Print, chapter by chapter, every exercise and puzzle with its newest verdict (from this
    process and the record file); returns {name: "correct" | "wrong" | "unsolved" | "not
    tried"}.  ``prefix="06."`` shows one chapter."""
    verdicts = known()
    chosen = all_names(prefix)
    chapters = sorted({n.split(".")[0] for n in chosen})
    for chapter in chapters:
        mine = [n for n in chosen if n.startswith(chapter + ".")]
        done = sum(1 for n in mine if verdicts.get(n, {}).get("status") == "correct")
        print(say(en=f"chapter {chapter}: {done} of {len(mine)} solved",
                  ko=f"{chapter}장: {len(mine)}개 중 {done}개 풀었음"))
        print(table(mine, verdicts))
        print()
    return {n: verdicts[n]["status"] if n in verdicts else "not tried" for n in chosen}
