"""The engine in a process of its own (``EngineProcess``): it serves what the engine on a thread
serves, token for token, and every way it can end leaves the server told and nothing running."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from helpers.child_env import child_env
from tiny_chat_model import save_tiny_chat_model

pytest.importorskip("fastapi")

from paged_tutorial.engine.sampling_params import SamplingParams  # noqa: E402
from paged_tutorial.serving.app import build_app  # noqa: E402
from paged_tutorial.serving.engine_process import EngineProcess, EngineRecipe  # noqa: E402
from paged_tutorial.serving.server import BackgroundServer  # noqa: E402

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def recipe(tmp_path_factory, chat_tokenizer):
    folder = save_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "tiny", chat_tokenizer)
    return EngineRecipe(str(folder), backend="torch", dtype="float32", max_slots=4,
                        max_seq_len=128, warm_up=False)


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def metric(text: str, name: str) -> float:
    line, = [line for line in text.splitlines() if line.startswith(name + "{")]
    return float(line.rsplit(" ", 1)[1])


def answers(app) -> dict:
    """A greedy completion, a streamed one, two seeded chat answers, a JSON-schema answer and
    the token counters of /metrics afterwards."""
    with BackgroundServer(app) as server:
        client = client_of(server)
        got = {"greedy": client.completions.create(model="tiny", prompt="Once upon a time",
                                                   max_tokens=12, temperature=0)
               .choices[0].text}
        stream = client.completions.create(model="tiny", prompt="The block table",
                                           max_tokens=12, temperature=0, stream=True)
        got["streamed"] = "".join(c.choices[0].text for c in stream if c.choices)
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=10, n=2,
            seed=3, temperature=1.0)
        got["chat"] = [c.message.content for c in chat.choices]
        schema = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "a number, as JSON"}],
            max_tokens=16, temperature=0,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "number", "schema": SCHEMA}})
        got["json"] = schema.choices[0].message.content
        text = httpx.get(server.url + "/metrics").text
        got["metrics"] = [metric(text, name) for name in ("vllm:generation_tokens_total",
                                                          "vllm:prompt_tokens_total")]
    return got


def test_the_process_serves_what_the_thread_serves(recipe):
    """Same tokens both ways (the JSON grammar rebuilt in the child masks the same tokens),
    same counters; the server's shutdown ends the child cleanly."""
    on_a_thread = answers(build_app(recipe.build(), "tiny"))
    engine_process = EngineProcess(recipe)
    assert engine_process.alive and engine_process.frontend.max_seq_len == 128
    in_a_process = answers(build_app(engine_process.frontend, "tiny", engine_process))
    assert in_a_process == on_a_thread
    assert in_a_process["json"].startswith("{")
    assert in_a_process["metrics"][0] >= 12 + 12      # the two completions at least
    assert not engine_process.alive and engine_process.failure is None
    assert engine_process.pid is not None and not _running(engine_process.pid)


def test_refusals_and_a_dropped_stream_leave_the_child_idle(recipe):
    engine_process = EngineProcess(recipe)
    with BackgroundServer(build_app(engine_process.frontend, "tiny", engine_process)) as server:
        client = client_of(server)
        with pytest.raises(openai.BadRequestError, match="max_seq_len is 128"):
            client.completions.create(model="tiny", prompt=[1] * 200, max_tokens=4)
        body = {"model": "tiny", "prompt": "Once", "max_tokens": 100, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body,
                          timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    break                        # the client goes away after its first chunk
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stats = engine_process.stats()
            if stats.jobs_cancelled == 1 and stats.running == 0 and stats.waiting == 0:
                break
            time.sleep(0.05)
        stats = engine_process.stats()
        assert (stats.jobs_cancelled, stats.running, stats.waiting) == (1, 0, 0)
        assert stats.free_blocks == stats.total_blocks
        answer = client.completions.create(model="tiny", prompt="Once", max_tokens=3)
        assert answer.usage.completion_tokens == 3


def test_a_child_that_dies_fails_the_open_streams_and_the_health_check(recipe):
    engine_process = EngineProcess(recipe)
    with BackgroundServer(build_app(engine_process.frontend, "tiny", engine_process)) as server:
        body = {"model": "tiny", "prompt": "Once", "max_tokens": 120, "ignore_eos": True,
                "stream": True}
        events = []
        with httpx.stream("POST", server.url + "/v1/completions", json=body,
                          timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 1:
                        os.kill(engine_process.pid, signal.SIGKILL)
        assert any("the engine process ended unexpectedly" in e for e in events), events[-3:]
        assert httpx.get(server.url + "/health").status_code == 503
        with pytest.raises(openai.APIStatusError):
            client_of(server).completions.create(model="tiny", prompt="Once", max_tokens=3)
        with pytest.raises(RuntimeError):          # never a broken pipe
            engine_process.submit([1, 2], SamplingParams(max_tokens=1), lambda event: None)
    assert "exit code -9" in str(engine_process.failure)


def test_a_job_for_a_child_that_has_died_is_refused_as_a_stopped_server(recipe):
    """Before anyone has read the end of its pipe: a RuntimeError (a 503), not a broken pipe."""
    engine_process = EngineProcess(recipe)
    os.kill(engine_process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _running(engine_process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(RuntimeError, match="the engine process has stopped"):
        engine_process.submit([1, 2], SamplingParams(max_tokens=1), lambda event: None)
    engine_process.stop(timeout=10)
    assert "exit code -9" in str(engine_process.failure)


class Unbuildable:
    """A logits processor that pickles in the server's process and cannot be rebuilt in the
    engine's."""

    def __call__(self, output_token_ids, logits):
        return logits

    def __reduce__(self):
        return _refuse, ("this processor exists only in the server's process",)


def _refuse(message):
    raise RuntimeError(message)


def test_a_processor_the_child_cannot_rebuild_refuses_its_job_alone(recipe):
    engine_process = EngineProcess(recipe)
    events = {"bad": queue.Queue(), "good": queue.Queue()}
    engine_process.start()
    try:
        engine_process.submit([1, 2], SamplingParams(max_tokens=2, logits_processors=[
            Unbuildable()]), events["bad"].put)
        engine_process.submit([1, 2], SamplingParams(max_tokens=2), events["good"].put)
        kind, message = events["bad"].get(timeout=60)
        assert kind == "rejected" and "exists only in the server's process" in message
        got = [events["good"].get(timeout=60)[0]]
        while got[-1] != "finish":
            got.append(events["good"].get(timeout=60)[0])
        assert engine_process.alive
    finally:
        engine_process.stop(timeout=30)
    assert engine_process.failure is None


def test_a_model_the_child_cannot_load_is_the_servers_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises((FileNotFoundError, ValueError), match="no-such-model"):
        EngineProcess(EngineRecipe(str(missing), backend="torch", warm_up=False))


def test_the_child_ends_when_the_server_process_is_killed(recipe, tmp_path):
    script = ("import sys, time\n"
              "from paged_tutorial.serving.engine_process import EngineProcess, EngineRecipe\n"
              "if __name__ == '__main__':\n"
              f"    child = EngineProcess(EngineRecipe({recipe.model!r}, backend='torch', "
              "warm_up=False, max_seq_len=128))\n"
              "    print(child.pid, flush=True)\n"
              "    time.sleep(600)\n")
    path = tmp_path / "server.py"
    path.write_text(script)
    server = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, text=True,
                              env=child_env())
    try:
        child_pid = int(server.stdout.readline())
        assert _running(child_pid)
        server.kill()
        server.wait(30)
        deadline = time.monotonic() + 30
        while _running(child_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(child_pid)
    finally:
        if server.poll() is None:
            server.kill()
        server.stdout.close()


def _running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped (a killed process's main
    thread turns zombie before its other threads have exited and closed its files)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z" or int(fields[17]) > 1          # state, num_threads
    except FileNotFoundError:
        return False
    except OSError:                              # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
