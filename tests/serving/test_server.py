"""The OpenAI-compatible server, driven by the official ``openai`` client against a server this
module starts on 127.0.0.1 (a free port; it stops when the module ends)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

import paged_tutorial as pt

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from paged_tutorial.serving.app import build_app  # noqa: E402
from paged_tutorial.serving.metrics import parse_metrics  # noqa: E402
from paged_tutorial.serving.server import BackgroundServer  # noqa: E402

MODEL_NAME = "tiny-chat"
MAX_SLOTS = 8


@pytest.fixture(scope="module")
def served(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=MAX_SLOTS, max_seq_len=128)
    with BackgroundServer(build_app(engine, MODEL_NAME)) as server:
        yield server, engine


@pytest.fixture(scope="module")
def client(served):
    server, _ = served
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60,
                         max_retries=0)


def metrics(server) -> dict:
    return parse_metrics(httpx.get(server.url + "/metrics", timeout=10).text)


def wait_idle(server, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = metrics(server)
        if m["num_requests_running"] == 0 and m["num_requests_waiting"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"the server did not go idle: {m}")


def test_models_health_and_metrics(served, client):
    server, engine = served
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert httpx.get(server.url + "/health").status_code == 200
    response = httpx.get(server.url + "/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    assert "# TYPE paged_tutorial_num_free_blocks gauge" in response.text
    m = parse_metrics(response.text)
    assert m["num_blocks"] == engine.cache.num_blocks
    assert m["num_free_blocks"] == engine.cache.num_free


def test_greedy_completions_equal_llm_generate(client, llm):
    prompts = ["Hello there", "The capital of France is"]
    expected = llm.generate(prompts, pt.SamplingParams(max_tokens=10))
    response = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=10,
                                         temperature=0)
    assert [c.text for c in sorted(response.choices, key=lambda c: c.index)] == \
        [o.outputs[0].text for o in expected]
    assert {c.finish_reason for c in response.choices} == {"length"}
    assert response.usage.completion_tokens == 20
    assert response.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in expected)


def test_greedy_chat_equals_llm_chat_streamed_or_not(client, llm):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    expected = llm.chat(messages, pt.SamplingParams(max_tokens=12))[0].outputs[0]
    whole = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12,
                                           temperature=0)
    assert whole.choices[0].message.content == expected.text
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12


def test_stop_strings_and_n_through_the_server(client, llm):
    full = llm.generate("Hello there", pt.SamplingParams(max_tokens=16))[0].outputs[0]
    stop = full.text[5:8]
    expected = llm.generate("Hello there", pt.SamplingParams(max_tokens=16,
                                                             stop=[stop]))[0].outputs[0]
    response = client.completions.create(model=MODEL_NAME, prompt="Hello there", max_tokens=16,
                                         temperature=0, stop=[stop], n=2)
    assert [(c.text, c.finish_reason) for c in response.choices] == \
        [(expected.text, "stop")] * 2


def solo_answers(model, prompts, max_tokens):
    """Each prompt alone on a one-slot engine: the tokens it must get in any batch."""
    engine = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=128)
    params = pt.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [engine.generate([p], params, chat=False)[0].text for p in prompts]


def test_64_concurrent_streaming_clients_all_get_their_solo_answers(served, tiny_model):
    server, _ = served
    prompts = [f"Client {i} asks about block {i * 7 % 13}" for i in range(64)]
    ids = [tiny_model.tokenizer.encode(p, add_special_tokens=True) for p in prompts]
    max_tokens = 6
    expected = solo_answers(tiny_model, ids, max_tokens)
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60,
                                 max_retries=0, http_client=httpx.AsyncClient(
                                     limits=httpx.Limits(max_connections=64), timeout=60))

    async def one(prompt):
        stream = await aclient.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0,
            stream=True, extra_body={"ignore_eos": True})
        pieces, reasons = [], []
        async for chunk in stream:
            pieces.append(chunk.choices[0].text)
            reasons.append(chunk.choices[0].finish_reason)
        return "".join(pieces), reasons[-1]

    async def all_of_them():
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(p) for p in prompts)), 120)
        finally:
            await aclient.close()

    before = metrics(server)
    answers = asyncio.run(all_of_them())
    assert [a for a, _ in answers] == expected
    assert {r for _, r in answers} == {"length"}
    after = wait_idle(server)
    assert after["requests_finished_total"] - before["requests_finished_total"] == 64
    assert after["num_free_blocks"] == after["num_blocks"]
    assert after["steps_total"] - before["steps_total"] < 64 * (max_tokens + 1)  # batched


def test_a_client_that_disconnects_mid_stream_cancels_its_request(served):
    server, engine = served
    before = wait_idle(server)
    body = {"model": MODEL_NAME, "prompt": "Tell me a long story", "max_tokens": 100,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            received = [next(lines) for _ in range(6)]     # a few events, then hang up
            assert any(line.startswith("data: {") for line in received)
            assert metrics(server)["num_free_blocks"] < before["num_blocks"]
    after = wait_idle(server)
    assert after["requests_cancelled_total"] == before["requests_cancelled_total"] + 1
    assert after["num_free_blocks"] == after["num_blocks"]
    assert after["generation_tokens_total"] - before["generation_tokens_total"] < 100
    assert engine.num_requests == 0


@pytest.mark.parametrize("body, status, param", [
    ({"model": MODEL_NAME, "prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ({"model": MODEL_NAME, "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"model": MODEL_NAME, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ({"model": MODEL_NAME, "prompt": "hi", "n": 0}, 400, "n"),
    ({"model": MODEL_NAME, "prompt": "hi", "n": 10 ** 6}, 400, "n"),
    ({"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1000}, 400, "max_tokens"),
    ({"model": MODEL_NAME, "prompt": [5] * 500}, 400, "prompt"),
    ({"model": MODEL_NAME, "prompt": [10 ** 8]}, 400, "prompt"),
    ({"model": MODEL_NAME, "prompt": 42}, 400, "prompt"),
    ({"model": MODEL_NAME, "prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    ({"model": MODEL_NAME, "prompt": "hi", "logprobs": 2, "stream": True}, 400, "logprobs"),
    ({"model": MODEL_NAME, "prompt": "hi", "echo": True}, 400, "echo"),
    ({"model": MODEL_NAME, "prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ({"model": MODEL_NAME, "prompt": "hi", "stop": [1]}, 400, "stop"),
    ({"model": MODEL_NAME, "prompt": "hi", "frobnicate": 1}, 400, "frobnicate"),
    ({"prompt": "hi"}, 400, "model"),
    ({"model": "gpt-4", "prompt": "hi"}, 404, "model"),
])
def test_bad_completion_requests_get_openai_style_errors(served, body, status, param):
    server, _ = served
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_malformed_bodies_and_unknown_routes_are_4xx_and_serving_goes_on(served, client):
    server, _ = served
    bad_json = httpx.post(server.url + "/v1/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]["message"]
    no_messages = httpx.post(server.url + "/v1/chat/completions",
                             json={"model": MODEL_NAME, "messages": []})
    assert no_messages.status_code == 400
    bad_message = httpx.post(server.url + "/v1/chat/completions",
                             json={"model": MODEL_NAME, "messages": [{"role": "user"}]})
    assert bad_message.status_code == 400
    missing = httpx.get(server.url + "/v1/nothing")
    assert missing.status_code == 404 and "error" in missing.json()
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=0)
    ok = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason == "length" and ok.usage.completion_tokens == 2
    assert httpx.get(server.url + "/health").status_code == 200
    assert json.loads(httpx.get(server.url + "/v1/models").text)["data"][0]["id"] == MODEL_NAME


@pytest.mark.slow
def test_the_embedded_smollm2_answers_the_same_through_the_server(smollm2_f32):
    llm = pt.LLM(smollm2_f32, backend="torch", max_num_seqs=2, max_model_len=256)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    expected = llm.chat(messages, pt.SamplingParams(max_tokens=16))[0].outputs[0]
    with BackgroundServer(build_app(llm.engine, "smollm2")) as server:
        smol = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120,
                             max_retries=0)
        answer = smol.chat.completions.create(model="smollm2", messages=messages, max_tokens=16,
                                              temperature=0)
    assert answer.choices[0].message.content == expected.text
    assert "Paris" in expected.text
