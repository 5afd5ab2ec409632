"""Validated once, at the edge: every SamplingParams and add_request field is checked when the
request is made, with a message naming the field, the value and what is accepted; a request
that fails inside a step for its own reasons is finished with finish_reason "error" and the
others are served."""

from __future__ import annotations

import math

import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
NAN, INF = float("nan"), float("inf")
HUGE = 10 ** 400                           # an int no float can hold


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


@pytest.fixture()
def engine(tiny_model):
    return pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=64)


# field -> bad values (types, negatives, NaN/inf, bools where numbers belong, out of range)
SAMPLING_FIELDS = {
    "max_tokens": [-1, 2.5, 3.0, "3", True, NAN, INF, None, np.float64(2.0)],
    "temperature": [-0.1, NAN, INF, -INF, "0.5", True, HUGE, None, np.float32("nan")],
    "top_p": [0, 0.0, -0.5, 1.5, NAN, INF, "1", True, HUGE, None],
    "seed": [-1, 2 ** 64, 1.0, "1", True, NAN, np.float64(3.0)],
    "ignore_eos": [1, 0, "yes", None, np.int64(1)],
}
REQUEST_FIELDS = {
    "sample_key": [-5, -1, 2 ** 64, 1.5, "1", True, NAN, INF, np.float32(1.0)],
    "chat": [1, 0, "yes", None],
    "on_token": [5, "f", lambda: None, lambda a, b: None],
}
SAMPLING_CASES = [(f, v) for f, vs in SAMPLING_FIELDS.items() for v in vs]
REQUEST_CASES = [(f, v) for f, vs in REQUEST_FIELDS.items() for v in vs]


def _case_id(case):
    field, value = case
    if callable(value):         # a repr with an address would differ between xdist workers
        return f"{field}=function({value.__code__.co_argcount} args)"
    return f"{field}={value!r}"[:40]


def assert_still_serves(engine):
    assert not engine.has_unfinished() and engine.num_requests == 0
    assert engine.cache.num_free == engine.cache.NUM_BLOCKS
    result = engine.generate([[5, 6, 7]], max_tokens=3)[0]
    assert result.finish_reason == "length" and len(result.token_ids) == 3


@pytest.mark.parametrize("case", SAMPLING_CASES, ids=map(_case_id, SAMPLING_CASES))
def test_every_sampling_field_is_refused_when_made(case):
    field, value = case
    with pytest.raises((ValueError, TypeError)) as info:
        pt.SamplingParams(**{field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize("case", SAMPLING_CASES, ids=map(_case_id, SAMPLING_CASES))
def test_add_request_refuses_bad_sampling_fields_before_queueing(engine, case):
    field, value = case
    if field == "ignore_eos":
        # not an add_request keyword: given through SamplingParams
        with pytest.raises((ValueError, TypeError), match=field):
            engine.add_request([1, 2, 3], pt.SamplingParams(ignore_eos=value))
    elif value is None:
        pytest.skip("None means 'not given' for add_request's keywords")
    else:
        with pytest.raises((ValueError, TypeError), match=field):
            engine.add_request([1, 2, 3], **{field: value})
    assert_still_serves(engine)


@pytest.mark.parametrize("case", REQUEST_CASES, ids=map(_case_id, REQUEST_CASES))
def test_add_request_refuses_bad_request_fields_before_queueing(engine, case):
    field, value = case
    with pytest.raises((ValueError, TypeError)) as info:
        engine.add_request([1, 2, 3], max_tokens=4, temperature=0.5, seed=1,
                           **{field: value})
    message = str(info.value)
    assert field in message
    if field != "on_token":                  # a callable's repr is an address: named by kind
        assert repr(value) in message
    if field == "sample_key":
        assert "[0, 2**64)" in message
    assert_still_serves(engine)


def test_a_negative_sample_key_is_refused_and_the_queue_keeps_moving(engine):
    with pytest.raises(ValueError, match=r"sample_key must be None or an integer in \[0, "
                                         r"2\*\*64\), got -5"):
        engine.add_request([5, 6, 7], max_tokens=4, temperature=0.5, seed=1, sample_key=-5)
    assert engine.generate([[1, 2]], max_tokens=2)[0].finish_reason == "length"


@pytest.mark.parametrize("prompt", [None, 5, 3.5, [1.5], [True], [-1], [97], [], "",
                                    np.array([1.0, 2.0]), np.zeros((2, 2), dtype=int)])
def test_bad_prompts_are_refused_before_queueing(engine, prompt):
    with pytest.raises((ValueError, TypeError)):
        engine.add_request(prompt, max_tokens=2)
    assert_still_serves(engine)


def test_generate_checks_chat_and_every_per_prompt_params(engine):
    with pytest.raises(TypeError, match="chat must be True or False"):
        engine.generate([[1, 2]], max_tokens=2, chat="no")
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        engine.generate([[1, 2], [3]], [pt.SamplingParams(max_tokens=2), {"top_p": 2}])
    assert_still_serves(engine)


# --- a request that fails inside a step for its own reasons -------------------------------
def _solo(model, prompt, **kw):
    engine = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=64)
    return engine.generate([prompt], **kw)[0].token_ids


def test_a_request_whose_random_stream_fails_is_finished_with_error_alone(tiny_model, engine):
    good = engine.add_request([1, 2, 3], max_tokens=5)
    bad = engine.add_request([5, 6, 7], max_tokens=4, temperature=0.5, seed=1)
    bad.sample_key = -5             # changed behind the validation's back
    behind = engine.add_request([8, 9], max_tokens=3)
    engine.run_until_done()
    failed = engine.pop_result(bad.request_id)
    assert failed.finish_reason == "error" and failed.token_ids == []
    assert "non-negative" in failed.error
    assert engine.pop_result(good.request_id).token_ids == _solo(tiny_model, [1, 2, 3],
                                                                 max_tokens=5)
    assert engine.pop_result(behind.request_id).token_ids == _solo(tiny_model, [8, 9],
                                                                   max_tokens=3)
    engine.scheduler.check_invariants()
    engine.cache.check_invariants()
    assert_still_serves(engine)


class BrokenDetokenizer:
    def step(self, token_id):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")


def test_a_request_whose_detokenizer_fails_is_finished_with_error_alone(tiny_model, engine):
    bad = engine.add_request([5, 6, 7], max_tokens=4)
    bad.detokenizer = BrokenDetokenizer()
    good = engine.add_request([1, 2, 3], max_tokens=5)
    engine.run_until_done()
    failed = engine.pop_result(bad.request_id)
    assert failed.finish_reason == "error" and "UnicodeDecodeError" in failed.error
    assert len(failed.token_ids) == 1           # the token it got before its text failed
    assert engine.pop_result(good.request_id).token_ids == _solo(tiny_model, [1, 2, 3],
                                                                 max_tokens=5)
    assert_still_serves(engine)


def test_finite_float_refuses_what_math_cannot_hold():
    from paged_tutorial.engine.sampling_params import finite_float
    assert finite_float(HUGE) is None and finite_float(NAN) is None
    assert finite_float(True) is None and finite_float("1") is None
    assert finite_float(np.float32(0.5)) == 0.5 and math.isfinite(finite_float(10 ** 300))
