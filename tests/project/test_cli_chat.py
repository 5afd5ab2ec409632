"""``--chat``: the conversation keeps its history (each answer is generated from everything
said before, through the chat template), Ctrl-C stops an answer and keeps the conversation,
Ctrl-D ends it with status 0.  Driven two ways: in process with piped lines, and as a real
process on a pseudo-terminal (pexpect), bounded in time."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import pytest

import paged_tutorial as pt
from helpers.child_env import child_env
from helpers.fixtures_loading import tiny_config, write_tiny_gguf
from paged_tutorial.cli import chat, options
from paged_tutorial.loading.models import random_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
FAST = ["--backend", "torch", "--dtype", "float32", "--no-progress", "--seed", "0"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_chat") / "tiny.gguf"
    config = tiny_config(vocab_size=320, max_position_embeddings=512)   # room for a history
    return write_tiny_gguf(path, random_model(config, seed=3),
                           metadata={"tokenizer.chat_template": TEMPLATE})


def test_each_answer_sees_the_history(tiny_gguf, monkeypatch):
    seen = []
    real = chat.engine_prompt
    monkeypatch.setattr(chat, "engine_prompt",
                        lambda engine, messages: seen.append(messages) or real(engine, messages))
    args = options.parse(["--chat", "--system", "be brief", "--model", str(tiny_gguf), *FAST,
                          "--max-tokens", "5"])
    out, err = io.StringIO(), io.StringIO()
    assert chat.run_chat(args, out, err, stdin=io.StringIO("first\n\nsecond\n")) == 0
    engine = pt.Engine(pt.load_model(tiny_gguf, "float32"), backend="torch")
    tokenizer = engine.model.tokenizer
    system = {"role": "system", "content": "be brief"}
    one = engine.generate([tokenizer.apply_chat_template(
        [system, {"role": "user", "content": "first"}])], max_tokens=5, seed=0)[0].text
    history = [system, {"role": "user", "content": "first"},
               {"role": "assistant", "content": one}, {"role": "user", "content": "second"}]
    two = engine.generate([tokenizer.apply_chat_template(history)], max_tokens=5,
                          seed=0)[0].text
    assert seen == [history[:2], history]                  # the empty line is no message
    assert out.getvalue() == f"{one}\n{two}\n"
    assert err.getvalue().count("finish_reason=") == 2


def test_a_conversation_longer_than_max_seq_len_says_so_and_goes_on(tiny_gguf):
    args = options.parse(["--chat", "--model", str(tiny_gguf), *FAST, "--max-tokens", "3",
                          "--max-seq-len", "24"])
    out, err = io.StringIO(), io.StringIO()
    assert chat.run_chat(args, out, err, stdin=io.StringIO("x" * 40 + "\nhi\n")) == 0
    lines = err.getvalue().splitlines()
    assert any(line.startswith("error: the prompt has") and "max_seq_len is 24" in line
               and "--max-seq-len" in line and "start a new one" in line for line in lines), lines
    assert sum("finish_reason=" in line for line in lines) == 1      # "hi" still answered


SLOW_STEPS = """
import runpy, signal, sys, time
# SIGINT as Python started from a terminal has it (a pytest-xdist worker ignores SIGINT, and
# its children inherit that, so Python would not have installed its handler)
signal.signal(signal.SIGINT, signal.default_int_handler)
from paged_tutorial.engine.llm_engine import Engine
real_step = Engine.step
def step(self):
    time.sleep(0.05)          # an answer of many tokens takes seconds: Ctrl-C lands inside it
    return real_step(self)
Engine.step = step
sys.argv[0] = "paged_tutorial"
runpy.run_module("paged_tutorial", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_on_a_terminal_ctrl_c_stops_an_answer_and_ctrl_d_ends(tiny_gguf):
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(sys.executable, ["-c", SLOW_STEPS, "--chat", "--model",
                                           str(tiny_gguf), *FAST, "--max-tokens", "100"],
                          env=child_env(LC_ALL="C.UTF-8"), cwd=str(ROOT), encoding="utf-8",
                          timeout=240)
    try:
        child.expect_exact(chat.GREETING)
        child.expect_exact(chat.PROMPT)
        child.sendline("hello")
        child.expect(r"\d+ tokens, finish_reason=\w+")
        child.expect_exact(chat.PROMPT)
        child.sendline("and more")
        child.expect_exact("and more")                     # the terminal's echo
        time.sleep(1.0)                                    # some tokens, far from 100
        child.sendintr()
        child.expect_exact("[stopped: Ctrl-C; the conversation goes on]")
        child.expect_exact(chat.PROMPT)
        child.sendline("still here?")
        child.expect(r"\d+ tokens, finish_reason=\w+")
        child.expect_exact(chat.PROMPT)
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert "Traceback" not in (child.before or "")
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus, child.before)
