"""Bounded memory for a long-lived engine: a request is kept until its result is taken --
``generate`` and streams take theirs, the loop API calls ``pop_result`` -- and a stream dropped
unfinished is cancelled and forgotten, even when the garbage collector drops it mid-step."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


@pytest.fixture()
def engine(tiny_model):
    return pt.Engine(tiny_model, backend="torch", max_slots=16, max_seq_len=32)


def serve(engine, n: int, start: int) -> None:
    """n requests through the loop API (1 or 2 tokens each), every tenth by generate and
    every tenth by a stream, results taken as they finish."""
    live = []
    for i in range(start, start + n):
        prompt = [1 + i % 90, 2 + i % 7]
        if i % 10 == 0:
            assert len(engine.generate([prompt], max_tokens=1)[0].token_ids) == 1
        elif i % 10 == 1:
            assert "".join(engine.stream(prompt, max_tokens=2)) == ""   # no tokenizer
        else:
            live.append(engine.add_request(prompt, max_tokens=1 + i % 2).request_id)
        if len(live) >= engine.max_slots:
            engine.run_until_done()
            for request_id in live:
                assert engine.pop_result(request_id).finish_reason == "length"
            live.clear()
            assert engine.num_requests == 0
    engine.run_until_done()
    for request_id in live:
        engine.pop_result(request_id)


@pytest.mark.parametrize("n", [pytest.param(10_000, marks=pytest.mark.slow), 1500])
def test_many_requests_leave_the_request_map_and_memory_flat(engine, n):
    serve(engine, 500, 0)                          # warm: caches, lazily built objects
    gc.collect()
    tracemalloc.start()
    try:
        serve(engine, 500, 500)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        serve(engine, n, 1000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert engine.num_requests == 0 and not engine.has_unfinished()
    # one kept Request (prompt, ids, pieces, times) is well over 500 bytes: n of them, MBs
    assert grown < 256 * 1024, f"memory grew by {grown} bytes over {n} requests"


def test_pop_result_forgets_and_result_only_reads(engine):
    request = engine.add_request([1, 2, 3], max_tokens=2)
    with pytest.raises(ValueError, match="still waiting.*pop_result"):
        engine.pop_result(request.request_id)
    engine.run_until_done()
    assert engine.result(request.request_id).finish_reason == "length"     # reading keeps it
    assert engine.num_requests == 1
    result = engine.pop_result(request.request_id)
    assert result.finish_reason == "length" and len(result.token_ids) == 2
    assert engine.num_requests == 0
    with pytest.raises(ValueError, match="no request with id"):
        engine.result(request.request_id)


def test_a_dropped_stream_is_cancelled_and_forgotten(engine):
    stream = engine.stream([1, 2, 3], max_tokens=20)
    next(iter(stream), None)
    request_id = stream.request_id
    del stream
    gc.collect()
    assert not engine.has_unfinished() and engine.num_requests == 0
    with pytest.raises(ValueError, match="no request with id"):
        engine.result(request_id)


def test_a_stream_collected_in_the_middle_of_a_step_is_cancelled_and_forgotten(engine):
    """The garbage collector may drop a stream while this thread is inside a step (here:
    from a cache listener); the cancel waits for the next step, and forgets the request."""
    stream = engine.stream([1, 2, 3], max_tokens=20)
    next(iter(stream), None)
    request_id = stream.request_id
    cycle = [stream]
    cycle.append(cycle)              # only the cycle collector frees it
    del stream, cycle
    collected = []

    def collect_once(event):
        if not collected:
            collected.append(gc.collect())

    engine.cache.add_listener(collect_once)
    assert len(engine.generate([[4, 5]], max_tokens=3)[0].token_ids) == 3
    assert collected and not engine.has_unfinished()
    assert engine.num_requests == 0
    with pytest.raises(ValueError, match="no request with id"):
        engine.result(request_id)
