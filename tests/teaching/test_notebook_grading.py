"""Grading a reader's own notebook (``grade_notebook`` and the ``grade`` command), the progress
table, and ``reveal`` showing source code."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.exercises.notebook_grading import run_notebook
from paged_tutorial.teaching.language import language
from helpers.child_env import child_env

ROOT = Path(__file__).resolve().parents[2]


def write_notebook(path: Path, answers: dict[str, str], first: str = "") -> Path:
    cells = [first + "import paged_tutorial as pt\npt.exercises.set_language(\"en\")\n"]
    cells += [f"answer = {value}\n_ = pt.exercises.check({name!r}, answer)"
              for name, value in answers.items()]
    notebook = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [],
                           "execution_count": None} for c in cells]
                + [{"cell_type": "markdown", "source": "done", "metadata": {}}],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook))
    return path


SOLVED_00 = {name: repr(ex.reveal(name)) for name in ex.names("00.")}


def test_a_solved_notebook_grades_all_solved(tmp_path, capsys):
    path = write_notebook(tmp_path / "00_mine.ipynb", SOLVED_00, first="!pip list\n%matplotlib inline\n")
    assert ex.grade_notebook(path) is True
    out = capsys.readouterr().out
    assert f"00_mine.ipynb: {len(SOLVED_00)} of {len(SOLVED_00)} solved" in out
    for name in SOLVED_00:
        assert re.search(rf"{re.escape(name)}\s+solved\s+\S", out), out


def test_unsolved_wrong_and_broken_cells_are_reported(tmp_path, capsys):
    names = list(SOLVED_00)
    answers = {names[0]: SOLVED_00[names[0]], names[1]: "..."}
    path = write_notebook(tmp_path / "00_mine.ipynb", answers)
    cells = json.loads(path.read_text())
    cells["cells"].insert(1, {"cell_type": "code", "source": "1 / 0", "metadata": {},
                              "outputs": [], "execution_count": None})
    path.write_text(json.dumps(cells))
    result = run_notebook(path)
    assert not result.all_solved
    assert result.verdicts[names[0]]["status"] == "correct"
    assert result.verdicts[names[1]]["status"] == "unsolved"
    assert names[2] not in result.verdicts                       # never checked
    text = result.summary()
    assert "not tried" in text and "ZeroDivisionError" in text and "code cell 2" in text
    capsys.readouterr()


def test_the_grade_command_exits_0_only_when_all_are_solved(tmp_path):
    env = child_env(PAGED_TUTORIAL_PROGRESS="off")
    solved = write_notebook(tmp_path / "00_solved.ipynb", SOLVED_00)
    first = next(iter(SOLVED_00))
    partly = write_notebook(tmp_path / "00_partly.ipynb", {**SOLVED_00, first: "-1"})

    def grade(*args):
        return subprocess.run([sys.executable, "-m", "paged_tutorial.teaching.exercises",
                               "grade", *args], capture_output=True, text=True, env=env,
                              timeout=300)
    done = grade(str(solved))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 of 3 solved" in done.stdout
    part = grade("--language", "ko", str(partly))
    assert part.returncode == 1 and "3개 중 2개 풀었음" in part.stdout, part.stdout
    missing = grade(str(tmp_path / "nothing.ipynb"))
    assert missing.returncode == 2 and "no notebook" in missing.stderr
    unnamed = write_notebook(tmp_path / "mine.ipynb", {})
    assert grade(str(unnamed)).returncode == 2


def test_grading_restores_the_callers_language(tmp_path, capsys):
    ex.set_language("ko")
    ex.grade_notebook(write_notebook(tmp_path / "00_mine.ipynb", {}))
    assert language() == "ko"
    assert "시도 안 함" in capsys.readouterr().out


def test_progress_keeps_verdicts_across_processes(tmp_path, capsys, monkeypatch):
    progress_module = importlib.import_module("paged_tutorial.teaching.exercises.progress")
    record = Path(os.environ["PAGED_TUTORIAL_PROGRESS"])
    name = next(iter(SOLVED_00))
    ex.check(name, ex.reveal(name))
    saved = json.loads(record.read_text())
    assert saved[name]["status"] == "correct"
    progress_module._SEEN.clear()                   # a new process: only the file is left
    capsys.readouterr()
    assert ex.progress("00.") is None                # nothing for Jupyter to echo
    out = capsys.readouterr().out
    from paged_tutorial.teaching.exercises.notebook_grading import statuses

    table = statuses("00.")
    assert table[name] == "correct" and f"chapter 00: 1 of {len(SOLVED_00)} solved" in out
    assert all(v == "not tried" for n, v in table.items() if n != name)
    monkeypatch.setenv("PAGED_TUTORIAL_PROGRESS", "off")
    assert progress_module.record_file() is None
    ex.check(name, -1)                              # nothing written, nothing raised


def test_reveal_shows_a_puzzles_source_and_values_as_values():
    shown = ex.reveal("06.table_sync")
    assert repr(shown).splitlines()[1].startswith("def sync_table(host_table, device_table, ")
    assert "changed" in repr(shown) and "<function" not in repr(shown)
    html = shown._repr_html_()
    assert html is None or ("sync_table" in html and "<span" in html)
    allocator = ex.reveal("06.allocator")
    assert "class ArticleAllocator" in repr(allocator) and "def release" in repr(allocator)
    assert issubclass(allocator.code, ex.AllocatorBase)
    assert ex.reveal("00.kv_bytes_per_token") == ex.expected_answer("00.kv_bytes_per_token")
    locate = ex.reveal("02.locate")
    import numpy as np
    table = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    assert locate(table, 1, 2, 37, 16) == (int(table[1, 2, 2]), 5)      # callable as the code
    assert locate.__name__ == "locate"

