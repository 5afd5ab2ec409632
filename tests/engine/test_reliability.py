"""Reliability: bad input gets a clear error and leaves the engine usable; a full cache
preempts instead of failing; block ownership stays exact under random request streams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


def make_engine(model, **kw):
    kw.setdefault("max_slots", 2)
    kw.setdefault("max_seq_len", 96)
    return pt.Engine(model, backend="torch", **kw)


def solo_tokens(model, prompt, n, max_seq_len=96):
    engine = make_engine(model, max_slots=1, max_seq_len=max_seq_len)
    return engine.generate([prompt], max_tokens=n)[0].token_ids


# --- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=-1), "max_tokens must be an integer from 1 to 16777216"),
    (dict(max_tokens=0), "max_tokens must be an integer from 1 to"),
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(temperature=float("nan")), "temperature"),
])
def test_bad_sampling_arguments(tiny_model, kwargs, match):
    engine = make_engine(tiny_model)
    with pytest.raises(ValueError, match=match):
        engine.generate([[1, 2, 3]], **kwargs)
    assert engine.generate([[1, 2, 3]], max_tokens=3)[0].finish_reason == "length"


@pytest.mark.parametrize("prompt, match", [
    ([], "empty prompt"),
    ("", "empty prompt"),
    ([1, 97], "token id 97 at position 1 is outside the vocabulary"),
    ([-3], "token id -3 at position 0 is outside the vocabulary"),
    ("hello", "has no tokenizer"),
])
def test_bad_prompts_leave_engine_usable(tiny_model, prompt, match):
    engine = make_engine(tiny_model)
    good = [5, 6, 7]
    with pytest.raises(ValueError, match=match):
        engine.generate([good, prompt], max_tokens=4)
    # nothing was queued, the cache is intact, and the engine still works
    assert not engine.has_unfinished()
    assert len(engine.cache.free_blocks) == engine.cache.NUM_BLOCKS
    assert engine.generate([good], max_tokens=4)[0].token_ids == solo_tokens(tiny_model, good, 4)


def test_prompt_longer_than_max_seq_len_is_refused_not_truncated(tiny_model):
    engine = make_engine(tiny_model, max_seq_len=32)
    with pytest.raises(ValueError, match="the prompt has 40 tokens but max_seq_len is 32"):
        engine.generate([[1, 2], list(range(40))], max_tokens=4)
    assert not engine.has_unfinished()                 # the good prompt was not queued either
    assert engine.generate([[1, 2]], max_tokens=4)[0].finish_reason == "length"


def test_request_larger_than_whole_cache_fails_at_once(tiny_model):
    # 4 blocks of 16 tokens in all; 2 layers -> one sequence can hold 32 tokens at most
    block_bytes = 2 * 16 * TINY.kv_dim * 4
    engine = make_engine(tiny_model, kv_cache_bytes=4 * block_bytes)
    with pytest.raises(ValueError, match="raise kv_cache_bytes"):
        engine.generate([[1] * 20], max_tokens=30)
    assert engine.generate([[1] * 10], max_tokens=5)[0].finish_reason == "length"


# --- cache exhaustion -----------------------------------------------------------------------
def test_preemption_when_cache_runs_out(tiny_model):
    block_bytes = 2 * 16 * TINY.kv_dim * 4
    # 8 blocks = 4 logical blocks per layer: two 30-token requests cannot both grow to 50
    engine = make_engine(tiny_model, kv_cache_bytes=8 * block_bytes)
    prompts = [list(range(1, 31)), list(range(31, 61))]
    steps = []
    results = engine.generate(prompts, max_tokens=20,
                              on_step=lambda r: (engine.cache.check_invariants(), steps.append(r)))
    assert sum(r.num_preemptions for r in results) >= 1
    assert any(s.preempted for s in steps)
    for p, r in zip(prompts, results):
        assert r.token_ids == solo_tokens(tiny_model, p, 20)
        assert r.finish_reason == "length"
    assert (engine.cache.block_table == -1).all()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_cancel_returns_blocks_at_once(tiny_model, async_scheduling):
    engine = make_engine(tiny_model, async_scheduling=async_scheduling)
    a = engine.add_request([1, 2, 3] * 7, max_tokens=50)
    b = engine.add_request([4, 5], max_tokens=50)
    for _ in range(4):
        engine.step()
    owned_by_a = engine.cache.blocks_owned(a.slot)
    free_before = engine.cache.num_free
    engine.cancel(a.request_id)
    assert engine.cache.num_free == free_before + owned_by_a
    engine.cache.check_invariants()
    engine.run_until_done()
    assert engine.result(a.request_id).finish_reason == "cancelled"
    assert engine.result(b.request_id).finish_reason == "length"
    assert len(engine.cache.free_blocks) == engine.cache.NUM_BLOCKS


# --- property: random request streams -------------------------------------------------------
request_st = st.tuples(st.integers(0, 6),          # arrival step
                       st.integers(1, 40),         # prompt length
                       st.integers(1, 24))         # max_tokens


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(requests=st.lists(request_st, min_size=1, max_size=5),
       cache_blocks=st.integers(6, 24), slots=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_random_request_streams_keep_blocks_exact(tiny_model, requests, cache_blocks, slots, seed):
    block_bytes = 2 * 16 * TINY.kv_dim * 4
    engine = make_engine(tiny_model, max_slots=slots, kv_cache_bytes=cache_blocks * block_bytes,
                         max_seq_len=64)
    cache = engine.cache
    rng = np.random.default_rng(seed)
    pending = sorted(((arr, rng.integers(0, 97, plen).tolist(), n)
                      for arr, plen, n in requests), key=lambda x: x[0])
    # requests that cannot fit even in an empty cache must be refused at once
    submitted = []
    step = 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, n = pending.pop(0)
            worst = min(len(prompt) + n, 64)
            if -(-worst // 16) * TINY.num_hidden_layers > cache.NUM_BLOCKS:
                with pytest.raises(ValueError):
                    engine.add_request(prompt, max_tokens=n)
                continue
            submitted.append((engine.add_request(prompt, max_tokens=n), prompt, n))
        engine.step()
        step += 1
        cache.check_invariants()
        table = cache.block_table
        assert ((table == -1) | ((table >= 0) & (table < cache.NUM_BLOCKS))).all()
    assert (cache.block_table == -1).all()
    assert sorted(cache.free_blocks) == list(range(cache.NUM_BLOCKS))
    for request, prompt, n in submitted:
        res = engine.result(request.request_id)
        expected = solo_tokens(tiny_model, prompt, n, max_seq_len=64)
        assert res.token_ids == expected
