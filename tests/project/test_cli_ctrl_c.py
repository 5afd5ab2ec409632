"""Ctrl-C at any instant, from the command's first instant through its imports, the loading of
the weights and the engine's start, to the first token of the answer: always one line,
``error: interrupted (Ctrl-C)``, and exit status 130 -- never a swallowed interrupt, a
half-imported module failing later, or a traceback.

The instants are drawn by hypothesis (a bounded number of runs).  Each run starts the real
command (``python -m paged_tutorial`` on a tiny GGUF) through a small launcher that starts a
clock the moment the command takes Ctrl-C over (its first statement) and, after the drawn
delay, sends the process a real SIGINT from another thread, as a terminal would.  The
longest delay is the time the command needs to print its first answer byte, measured once.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers.child_env import child_env
from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial.cli.ctrl_c import EXIT_INTERRUPTED, INTERRUPTED_LINE
from paged_tutorial.loading.models import random_model

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--backend", "torch", "--dtype", "float32", "--no-chat", "--no-progress", "--seed", "0",
        "--max-tokens", "100"]

LAUNCHER = """
import os, signal, sys, threading, time, runpy
delay, clock_file, sent_file = float(sys.argv[1]), sys.argv[2], sys.argv[3]
del sys.argv[1:4]
real_signal = signal.signal

def send():
    with open(sent_file, "w") as f:
        f.write("sent")
    os.kill(os.getpid(), signal.SIGINT)

def watching(signum, handler):
    previous = real_signal(signum, handler)
    if signum == signal.SIGINT and signal.signal is watching:   # the command took Ctrl-C over
        signal.signal = real_signal
        with open(clock_file, "w") as f:
            f.write(repr(time.monotonic()))
        if delay >= 0:
            timer = threading.Timer(delay, send)
            timer.daemon = True
            timer.start()
    return previous

signal.signal = watching
sys.argv[0] = "paged_tutorial"
runpy.run_module("paged_tutorial", run_name="__main__", alter_sys=True)
"""


def sigint_as_a_terminal_gives_it() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def launch(tiny_gguf, delay: float, tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, repr(delay), str(tmp_path / "clock"),
         str(tmp_path / "sent"), "abc", "--model", str(tiny_gguf), *FAST],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=child_env(LC_ALL="C.UTF-8", PYTHONUTF8="0"), cwd=ROOT,
        preexec_fn=sigint_as_a_terminal_gives_it)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_ctrl_c") / "tiny.gguf"
    return write_tiny_gguf(path, random_model(tiny_config(vocab_size=320), seed=3))


@pytest.fixture(scope="module")
def uninterrupted(tiny_gguf, tmp_path_factory):
    """(the whole answer, seconds from taking Ctrl-C over to the first answer byte)."""
    folder = tmp_path_factory.mktemp("calibrate")
    proc = launch(tiny_gguf, -1.0, folder)
    first = proc.stdout.read(1)
    first_byte_at = time.monotonic()
    rest, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    started_at = float((folder / "clock").read_text())
    return (first + rest).decode(), first_byte_at - started_at


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fraction=st.floats(min_value=0.0, max_value=1.0))
@example(fraction=0.0)
@example(fraction=0.0005)
@example(fraction=0.01)
def test_ctrl_c_at_any_instant_to_the_first_token(tiny_gguf, uninterrupted, tmp_path_factory,
                                                  fraction):
    answer, to_first_byte = uninterrupted
    folder = tmp_path_factory.mktemp("run")
    proc = launch(tiny_gguf, fraction * to_first_byte, folder)
    out, err = proc.communicate(timeout=300)
    out, err = out.decode(), err.decode()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    if not (folder / "sent").exists():          # the run ended before the delay was up
        assert proc.returncode == 0 and out == answer, err
        return
    assert proc.returncode == EXIT_INTERRUPTED, (proc.returncode, err)
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert errors == [INTERRUPTED_LINE], err
    assert answer.startswith(out), (out, answer)          # what was shown is the answer's start
