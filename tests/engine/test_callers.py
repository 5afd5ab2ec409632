"""Callbacks and callers: re-entering the engine from a callback is refused with a
RuntimeError naming what was re-entered; an exception a caller's callback raises (Ctrl-C
included) lands on that caller, in its own thread, while the others' requests finish with
their solo tokens."""

from __future__ import annotations

import threading

import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
A_PROMPT, B_PROMPT = [5, 6, 7], [11, 12, 13, 14]


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


@pytest.fixture()
def engine(tiny_model):
    return pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=64)


@pytest.fixture(scope="module")
def solo(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=1, max_seq_len=64)
    return {tuple(p): engine.generate([p], max_tokens=12)[0].token_ids
            for p in (A_PROMPT, B_PROMPT)}


def assert_idle(engine):
    assert not engine.has_unfinished() and engine.num_requests == 0
    engine.scheduler.check_invariants()
    engine.cache.check_invariants()
    assert engine.cache.num_free == engine.cache.NUM_BLOCKS


# --- re-entry ----------------------------------------------------------------------------------
REENTRIES = {
    "generate": lambda e: e.generate([[1, 2]], max_tokens=2),
    "step": lambda e: e.step(),
    "stream": lambda e: e.stream([1, 2], max_tokens=2),
    "run_until_done": lambda e: e.run_until_done(),
    "add_request-then-step": lambda e: (e.add_request([1, 2], max_tokens=2), e.step()),
    "stream-consumed": lambda e: list(e.stream([1, 2], max_tokens=2)),
}
CALLBACKS = ["on_step", "on_token"]


@pytest.mark.parametrize("callback", CALLBACKS)
@pytest.mark.parametrize("what", list(REENTRIES))
def test_reentry_from_a_callback_is_refused(engine, solo, callback, what):
    calls = []

    def reenter(*args):
        calls.append(args)
        REENTRIES[what](engine)

    with pytest.raises(RuntimeError, match=r"engine\.(generate|step|stream|run_until_done)\(\) "
                                           r"was called from inside a callback") as info:
        engine.generate([A_PROMPT], max_tokens=4, **{callback: reenter})
    named = what.split("-")[-1] if what != "stream-consumed" else "stream"
    named = {"then": "step"}.get(named, named)
    assert f"engine.{named}()" in str(info.value)
    assert len(calls) == 1
    # the outer call cleaned up; anything the callback queued is still served or cancelled
    engine.run_until_done()
    for request_id in engine.request_ids():
        engine.pop_result(request_id)
    assert_idle(engine)
    assert engine.generate([A_PROMPT], max_tokens=12)[0].token_ids == solo[tuple(A_PROMPT)]


def test_on_step_of_run_until_done_refuses_reentry(engine):
    engine.add_request(A_PROMPT, max_tokens=3)
    with pytest.raises(RuntimeError, match=r"engine\.generate\(\)"):
        engine.run_until_done(on_step=lambda report: engine.generate([[1]], max_tokens=1))


def test_cancel_and_add_request_stay_allowed_in_callbacks(engine):
    added = []

    def on_step(report):
        if not added:
            added.append(engine.add_request(B_PROMPT, max_tokens=2))
            engine.cancel(added[0].request_id)

    engine.generate([A_PROMPT], max_tokens=3, on_step=on_step)
    assert engine.pop_result(added[0].request_id).finish_reason == "cancelled"
    assert_idle(engine)


# --- exceptions land on their own caller ------------------------------------------------------
@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, ValueError])
def test_a_callers_exception_lands_on_that_caller_across_threads(engine, solo, exc_type):
    """A's on_token raises at its 2nd token while B's longer request shares the engine from
    another thread; whichever thread ran the step, A gets the exception and B its tokens."""
    outcomes = []
    for trial in range(12):
        got = {}
        start = threading.Barrier(2)

        def caller_a():
            def on_token(i, token, piece):
                if on_token.n == 1:
                    raise exc_type(f"A's callback, trial {trial}")
                on_token.n += 1
            on_token.n = 0
            start.wait()
            try:
                engine.generate([A_PROMPT], max_tokens=12, on_token=on_token)
                got["A"] = "returned"
            except BaseException as exc:            # noqa: BLE001 - recorded for the test
                got["A"] = exc

        def caller_b():
            start.wait()
            try:
                got["B"] = engine.generate([B_PROMPT], max_tokens=12)[0].token_ids
            except BaseException as exc:            # noqa: BLE001 - recorded for the test
                got["B"] = exc

        threads = [threading.Thread(target=caller_a), threading.Thread(target=caller_b)]
        if trial % 2:
            threads.reverse()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert isinstance(got["A"], exc_type), (trial, got)
        assert got["B"] == solo[tuple(B_PROMPT)], (trial, got)
        assert_idle(engine)
        outcomes.append(got)
    assert len(outcomes) == 12
