"""The command line never prints a traceback for a user's situation: standard output closed,
broken or full, Ctrl-C at any moment, option values out of range, a prompt longer than
``--max-seq-len`` or one holding bytes the terminal's encoding could not decode.

Most cases run ``python -m paged_tutorial`` as a subprocess on a tiny GGUF (2 layers,
byte-level tokenizer).  Ctrl-C is a real SIGINT: sent by the process to itself at a chosen
moment (when torch starts importing, when the weights load, at the first step, at a later
decode step), through a small launcher that wraps the named function and then runs the
module as ``-m`` would; and sent from outside once the command has printed a given line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.child_env import child_env
from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial.cli import answers
from paged_tutorial.cli import main as cli
from paged_tutorial.loading.models import random_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--backend", "torch", "--dtype", "float32", "--no-chat", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_failures") / "tiny.gguf"
    return write_tiny_gguf(path, random_model(tiny_config(vocab_size=320), seed=3))


def env() -> dict:
    return child_env(LC_ALL="C.UTF-8", PYTHONUTF8="0")


def cli_args(tiny_gguf, *extra) -> list[str]:
    return ["-m", "paged_tutorial", "abc", "--model", str(tiny_gguf), *FAST, *extra]


def sigint_as_a_terminal_gives_it() -> None:
    """For a child that must take Ctrl-C: SIGINT back to its default action.  A process started
    with SIGINT ignored keeps it ignored (Python installs no KeyboardInterrupt handler then,
    rightly), and the workers of a parallel test run (pytest-xdist) ignore it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr


# --- standard output ---------------------------------------------------------------------------

def test_stdout_whose_reader_left_exits_quietly(tiny_gguf):
    """A pipe whose read end is already closed: the first write is EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        run = subprocess.run([sys.executable, *cli_args(tiny_gguf)], stdout=write_end,
                             stderr=subprocess.PIPE, text=True, env=env(), timeout=300)
    finally:
        os.close(write_end)
    assert run.returncode == cli.EXIT_OUTPUT_CLOSED, run.stderr
    no_traceback(run.stderr)
    assert "error:" not in run.stderr


def test_head_c_1(tiny_gguf):
    command = " ".join([sys.executable, *cli_args(tiny_gguf, "--max-tokens", "60")])
    run = subprocess.run(["bash", "-c", f"set -o pipefail; {command} | head -c 1"],
                         capture_output=True, text=True, env=env(), timeout=300)
    assert run.returncode in (0, cli.EXIT_OUTPUT_CLOSED), run.stderr
    assert len(run.stdout) == 1
    no_traceback(run.stderr)


def test_stdout_closed(tiny_gguf):
    command = " ".join([sys.executable, *cli_args(tiny_gguf)])
    run = subprocess.run(["bash", "-c", f"{command} >&-"], capture_output=True, text=True,
                         env=env(), timeout=300)
    assert run.returncode == cli.EXIT_OUTPUT_CLOSED
    assert run.stderr == ""


def test_stdout_full(tiny_gguf):
    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, *cli_args(tiny_gguf)], stdout=full,
                             stderr=subprocess.PIPE, text=True, env=env(), timeout=300)
    assert run.returncode == cli.EXIT_USAGE
    no_traceback(run.stderr)
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert errors == ["error: cannot write the answer to standard output: "
                      "No space left on device"], run.stderr


# --- Ctrl-C ------------------------------------------------------------------------------------

LAUNCHER = """
import os, runpy, signal, sys
moment = sys.argv.pop(1)

def interrupt():
    os.kill(os.getpid(), signal.SIGINT)

if moment == "import":
    class Finder:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                sys.meta_path.remove(self)
                interrupt()
            return None
    sys.meta_path.insert(0, Finder())
else:
    import paged_tutorial.loading.models as models
    from paged_tutorial.engine.llm_engine import Engine
    if moment == "load":
        real_load = models.load_gguf
        def load_gguf(*args, **kwargs):
            interrupt()
            return real_load(*args, **kwargs)
        models.load_gguf = load_gguf
    else:
        at_step = {"prefill": 1, "decode": 4}[moment]
        real_step = Engine.step
        steps = []
        def step(self):
            steps.append(1)
            if len(steps) == at_step:
                interrupt()
            return real_step(self)
        Engine.step = step
sys.argv[0] = "paged_tutorial"
runpy.run_module("paged_tutorial", run_name="__main__", alter_sys=True)
"""


def assert_interrupted(run) -> None:
    assert run.returncode == cli.EXIT_INTERRUPTED, run.stderr
    no_traceback(run.stderr)
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert errors == ["error: interrupted (Ctrl-C)"], run.stderr


@pytest.mark.parametrize("moment", ["import", "load", "prefill", "decode"])
def test_ctrl_c_at_a_chosen_moment(tiny_gguf, moment):
    args = cli_args(tiny_gguf, "--max-tokens", "8")[2:]        # without "-m paged_tutorial"
    run = subprocess.run([sys.executable, "-c", LAUNCHER, moment, *args],
                         capture_output=True, text=True, env=env(), timeout=300,
                         preexec_fn=sigint_as_a_terminal_gives_it)
    assert_interrupted(run)
    assert run.stdout == "" if moment in ("import", "load") else True


@pytest.mark.parametrize("after", ["loading line", "engine line", "first answer byte"])
def test_ctrl_c_from_outside(tiny_gguf, after):
    """A SIGINT from outside, sent when the command has printed its loading line (the weights
    are loading), its engine line (generation starts) or the first byte of the answer.
    (Before the interpreter has finished starting, no program's handler runs yet.)"""
    proc = subprocess.Popen([sys.executable, *cli_args(tiny_gguf, "--max-tokens", "100")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(),
                            preexec_fn=sigint_as_a_terminal_gives_it)
    if after == "first answer byte":
        proc.stdout.read(1)
    else:
        prefix = b"loading " if after == "loading line" else b"["
        while not proc.stderr.readline().startswith(prefix):
            pass
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert_interrupted(subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(),
                                                   err.decode()))


# --- option values -----------------------------------------------------------------------------

BAD_OPTIONS = [
    ("--kv-cache-mib", "inf"), ("--kv-cache-mib", "nan"), ("--kv-cache-mib", "-1"),
    ("--kv-cache-mib", "0"), ("--kv-cache-mib", "1e30"), ("--max-tokens", str(10 ** 30)),
    ("--max-tokens", "-1"), ("--max-tokens", "2.5"), ("--temperature", "nan"),
    ("--temperature", "inf"), ("--temperature", "-0.5"), ("--top-p", "nan"), ("--top-p", "0"),
    ("--top-p", "1.5"), ("--seed", "-1"), ("--seed", str(2 ** 64)), ("--max-slots", "0"),
    ("--max-slots", "1e9"), ("--max-seq-len", "0"), ("--max-seq-len", str(10 ** 12)),
]


@pytest.mark.parametrize("option, value", BAD_OPTIONS, ids=[f"{o}={v}" for o, v in BAD_OPTIONS])
def test_bad_numbers_are_one_argparse_error(capsys, option, value, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(answers, "run", never)
    with pytest.raises(SystemExit) as info:
        cli.main(["hi", option, value])
    assert info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    no_traceback(err)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"argument {option}:" in errors[0], err
    assert value in errors[0]


# --- prompts -----------------------------------------------------------------------------------

def test_prompt_longer_than_max_seq_len(tiny_gguf, capsys):
    status = cli.main(["abcdefghijklmnopqrstuvwxyz" * 2, "--model", str(tiny_gguf), *FAST,
                       "--max-seq-len", "16"])
    out, err = capsys.readouterr()
    assert status == cli.EXIT_USAGE and out == ""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "the prompt has 52 tokens but max_seq_len is 16" in errors[0]
    assert "raise max_seq_len (--max-seq-len" in errors[0]


def test_one_prompt_of_several_too_long(tiny_gguf, capsys):
    status = cli.main(["ab", "x" * 40, "--model", str(tiny_gguf), *FAST, "--max-seq-len", "16"])
    err = capsys.readouterr().err
    assert status == cli.EXIT_USAGE
    assert "error: prompt 2: the prompt has 40 tokens" in err


def test_undecodable_argv_byte_in_process(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["caf\udce9"])
    assert info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    no_traceback(err)
    assert "the prompt holds the byte 0xE9 at position 3" in err
    assert "terminal's encoding" in err


def test_undecodable_argv_byte(tiny_gguf):
    run = subprocess.run([sys.executable, "-m", "paged_tutorial", b"caf\xe9 au lait",
                          "--model", str(tiny_gguf), *FAST],
                         capture_output=True, env=env(), timeout=300)
    err = run.stderr.decode("utf-8", "replace")
    assert run.returncode == cli.EXIT_USAGE, err
    no_traceback(err)
    assert "the byte 0xE9 at position 3" in err and "(utf-8, from LANG / LC_ALL)" in err
