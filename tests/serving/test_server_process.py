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


def test_sigterm_drains_the_request_in_flight_and_exits_cleanly(tmp_path, chat_tokenizer):
    folder = save_tiny_chat_model(tmp_path / "tiny", chat_tokenizer)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = child_env()                 # this checkout first, then the caller's PYTHONPATH
    process = subprocess.Popen(
        [sys.executable, "-m", "paged_tutorial.serving", "--model", str(folder),
         "--served-model-name", "tiny", "--backend", "torch", "--dtype", "float32",
         "--port", str(port), "--max-slots", "2", "--max-seq-len", "128",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        wait_healthy(url, process)
        body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 120,
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
        process.send_signal(signal.SIGTERM)
        received_before = len(events)
        reader.join(120)
        assert not reader.is_alive()
        assert events[-1] == "[DONE]" and len(events) > received_before + 10
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert process.wait(timeout=120) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        process.stdout.close()
        process.stderr.close()
