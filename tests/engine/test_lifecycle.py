"""The engine survives whatever happens mid-run: exceptions in callbacks and in the
model, Ctrl-C, abandoned streams, threads, re-entrant calls.  After each, the engine is idle
and consistent (empty queue, every block free) and every other request gets the tokens it
gets alone."""

from __future__ import annotations

import copy
import gc
import threading

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig
from helpers.streams import Boom, SwitchableFailure, drive
from helpers.threads import generate_in_threads

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
PROMPTS = [[1, 2, 3, 4, 5], list(range(10, 31)), [7] * 9]


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


def make_engine(model, backend="torch", **kw):
    kw.setdefault("max_slots", 2)
    kw.setdefault("max_seq_len", 96)
    return pt.Engine(model, backend=backend, **kw)


@pytest.fixture(scope="module")
def solo(tiny_model):
    cache = {}

    def get(prompt, n, **params):
        key = (tuple(prompt), n, tuple(sorted(params.items())))
        if key not in cache:
            engine = make_engine(tiny_model, max_slots=1)
            cache[key] = engine.generate([prompt], max_tokens=n, **params)[0].token_ids
        return cache[key]

    return get


def assert_idle(engine):
    engine.cache.check_invariants()
    engine.scheduler.check_invariants()
    assert not engine.has_unfinished()
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert (engine.cache.block_table == -1).all()
    assert sorted(engine.cache.free_blocks) == list(range(engine.cache.NUM_BLOCKS))


class FailingBackend(pt.RecordingBackend):
    """Raises a copy of ``exc`` from inside the forward pass at the ``at``-th call of ``op``
    (a copy: raising the parametrized instance itself would chain every test's traceback onto
    it, and with them every engine those frames hold)."""

    def __init__(self, exc, op="decode_attention", at=3):
        self.count = 0

        def on_call(call):
            if call.name == op:
                self.count += 1
                if self.count == at:
                    raise copy.copy(exc)
        super().__init__("torch", ops=[op], on_call=on_call)


class ScriptedSampler(pt.RecordingBackend):
    """Samples the given token ids in order, whatever the logits say."""

    def __init__(self, script):
        super().__init__("torch", ops=["sample"])
        self.script = list(script)

    def sample(self, logits, temperature, top_p, uniforms):
        ids = [self.script.pop(0) for _ in range(logits.shape[0])]
        return torch.tensor(ids, dtype=torch.int64)


# --- 1. exceptions while generate runs --------------------------------------------------------
@pytest.mark.parametrize("where", ["on_token", "on_step"])
def test_callback_exception_cancels_the_call_and_spares_the_batch_mate(tiny_model, solo, where):
    engine = make_engine(tiny_model)
    other = engine.add_request(PROMPTS[1], max_tokens=12)
    seen = []

    def on_token(i, tok, piece):
        seen.append(tok)
        if len(seen) == 3:
            raise Boom("from on_token")

    def on_step(report):
        if report.index == 3:
            raise Boom("from on_step")

    kw = {"on_token": on_token} if where == "on_token" else {"on_step": on_step}
    with pytest.raises(Boom):
        engine.generate([PROMPTS[0]], max_tokens=20, **kw)
    # the call's request is gone; the other one keeps running and gets its solo tokens
    assert [r.request_id for r in engine.scheduler.running] == [other.request_id]
    engine.run_until_done()
    assert engine.result(other.request_id).token_ids == solo(PROMPTS[1], 12)
    assert_idle(engine)
    assert engine.generate([PROMPTS[2]], max_tokens=5)[0].token_ids == solo(PROMPTS[2], 5)


@pytest.mark.parametrize("exc", [Boom("in the model"), KeyboardInterrupt()])
@pytest.mark.parametrize("op, at", [("decode_attention", 3), ("prefill_attention", 2),
                                    ("sample", 1)])
def test_failure_inside_the_model_rolls_the_step_back(tiny_model, solo, exc, op, at):
    backend = FailingBackend(exc, op=op, at=at)
    engine = make_engine(tiny_model, backend=backend)
    other = engine.add_request(PROMPTS[2], max_tokens=10)
    with pytest.raises(type(exc)):
        engine.generate([PROMPTS[0]], max_tokens=10)
    engine.cache.check_invariants()
    engine.scheduler.check_invariants()
    # the batch-mate was preempted by the rollback and is recomputed to the same tokens
    engine.run_until_done()
    assert engine.result(other.request_id).token_ids == solo(PROMPTS[2], 10)
    assert_idle(engine)


def test_step_count_advances_only_on_success(tiny_model):
    engine = make_engine(tiny_model, backend=FailingBackend(Boom(), op="sample", at=2))
    engine.add_request(PROMPTS[0], max_tokens=4)
    engine.step()
    assert engine.step_count == 1
    with pytest.raises(Boom):
        engine.step()
    assert engine.step_count == 1
    engine.run_until_done()
    assert_idle(engine)


def test_wrong_arity_callback_is_refused_before_queueing(tiny_model):
    engine = make_engine(tiny_model)
    with pytest.raises(TypeError, match="on_token"):
        engine.generate([PROMPTS[0]], on_token=lambda tok: None)
    with pytest.raises(TypeError, match="on_step must be callable"):
        engine.generate([PROMPTS[0]], on_step=3)
    assert_idle(engine)


@pytest.mark.parametrize("call", ["generate", "step", "stream"])
def test_reentrant_calls_from_a_callback_raise_and_leave_the_engine_idle(tiny_model, call):
    engine = make_engine(tiny_model)

    def on_token(i, tok, piece):
        if call == "generate":
            engine.generate([PROMPTS[2]], max_tokens=2)
        elif call == "step":
            engine.step()
        else:
            engine.stream(PROMPTS[2], max_tokens=2)

    with pytest.raises(RuntimeError, match="from inside a callback"):
        engine.generate([PROMPTS[0]], max_tokens=5, on_token=on_token)
    assert_idle(engine)


def test_cancel_and_add_request_are_allowed_inside_a_callback(tiny_model, solo):
    engine = make_engine(tiny_model)
    victim = engine.add_request(PROMPTS[1], max_tokens=30)
    added = []

    def on_token(i, tok, piece):
        if not added:
            engine.cancel(victim.request_id)
            added.append(engine.add_request(PROMPTS[2], max_tokens=4))

    res = engine.generate([PROMPTS[0]], max_tokens=6, on_token=on_token)[0]
    assert res.token_ids == solo(PROMPTS[0], 6)
    assert engine.result(victim.request_id).finish_reason == "cancelled"
    engine.run_until_done()
    assert engine.result(added[0].request_id).token_ids == solo(PROMPTS[2], 4)
    assert_idle(engine)


# --- 2. streams ------------------------------------------------------------------------------
def test_leaving_a_stream_early_cancels_its_request(smollm2_f32):
    engine = pt.Engine(smollm2_f32, backend="torch", max_slots=2, max_seq_len=256)
    other = engine.add_request("Name three colors.", max_tokens=8)
    stream = engine.stream("Tell me a long story about a cat.", max_tokens=60)
    for _ in stream:
        break
    assert engine.cache.num_free < engine.cache.NUM_BLOCKS        # still holds its blocks
    stream.close()
    assert stream.result.finish_reason == "cancelled"
    assert stream.result.text and len(stream.result.token_ids) < 60
    engine.run_until_done()
    solo = pt.Engine(smollm2_f32, backend="torch", max_slots=1, max_seq_len=256)
    assert engine.result(other.request_id).token_ids == \
        solo.generate(["Name three colors."], max_tokens=8)[0].token_ids
    assert_idle(engine)


def test_an_abandoned_stream_is_cancelled_when_collected(tiny_model):
    engine = make_engine(tiny_model)
    stream = engine.stream(PROMPTS[0], max_tokens=40)
    engine.step()                                # prefill: it holds a slot and blocks now
    assert engine.cache.num_free < engine.cache.NUM_BLOCKS
    del stream
    gc.collect()
    assert_idle(engine)
    assert engine.generate([PROMPTS[2]], max_tokens=3)[0].finish_reason == "length"


def test_stream_with_context_manager_and_too_long_prompt(tiny_model):
    engine = make_engine(tiny_model, max_seq_len=32)
    with pytest.raises(ValueError, match="the prompt has 40 tokens but max_seq_len is 32"):
        engine.stream(list(range(40)), max_tokens=4)
    with engine.stream(PROMPTS[0], max_tokens=30) as stream:
        engine.step()
    assert stream.result.finish_reason == "cancelled"
    assert_idle(engine)


def test_streamed_text_equals_result_text_when_a_character_is_cut(smollm2_f32):
    tok = smollm2_f32.tokenizer
    ids = tok.encode("é😀 ok")
    cut = next(n for n in range(1, len(ids)) if "\ufffd" in tok.decode(ids[:n]))
    engine = pt.Engine(smollm2_f32, backend=ScriptedSampler(ids), max_slots=1, max_seq_len=64)
    stream = engine.stream("Hi", max_tokens=cut)
    streamed = "".join(stream)
    assert streamed == stream.result.text == tok.decode(ids[:cut])
    assert streamed.endswith("\ufffd")
    pieces = []
    engine2 = pt.Engine(smollm2_f32, backend=ScriptedSampler(ids), max_slots=1,
                        max_seq_len=64)
    res = engine2.generate(["Hi"], max_tokens=cut,
                           on_token=lambda i, t, p: pieces.append(p))[0]
    assert "".join(pieces) == res.text == streamed


# --- 3. arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(seed=-1, temperature=0.8), "seed must be None or an integer"),
    (dict(seed=1.7), "seed must be None or an integer"),
    (dict(seed=True), "seed must be None or an integer"),
    (dict(max_tokens=2.0), "max_tokens must be an integer"),
    (dict(max_tokens=True), "max_tokens must be an integer"),
    (dict(temperature="0.5"), "temperature"),
    (dict(top_p=float("nan")), "top_p"),
])
def test_bad_sampling_params_are_refused_up_front(tiny_model, kwargs, match):
    engine = make_engine(tiny_model)
    with pytest.raises(ValueError, match=match):
        engine.generate([PROMPTS[0]], **kwargs)
    with pytest.raises(ValueError, match=match):
        pt.SamplingParams(**kwargs)
    assert_idle(engine)


@pytest.mark.parametrize("prompt", [[5.9, 6.2], np.array([5.0, 6.0]), ["5", "6"], [True, 3],
                                    torch.tensor([1.0, 2.0]), np.array([True, False])])
def test_token_ids_are_never_coerced(tiny_model, prompt):
    engine = make_engine(tiny_model)
    with pytest.raises(TypeError, match="token ids must be integers"):
        engine.generate([prompt], max_tokens=2)
    assert_idle(engine)


def test_integer_arrays_are_fine(tiny_model, solo):
    engine = make_engine(tiny_model)
    a, b = engine.generate([np.array(PROMPTS[0], dtype=np.int64),
                            torch.tensor(PROMPTS[0], dtype=torch.int32)], max_tokens=4)
    assert a.token_ids == b.token_ids == solo(PROMPTS[0], 4)


def test_a_tiny_temperature_is_greedy_not_nan(tiny_model, solo):
    engine = make_engine(tiny_model)
    res = engine.generate([PROMPTS[0]], max_tokens=8, temperature=1e-39, seed=3)[0]
    assert res.token_ids == solo(PROMPTS[0], 8)


def test_sampling_params_object_and_keywords(tiny_model, solo):
    engine = make_engine(tiny_model)
    params = pt.SamplingParams(max_tokens=6, temperature=0.9, top_p=0.8, seed=11)
    a = engine.generate([PROMPTS[0], PROMPTS[1]], params)
    b = engine.generate([PROMPTS[0], PROMPTS[1]], max_tokens=6, temperature=0.9,
                        top_p=0.8, seed=11)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    with pytest.raises(TypeError, match="not both"):
        engine.generate([PROMPTS[0]], params, max_tokens=3)
    per_prompt = engine.generate([PROMPTS[0], PROMPTS[1]],
                                 [pt.SamplingParams(max_tokens=2),
                                  pt.SamplingParams(max_tokens=5)])
    assert [len(r.token_ids) for r in per_prompt] == [2, 5]


def test_ignore_eos_generates_past_eos(tiny_model):
    engine = make_engine(tiny_model)
    first = engine.generate([PROMPTS[0]], max_tokens=6)[0].token_ids
    model = pt.Model(TINY.replace(eos_token_ids=(first[1],)), dict(tiny_model.weights), None,
                     "float32", "tiny with eos")
    engine = make_engine(model)
    assert engine.generate([PROMPTS[0]], max_tokens=6)[0].finish_reason == "eos"
    res = engine.generate([PROMPTS[0]], pt.SamplingParams(max_tokens=6, ignore_eos=True))[0]
    assert res.token_ids == first and res.finish_reason == "length"


def test_max_seq_len_beyond_the_models_positions_needs_opting_in(tiny_model):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        pt.Engine(tiny_model, backend="torch", max_seq_len=4096)
    engine = pt.Engine(tiny_model, backend="torch", max_seq_len=1024,
                       allow_beyond_max_positions=True)
    assert engine.max_seq_len == 1024
    assert pt.Engine(tiny_model, backend="torch").max_seq_len == 512     # the model's own


# --- 4. threads ------------------------------------------------------------------------------
def test_two_threads_generate_on_one_engine(tiny_model, solo):
    engine = make_engine(tiny_model, max_slots=3)
    jobs = {0: [PROMPTS[0], PROMPTS[2]], 1: [PROMPTS[1]], 2: [PROMPTS[2], PROMPTS[0]]}
    out = generate_in_threads(engine, jobs, lambda k: 7 + k)
    for k, prompts in jobs.items():
        assert out[k] == [solo(p, 7 + k) for p in prompts]
    assert_idle(engine)


def test_cancel_from_another_thread_is_applied_between_steps(tiny_model, solo):
    engine = make_engine(tiny_model)
    victim = engine.add_request(PROMPTS[1], max_tokens=60)
    fired = threading.Event()

    def on_token(i, tok, piece):
        if not fired.is_set():
            fired.set()
            t = threading.Thread(target=engine.cancel, args=(victim.request_id,))
            t.start()                    # blocks until this step has finished

    res = engine.generate([PROMPTS[0]], max_tokens=10, on_token=on_token)[0]
    assert res.token_ids == solo(PROMPTS[0], 10)
    engine.run_until_done()
    assert engine.result(victim.request_id).finish_reason == "cancelled"
    assert_idle(engine)


# --- 5. weights held once -------------------------------------------------------------------
def test_weights_are_held_once(tiny_model):
    engine = make_engine(tiny_model, device="cpu")          # the model's own device: no copy
    layer = engine.model_runner.network.layers[0]
    w = tiny_model.weights
    for part in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"):
        assert w[f"model.layers.0.{part}"].untyped_storage().data_ptr() == \
            layer.qkv.untyped_storage().data_ptr()
    assert w["model.layers.0.mlp.up_proj.weight"].untyped_storage().data_ptr() == \
        layer.gate_up.untyped_storage().data_ptr()
    expected = sum(int(np.prod(s)) * 4 for s in
                   pt.loading.weights.expected_tensor_shapes(TINY).values())
    assert tiny_model.num_bytes() == expected
    assert engine.model is tiny_model               # same device: no copy


# --- 6. random request streams with failures, closes and cross-thread cancels -----------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

event_st = st.tuples(st.integers(0, 10),                                   # step it happens at
                     st.sampled_from(["submit", "stream", "close", "cancel_thread", "fail"]),
                     st.integers(1, 36),                                    # prompt length
                     st.integers(1, 16))                                    # max_tokens




@pytest.mark.parametrize("async_scheduling", [False, True])
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(events=st.lists(event_st, min_size=1, max_size=8), cache_blocks=st.integers(6, 20),
       slots=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_random_streams_with_failures_closes_and_thread_cancels(tiny_model, solo, events,
                                                               cache_blocks, slots, seed,
                                                               async_scheduling):
    block_bytes = 2 * 16 * TINY.kv_dim * 4
    backend = SwitchableFailure()
    engine = make_engine(tiny_model, backend=backend, max_slots=slots, max_seq_len=64,
                         kv_cache_bytes=cache_blocks * block_bytes,
                         async_scheduling=async_scheduling)
    rng = np.random.default_rng(seed)

    def check():
        engine.cache.check_invariants()
        engine.scheduler.check_invariants()

    finished = drive(engine, events, lambda plen: rng.integers(0, 97, plen).tolist(),
                     backend.arm, Boom, rng, check, max_seq_len=64)
    backend.armed = False
    assert_idle(engine)
    for res, prompt, n in finished:
        expected = solo(prompt, n)
        if res.finish_reason == "cancelled":       # what it produced is where it was going
            assert res.token_ids == expected[:len(res.token_ids)]
        else:
            assert res.token_ids == expected, res.finish_reason
