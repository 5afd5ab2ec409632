"""The server's API key, prefix-cache figures, vLLM's metric names, its streamed chunks matching
OpenAI's types, and one hand-off per engine step to the event loop."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

import paged_tutorial as pt

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from paged_tutorial.serving.api_models import ChatCompletionChunk, CompletionChunk  # noqa: E402
from paged_tutorial.serving.app import ChunkWriter, build_app  # noqa: E402
from paged_tutorial.serving.engine_loop import EngineLoop  # noqa: E402
from paged_tutorial.serving.metrics import parse_metrics  # noqa: E402
from paged_tutorial.serving.server import BackgroundServer  # noqa: E402

NAME = "tiny-chat"


def test_with_an_api_key_v1_routes_want_the_bearer_header(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=128)
    with BackgroundServer(build_app(engine, NAME, api_key="sesame")) as server:
        wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="open", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.completions.create(model=NAME, prompt="hi", max_tokens=2)
        assert refused.value.status_code == 401
        assert refused.value.body["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        bare = httpx.post(server.url + "/v1/chat/completions", json={
            "model": NAME, "messages": [{"role": "user", "content": "hi"}]})
        assert bare.status_code == 401 and bare.json()["error"]["type"]
        right = openai.OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
        answer = right.completions.create(model=NAME, prompt="hi", max_tokens=2, temperature=0)
        assert answer.usage.completion_tokens == 2
        assert httpx.get(server.url + "/health").status_code == 200      # open to probes
        assert httpx.get(server.url + "/metrics").status_code == 200


def test_cached_tokens_and_prefix_cache_counters_report_the_reused_prompt(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=128,
                       prefix_caching=True)
    prompt = [(7 * i) % 500 + 3 for i in range(40)]            # 2 full blocks of 16, and 8
    with BackgroundServer(build_app(engine, NAME)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        first = client.completions.create(model=NAME, prompt=prompt, max_tokens=3,
                                          temperature=0)
        again = client.completions.create(model=NAME, prompt=prompt, max_tokens=3,
                                          temperature=0)
        streamed = list(client.completions.create(
            model=NAME, prompt=prompt, max_tokens=3, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        m = parse_metrics(httpx.get(server.url + "/metrics").text)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 32
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == 32
    assert again.choices[0].text == first.choices[0].text
    assert m["prefix_cache_queries_total"] == 3 * 40
    assert m["prefix_cache_hits_total"] == 64
    assert m["prompt_tokens_total"] == 3 * 40


def test_metrics_carry_vllms_names_and_count_answers_by_finish_reason(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=128)
    with BackgroundServer(build_app(engine, NAME)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        client.completions.create(model=NAME, prompt=["a b", "c d"], max_tokens=4,
                                  temperature=0, extra_body={"ignore_eos": True})
        text = httpx.get(server.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count", "paged_tutorial_num_free_blocks"):
        assert name in text, name
    assert f'vllm:num_requests_running{{model_name="{NAME}"}} 0.0' in text
    m = parse_metrics(text)
    assert m["request_success_total{finished_reason=length}"] == 2
    assert m["generation_tokens_total"] == 8
    assert m["kv_cache_usage_perc"] == 0.0
    assert m["time_to_first_token_seconds_count"] == 1          # one HTTP request
    assert m["num_free_blocks"] == m["num_blocks"] == engine.cache.num_blocks


@pytest.mark.parametrize("chat", [False, True])
def test_a_text_chunk_written_from_its_template_is_the_openai_type_s_json(chat):
    head = dict(id="cmpl-1", created=17, model='odd "name"')
    writer = ChunkWriter(head, chat)
    text = 'quote " newline \n 한국어 \\ tab \t'
    event = writer.text(3, text)
    assert event.startswith("data: ") and event.endswith("\n\n")
    parsed = json.loads(event[len("data: "):])
    model = ChatCompletionChunk if chat else CompletionChunk
    choice = ({"index": 3, "delta": {"content": text}} if chat else {"index": 3, "text": text})
    expected = json.loads(model(**head, choices=[choice]).model_dump_json())
    expected.pop("usage")
    assert parsed == expected


def test_the_engine_thread_hands_over_each_step_s_events_in_one_call(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=8, max_seq_len=128)
    loop = EngineLoop(engine)
    deliveries, done = [], threading.Event()
    loop.start(deliver=lambda calls: (deliveries.append(len(calls)),
                                      [on_event(e) for on_event, e in calls]))
    finished = []

    def on_event(event):
        if event[0] == "finish":
            finished.append(event)
            if len(finished) == 8:
                done.set()

    params = pt.SamplingParams(max_tokens=5, ignore_eos=True)
    for i in range(8):
        loop.submit([5 + i, 6, 7], params, on_event)
    assert done.wait(60)
    loop.stop(30)
    assert sum(deliveries) >= 8 * 6                   # 5 deltas and a finish each, at least
    assert len(deliveries) <= 2 * 6                   # about one hand-off per step


def test_logprobs_and_penalties_take_openais_shapes_and_equal_llm_generate(tiny_model, llm):
    params = pt.SamplingParams(max_tokens=6, logprobs=3, presence_penalty=1.5,
                               frequency_penalty=0.5, repetition_penalty=1.3)
    expected = llm.generate("Hello there", params)[0].outputs[0]
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=128)
    with BackgroundServer(build_app(engine, NAME)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        completion = client.completions.create(
            model=NAME, prompt="Hello there", max_tokens=6, temperature=0, logprobs=3,
            presence_penalty=1.5, frequency_penalty=0.5,
            extra_body={"repetition_penalty": 1.3}).choices[0]
        chat_expected = llm.chat([{"role": "user", "content": "Hi"}], pt.SamplingParams(
            max_tokens=5, logprobs=2))[0].outputs[0]
        chat = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
            temperature=0, logprobs=True, top_logprobs=2).choices[0]
        refused = httpx.post(server.url + "/v1/chat/completions", json={
            "model": NAME, "messages": [{"role": "user", "content": "Hi"}],
            "top_logprobs": 2})
    assert completion.text == expected.text
    chosen = [next(iter(p.values())) for p in expected.logprobs]
    assert completion.logprobs.token_logprobs == pytest.approx([c.logprob for c in chosen])
    assert completion.logprobs.tokens == [c.decoded_token for c in chosen]
    assert "".join(completion.logprobs.tokens) == completion.text
    assert completion.logprobs.text_offset[0] == 0
    assert all(len(top) == 3 for top in completion.logprobs.top_logprobs)
    assert chat.message.content == chat_expected.text
    content = chat.logprobs.content
    assert [c.token for c in content] == [next(iter(p.values())).decoded_token
                                          for p in chat_expected.logprobs]
    assert all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob for c in content)
    assert all(c.bytes == list(c.token.encode()) for c in content)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "top_logprobs"


def test_an_engine_with_async_scheduling_serves_streams_stops_and_cancels(tiny_model):
    """The server over an engine that launches each decode step ahead: answers equal the
    engine's without it, streams cut by a stop string or closed mid-answer end cleanly, and
    afterwards every block is free again."""
    sync = pt.LLM(tiny_model, backend="torch", max_num_seqs=3, max_model_len=128)
    prompts = ["a b c", "d e f g", "h i"]
    expected = [o.outputs[0].text for o in sync.generate(prompts, pt.SamplingParams(
        max_tokens=12, ignore_eos=True))]
    stop = expected[1][4:7]
    engine = pt.Engine(tiny_model, backend="torch", max_slots=3, max_seq_len=128,
                       async_scheduling=True)
    with BackgroundServer(build_app(engine, NAME)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        answer = client.completions.create(model=NAME, prompt=prompts, max_tokens=12,
                                           temperature=0, extra_body={"ignore_eos": True})
        stopped = client.completions.create(model=NAME, prompt=prompts[1], max_tokens=12,
                                            temperature=0, stop=[stop],
                                            extra_body={"ignore_eos": True})
        stream = client.completions.create(model=NAME, prompt=prompts[0], max_tokens=40,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))
        stream.close()                                    # the client leaves mid-answer
        again = client.completions.create(model=NAME, prompt=prompts[2], max_tokens=12,
                                          temperature=0, extra_body={"ignore_eos": True})
        m = parse_metrics(httpx.get(server.url + "/metrics").text)
    assert [c.text for c in sorted(answer.choices, key=lambda c: c.index)] == expected
    assert stopped.choices[0].text == expected[1][:expected[1].index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    assert again.choices[0].text == expected[2]
    assert engine.core.steps_ahead > 0
    assert m["num_free_blocks"] == engine.cache.NUM_BLOCKS


def test_a_stopped_server_lets_go_of_its_engine(tiny_model):
    """FastAPI keeps the endpoints it has seen in process-wide caches: a stopped application
    must not keep its engine (and its KV cache: 2 GiB on a GPU) alive through them, and
    starting it again says to build a new one."""
    import gc
    import weakref

    def serve_once():
        engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=128)
        app = build_app(engine, NAME)
        with BackgroundServer(app) as server:
            answer = httpx.post(server.url + "/v1/completions", json={
                "model": NAME, "prompt": "hi", "max_tokens": 2, "temperature": 0})
            assert answer.status_code == 200
        return weakref.ref(engine), app

    engine, app = serve_once()
    gc.collect()
    assert engine() is None, "the stopped server's engine is still reachable"
    with pytest.raises(RuntimeError, match="startup failed"):
        with BackgroundServer(app):
            pass
