"""The learner's tools hold under hostile answers and damaged records: ``check`` and ``grade``
end every run in a verdict (exits, interrupts, endless loops, raising ``__repr__``/``__eq__``,
code a GPU cannot compile, calls into the engine's kernels or the worked solutions), and the
progress record and the solved store survive corruption and concurrent writers."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.teaching.exercises import notebook_grading, solved
from paged_tutorial.teaching.exercises.__main__ import main
from paged_tutorial.teaching.harness import base
from paged_tutorial.teaching.harness.base import Puzzle, check_compiles
from paged_tutorial.teaching.verdict import Verdict

progress = importlib.import_module("paged_tutorial.teaching.exercises.progress")
PUZZLES = [n for n in ex.names() if isinstance(ex.get(n), Puzzle)]
HANGUL = re.compile(r"[\uac00-\ud7a3]")


def notebook(folder: Path, name: str, *sources: str) -> Path:
    cells = [{"cell_type": "code", "source": s, "metadata": {}, "outputs": [],
              "execution_count": None} for s in sources]
    path = folder / name
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def right_00() -> str:
    name = ex.names("00.")[0]
    return f"import paged_tutorial as pt\npt.exercises.check({name!r}, {ex.reveal(name)!r})"


# --- a notebook that ends the program --------------------------------------------------------

@pytest.mark.parametrize("ending", ["import sys\nsys.exit(0)", "raise SystemExit(3)",
                                    "import os\nos._exit(0)", "exit()",
                                    "raise KeyboardInterrupt"])
def test_a_cell_that_ends_the_program_stops_grading_there(tmp_path, capsys, ending):
    path = notebook(tmp_path, "00_ends.ipynb", right_00(), ending, "x = 1")
    result = notebook_grading.run_notebook(path)
    assert result.stopped and "code cell 2" in result.stopped
    assert not result.all_solved
    assert main(["grade", str(path)]) == 1
    assert "stopped at code cell 2" in capsys.readouterr().out


def test_grade_notebook_in_process_does_not_let_an_exit_escape(tmp_path, capsys):
    path = notebook(tmp_path, "00_ends.ipynb", "import sys\nsys.exit(0)")
    assert ex.grade_notebook(path) is False
    assert "sys.exit(0)" in capsys.readouterr().out


# --- files that are not notebooks ------------------------------------------------------------

@pytest.mark.parametrize("text, says", [
    ("{not json", "not JSON"), ("[1, 2]", "JSON list"), ('{"cells": [{"source": "x"}]}',
                                                         "cell 1 has no cell_type"),
    ('{"cells": 5}', "not an object with a list of cells"), ("\udcff", "not UTF-8")])
def test_a_file_that_is_not_a_notebook_gives_one_line_and_status_2(tmp_path, capsys, text,
                                                                   says):
    path = tmp_path / "03_broken.ipynb"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert main(["grade", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "03_broken.ipynb" in err and says in err


# --- hostile answers to check ----------------------------------------------------------------

class RaisingRepr(int):
    def __repr__(self):
        raise RuntimeError("repr refuses")

    __str__ = __repr__


class RaisingEq(int):
    def __eq__(self, other):
        raise RuntimeError("eq refuses")

    __hash__ = int.__hash__


@pytest.mark.parametrize("answer", [RaisingRepr(3), RaisingEq(3), [RaisingEq(1)],
                                    {"a": RaisingRepr(1)}],
                         ids=["repr", "eq", "list-eq", "dict-repr"])
def test_an_answer_whose_repr_or_eq_raises_gets_a_verdict(answer, capsys):
    for name in (ex.names("00.")[0], "01.kv_offset"):
        assert ex.check(name, answer) is False
        assert "✘" in capsys.readouterr().out


def test_a_function_returning_an_object_whose_repr_raises_gets_a_verdict():
    verdict = ex.grade("01.kv_offset", lambda *args: RaisingRepr(5) if args[0] else object())
    assert verdict.status == "wrong"


@pytest.mark.parametrize("body, says", [("import sys\n    sys.exit(0)", "exit"),
                                        ("raise SystemExit(3)", "SystemExit"),
                                        ("raise KeyboardInterrupt", "KeyboardInterrupt")])
def test_an_answer_that_exits_is_refused_on_every_puzzle(body, says):
    for name in PUZZLES:
        verdict = ex.grade(name, hostile(name, body))
        assert verdict.status == "wrong" and says in verdict.message, (name, verdict)


def test_an_exit_reached_indirectly_is_a_verdict():
    import sys

    leave = sys.exit

    def kv_byte_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                       ITEMSIZE):
        leave(4)
    verdict = ex.grade("01.kv_offset", kv_byte_offset)
    assert verdict.status == "wrong" and "sys.exit(4)" in verdict.message


def hostile(name: str, body: str, namespace: dict | None = None):
    """An answer to puzzle ``name`` with its signature and ``body``."""
    puzzle = ex.get(name)
    if puzzle.signature.startswith("class"):
        method_body = body.replace("\n    ", "\n        ")
        source = ("class MyAllocator(AllocatorBase):\n"
                  "    def ensure_capacity(self, slot, new_len):\n"
                  f"        {method_body}\n"
                  "    def release(self, slot):\n"
                  f"        {method_body}\n")
    else:
        source = f"{puzzle.signature}\n    {body}\n"
    scope = {"AllocatorBase": ex.AllocatorBase, "np": np, **(namespace or {})}
    exec(compile(source, f"<hostile {name}>", "exec"), scope)
    return scope["MyAllocator" if puzzle.signature.startswith("class") else puzzle.function_name]


# --- endless loops ---------------------------------------------------------------------------

def test_an_endless_loop_on_the_host_is_stopped_and_check_works_afterwards(monkeypatch, capsys):
    monkeypatch.setattr(base, "HOST_CALL_LIMIT_S", 0.5)

    def kv_byte_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                       ITEMSIZE):
        while True:
            try:
                pass
            except Exception:
                pass
    assert ex.check("01.kv_offset", kv_byte_offset) is False
    assert "still running after 0.5 s" in capsys.readouterr().out
    assert ex.grade("01.kv_offset", ex.reveal("01.kv_offset")).ok      # grading works again


def test_an_endless_loop_in_a_kernel_part_replayed_on_the_host_is_stopped(monkeypatch):
    monkeypatch.setattr(base, "HOST_CALL_LIMIT_S", 0.5)

    def k_index(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM,
                HEAD_DIM):
        n = 0
        while n >= 0:
            n += 1
        return n
    verdict = ex.grade("03.k_index", k_index)
    assert verdict.status == "wrong" and "still running" in verdict.message


# untraced under --cov (pytest-cov's no_cover): stopping a simulated kernel raises an exception
# in its threads from outside (PyThreadState_SetAsyncExc); on CPython 3.11 a traced thread waits
# until every such exception is delivered, and a simulated thread waiting at a barrier never
# takes it, so a traced run would hang here
@pytest.mark.no_cover
@pytest.mark.parametrize("name", ["06.allocator", pytest.param("04.token_score", marks=(
    pytest.mark.skipif(not __import__("paged_tutorial.backends.numba_cuda.device.sim_shim",
                                      fromlist=["SIMULATING"]).SIMULATING,
                       reason="only a simulated kernel can be stopped: on a GPU it is compiled")))])
def test_an_endless_loop_on_an_engine_or_a_simulated_gpu_is_stopped(name, monkeypatch):
    from paged_tutorial.teaching.harness import engine_harness, kernel_harness

    monkeypatch.setattr(engine_harness, "STEP_LIMIT_S", 1.0)
    monkeypatch.setattr(kernel_harness, "KERNEL_TIMEOUT_S", 2.0)
    monkeypatch.setattr(base, "GRADE_LIMIT_S", 20.0)
    body = "n = 0\n    while n >= 0:\n        n += 1"
    verdict = ex.grade(name, hostile(name, body))
    assert verdict.status == "wrong" and "still running" in verdict.message, verdict


# --- code a GPU cannot compile ---------------------------------------------------------------

def with_a_dict(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM,
                HEAD_DIM):
    parts = {0: physical_block * BLOCK_ELEMS, 1: token * KV_DIM}
    return parts[0] + parts[1] + q_head // Q_PER_KV * HEAD_DIM + thread_id


def with_an_fstring(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM,
                    HEAD_DIM):
    label = f"{token}"
    return physical_block * BLOCK_ELEMS + token * KV_DIM + q_head // Q_PER_KV * HEAD_DIM \
        + thread_id + len(label) * 0


def with_a_mixed_list(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM,
                      HEAD_DIM):
    terms = [physical_block * BLOCK_ELEMS, token * KV_DIM * 1.0, q_head // Q_PER_KV * HEAD_DIM]
    return int(terms[0] + terms[1] + terms[2]) + thread_id


@pytest.mark.parametrize("answer, says", [(with_a_dict, "a dict"),
                                          (with_an_fstring, "a string"),
                                          (with_a_mixed_list, "a Python list")])
def test_code_a_gpu_cannot_compile_is_refused_on_a_cpu(answer, says):
    args = tuple(np.int64(a) for a in (3, 2, 1, 5, 2, 2048, 128, 64))
    with pytest.raises(base.Wrong, match=says):
        check_compiles(answer, args)
    verdict = ex.grade("03.k_index", answer)
    assert verdict.status == "wrong" and says in verdict.message


@pytest.mark.parametrize("line, says", [("labels = {0: seq_len}", "a dict"),
                                        ("label = f'{seq_len}'", "a string"),
                                        ("mixed = [seq_len, 1.5]", "a Python list")])
def test_a_kernel_body_part_a_gpu_cannot_compile_is_refused_in_the_simulator(line, says):
    source = ex.reveal("03.walk_blocks").source.splitlines()
    body = next(i for i, text in enumerate(source) if text.rstrip().endswith("):")) + 1
    source.insert(body, f"    {line}")
    answer = solved.rebuild("\n".join(source) + "\n")
    verdict = ex.grade("03.walk_blocks", answer)
    assert verdict.status == "wrong" and says in verdict.message, verdict.message


def test_plain_arithmetic_still_compiles():
    args = tuple(np.int64(a) for a in (3, 2, 1, 5, 2, 2048, 128, 64))
    check_compiles(ex.reveal("03.k_index").code, args)


# --- borrowed code ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", PUZZLES)
def test_an_answer_calling_the_engines_kernels_or_the_worked_solutions_is_refused(name):
    from paged_tutorial.backends.numba_cuda.kernels import attention
    import paged_tutorial as pt

    engine = hostile(name, "return attention.walk_blocks", {"attention": attention})
    verdict = ex.grade(name, engine)
    assert verdict.status == "wrong" and "engine's own code" in verdict.message, verdict
    deep = hostile(name, "return pt.backends.numba_cuda.kernels.attention.token_score",
                   {"pt": pt})
    assert "engine's own code" in ex.grade(name, deep).message
    nested = hostile(name, "return (lambda: reveal)()", {"reveal": ex.reveal})
    verdict = ex.grade(name, nested)
    assert verdict.status == "wrong" and "worked solutions" in verdict.message, verdict


def test_the_worked_solution_itself_is_still_graded():
    assert ex.grade("03.k_index", ex.reveal("03.k_index")).ok


# --- the progress record ---------------------------------------------------------------------

def record_path() -> Path:
    return Path(os.environ["PAGED_TUTORIAL_PROGRESS"])


@pytest.mark.parametrize("text, says", [
    ("{broken", "cannot be read"), ("[1, 2]", "JSON list"),
    ('{"00.x": 5}', "not {\"status\""), ('{"00.x": {"status": "maybe", "line": ""}}',
                                         "status 'maybe'"),
    ('{"00.x": {"status": "correct"}}', "no verdict line")])
def test_a_damaged_progress_record_is_reported_not_a_crash(text, says, capsys):
    record_path().write_text(text)
    progress._SEEN.clear()
    assert ex.progress("00.") is None
    out = capsys.readouterr().out
    assert says in out and "chapter 00" in out
    assert main(["progress"]) == 0
    name = ex.names("00.")[0]
    ex.check(name, ex.reveal(name))
    assert json.loads(record_path().read_text())[name]["status"] == "correct"


def test_a_record_that_is_not_ours_is_kept_aside(capsys):
    record_path().write_text("[1, 2]")
    name = ex.names("00.")[0]
    ex.check(name, -1)
    assert record_path().with_name("progress.json.corrupt").read_text() == "[1, 2]"


def test_a_solved_item_stays_solved_and_a_later_try_is_noted(capsys):
    name = ex.names("00.")[0]
    ex.check(name, ex.reveal(name))
    ex.check(name, -1)
    entry = json.loads(record_path().read_text())[name]
    assert entry["status"] == "correct" and entry["later"]
    progress._SEEN.clear()
    ex.check(name, -2)
    capsys.readouterr()
    ex.progress("00.")
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(name))
    assert "solved" in row and "a later try" in row


def _write_verdicts(path: str, worker: int, count: int, start, without_fcntl: bool) -> None:
    """One notebook's writer: waits for the others at ``start``, then records ``count``
    verdicts, each write held open a moment so that the writers' read-change-writes overlap
    unless the lock orders them."""
    os.environ["PAGED_TUTORIAL_PROGRESS"] = path
    if without_fcntl:                      # as on Windows: no fcntl module to lock with
        sys.modules["fcntl"] = None
    slow_write = progress.write_atomically

    def write_late(*args):
        time.sleep(0.02)
        slow_write(*args)

    progress.write_atomically = write_late
    start.wait(30)
    for i in range(count):
        progress.record(f"99.w{worker}_{i}", Verdict("wrong", f"try {i} of worker {worker}"))


@pytest.mark.parametrize("without_fcntl", [False, True], ids=["fcntl", "no-fcntl"])
def test_eight_notebooks_writing_at_once_lose_nothing(tmp_path, without_fcntl):
    path = str(tmp_path / "shared.json")
    context = multiprocessing.get_context("fork")
    start = context.Barrier(8)
    workers = [context.Process(target=_write_verdicts, args=(path, w, 4, start, without_fcntl))
               for w in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    assert len(json.loads(Path(path).read_text())) == 32
    assert not list(tmp_path.glob("*.tmp"))


def test_both_records_live_in_one_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("PAGED_TUTORIAL_PROGRESS")
    monkeypatch.delenv("PAGED_TUTORIAL_SOLVED")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert progress.record_file().parent == solved.store_folder().parent == \
        tmp_path / "paged_tutorial"


# --- the solved store ------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["def walk_blocks(:\n", "\x00\x01", "x = 1\n",
                                  "raise SystemExit(1)\n"])
def test_a_damaged_solved_file_names_the_file_and_the_fix(text):
    solved.clear()
    folder = solved.store_folder()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "03.walk_blocks.py").write_text(text)
    with pytest.raises(solved.SolvedFileError) as raised:
        ex.your_kernel()
    message = str(raised.value)
    assert "03.walk_blocks.py" in message and "Delete that file" in message
    solved.clear()


# --- Korean ----------------------------------------------------------------------------------

def test_grade_in_korean_speaks_korean_on_every_line(tmp_path, capsys):
    name = ex.names("00.")[0]
    path = notebook(tmp_path, "00_ko.ipynb", right_00(),
                    f"pt.exercises.check({ex.names('00.')[1]!r}, -1)", "1 / 0",
                    "import sys\nsys.exit(2)")
    assert main(["grade", "--language", "ko", str(path)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines and all(HANGUL.search(line) for line in lines), lines
    assert any(line.startswith(name) and "풀었음" in line for line in lines)
    progress_lines = []
    capsys.readouterr()
    main(["--language", "ko", "progress"])
    progress_lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert progress_lines and all(HANGUL.search(line) for line in progress_lines)
