"""``python -m paged_tutorial.serving`` as a process: it serves, and SIGTERM lets the request in
flight finish, then exits 0 (what a process manager's stop does)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from helpers.child_env import child_env
from tiny_chat_model import save_tiny_chat_model

pytest.importorskip("fastapi")

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, process, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}: "
                                 f"{process.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not become healthy")


@pytest.mark.parametrize("engine", ["process", "thread"])
def test_sigterm_drains_the_request_in_flight_and_exits_cleanly(tmp_path, chat_tokenizer,
                                                                engine):
    drains(tmp_path, chat_tokenizer, engine, signal.SIGTERM, to_the_group=False, status=0)


def test_ctrl_c_at_a_terminal_reaches_the_engine_process_too_and_still_drains(
        tmp_path, chat_tokenizer):
    """A terminal's Ctrl-C signals the whole process group, the engine's process included:
    that one leaves the decision to the server, which drains and exits 130."""
    drains(tmp_path, chat_tokenizer, "process", signal.SIGINT, to_the_group=True, status=130)


def drains(tmp_path, chat_tokenizer, engine: str, sig: int, to_the_group: bool,
           status: int) -> None:
    folder = save_tiny_chat_model(tmp_path / "tiny", chat_tokenizer)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = child_env()                 # this checkout first, then the caller's PYTHONPATH
    # on the CPU even where a GPU is: there the tiny model's answer would be streamed whole
    # before the signal could be sent, and nothing would be in flight
    env["CUDA_VISIBLE_DEVICES"] = ""
    process = subprocess.Popen(
        [sys.executable, "-m", "paged_tutorial.serving", "--model", str(folder),
         "--served-model-name", "tiny", "--backend", "torch", "--dtype", "float32",
         "--port", str(port), "--max-slots", "2", "--max-seq-len", "256",
         "--log-level", "warning", "--engine", engine],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        start_new_session=to_the_group)
    try:
        wait_healthy(url, process)
        body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 240,
                "temperature": 0, "stream": True, "ignore_eos": True}
        events, started = [], threading.Event()

        def read():
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
                        started.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert started.wait(60)
        if to_the_group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
        received_before = len(events)
        reader.join(120)
        assert not reader.is_alive()
        assert events[-1] == "[DONE]" and len(events) > received_before + 10
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert process.wait(timeout=120) == status
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        process.stdout.close()
        process.stderr.close()
