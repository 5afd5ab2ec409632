"""Asynchronous scheduling: each decode step launched before the previous one is read back.

The engine must give exactly the tokens it gives without it (greedy and sampled, requests
finishing at different steps, more requests than slots, prefix caching), drop the token
computed once too many for a request that stopped while a later step of it was in flight,
give that request's blocks back at once as without it, and end idle and consistent after a
cancel, an exception or Ctrl-C with a step in flight.  On the CPU the
launch is synchronous, but every decision (what is launched ahead, from which row each token
comes, which uniform it draws, what is dropped and when blocks go back) is the GPU's."""

from __future__ import annotations

import copy
import dataclasses

import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig
from paged_tutorial.engine.request import Status
from helpers.streams import Boom

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
PROMPTS = [[1, 2, 3, 4, 5], list(range(10, 31)), [7] * 9, list(range(40, 57))]


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


def engine_for(model, async_scheduling, backend="torch", **kw):
    kw.setdefault("max_slots", 2)
    kw.setdefault("max_seq_len", 96)
    return pt.Engine(model, backend=backend, async_scheduling=async_scheduling, **kw)


def assert_idle(engine):
    engine.cache.check_invariants()
    engine.scheduler.check_invariants()
    assert not engine.has_unfinished() and engine.core.in_flight is None
    assert (engine.cache.block_table == -1).all()
    assert len(engine.cache.free_blocks) + engine.cache.num_evictable_blocks \
        == engine.cache.NUM_BLOCKS


def run_both(model, prompts, params, **kw):
    """(sync results, async results, the async engine, its step reports)."""
    out = {}
    for flag in (False, True):
        engine = engine_for(model, flag, **kw)
        steps = []
        out[flag] = engine.generate(prompts, params, chat=False, on_step=steps.append)
        assert_idle(engine)
    return out[False], out[True], engine, steps


SAMPLING = {
    "greedy": [pt.SamplingParams(max_tokens=n) for n in (6, 23, 14, 31)],
    "sampled": [pt.SamplingParams(max_tokens=n, temperature=0.9, top_p=0.8, seed=s)
                for n, s in ((19, 1), (7, 2), (28, 3), (12, 4))],
    "mixed": [pt.SamplingParams(max_tokens=17, temperature=1.3, seed=5),
              pt.SamplingParams(max_tokens=9),
              pt.SamplingParams(max_tokens=25, temperature=0.7, seed=6),
              pt.SamplingParams(max_tokens=4)],
}


@pytest.mark.parametrize("sampling", sorted(SAMPLING))
@pytest.mark.parametrize("slots, prefix_caching", [(1, False), (2, False), (3, True),
                                                   (4, False)])
def test_async_scheduling_gives_the_tokens_of_sync_scheduling(tiny_model, sampling, slots,
                                                              prefix_caching):
    sync, ahead, engine, steps = run_both(tiny_model, PROMPTS, SAMPLING[sampling],
                                          max_slots=slots, prefix_caching=prefix_caching)
    assert [r.token_ids for r in ahead] == [r.token_ids for r in sync]
    assert [r.finish_reason for r in ahead] == [r.finish_reason for r in sync]
    assert engine.core.steps_ahead > 0
    # each step reports the tokens it committed, every request finished exactly once
    finished = [rid for s in steps for rid in s.finished]
    assert sorted(finished) == sorted(r.request_id for r in ahead)
    per_request = {}
    for s in steps:
        for rid, tok in s.new_tokens.items():
            per_request.setdefault(rid, []).append(tok)
    assert [per_request[r.request_id] for r in ahead] == [r.token_ids for r in ahead]


def test_rows_launched_ahead_continue_their_own_rows(tiny_model):
    """A request that ends by length is left out of the step launched ahead, so the rows
    after it move up: each must take the token its own request sampled."""
    params = [pt.SamplingParams(max_tokens=n, ignore_eos=True) for n in (3, 12, 5, 12)]
    sync, ahead, engine, steps = run_both(tiny_model, PROMPTS, params, max_slots=4)
    assert [r.token_ids for r in ahead] == [r.token_ids for r in sync]
    # the step after request 0's last one ran without it, launched ahead
    shrunk = [s for s in steps if s.kind == "decode" and len(s.request_ids) == 3]
    assert shrunk and engine.core.steps_ahead >= len(steps) - 6
    # a length the host knows ends a request is never computed once too many
    for s in steps:
        assert sorted(s.new_tokens) == sorted(s.request_ids), s


def eos_model(tiny_model, eos: int):
    config = dataclasses.replace(tiny_model.config, eos_token_ids=(eos,))
    return dataclasses.replace(tiny_model, config=config)


def test_a_request_stopped_mid_flight_loses_the_extra_token_and_gives_its_blocks_back(
        tiny_model):
    """Request A meets its EOS while the next step, already launched, computes one more of
    its tokens: that token is dropped when that step is committed, A is finished once, and its
    blocks go back in the step it finished, as without asynchronous scheduling."""
    solo = engine_for(tiny_model, False).generate([PROMPTS[0], PROMPTS[1]], max_tokens=30,
                                                  chat=False)
    a_tokens, b_tokens = solo[0].token_ids, solo[1].token_ids
    eos = next(t for t in a_tokens[4:] if t not in b_tokens)
    stop = a_tokens.index(eos)
    model = eos_model(tiny_model, eos)
    engine = engine_for(model, True)
    a = engine.add_request(PROMPTS[0], max_tokens=30, chat=False)
    b = engine.add_request(PROMPTS[1], max_tokens=30, chat=False)
    dropped_seen = False
    while engine.has_unfinished():
        report = engine.step()
        if a.request_id in report.finished:
            slot = report.slots[report.request_ids.index(a.request_id)]
            assert engine.cache.blocks_owned(slot) == 0          # back at once
            in_flight = engine.core.in_flight
            assert in_flight is not None and a in in_flight.launched.batch.requests
            report = engine.step()              # commits that step: A's row is dropped
            assert a.request_id in report.request_ids
            assert a.request_id not in report.new_tokens
            assert a.request_id not in report.finished
            dropped_seen = True
    assert dropped_seen
    assert engine.result(a.request_id).token_ids == a_tokens[:stop + 1]
    assert engine.result(a.request_id).finish_reason == "eos"
    assert engine.result(b.request_id).token_ids == b_tokens
    assert_idle(engine)


def test_when_every_request_stops_mid_flight_nothing_is_left_in_flight(tiny_model):
    solo = engine_for(tiny_model, False, max_slots=1).generate([PROMPTS[2]], max_tokens=30,
                                                               chat=False)[0].token_ids
    eos = solo[6]
    engine = engine_for(eos_model(tiny_model, eos), True, max_slots=1)
    result = engine.generate([PROMPTS[2]], max_tokens=30, chat=False)[0]
    assert result.token_ids == solo[:solo.index(eos) + 1]
    assert engine.core.steps_ahead > 0
    assert_idle(engine)


def test_cancel_with_a_step_in_flight(tiny_model):
    sync = engine_for(tiny_model, False).generate(PROMPTS[:2], max_tokens=20, chat=False)
    engine = engine_for(tiny_model, True)
    a = engine.add_request(PROMPTS[0], max_tokens=20, chat=False)
    b = engine.add_request(PROMPTS[1], max_tokens=20, chat=False)
    while engine.core.in_flight is None:
        engine.step()
    engine.cancel(a.request_id)
    assert engine.core.in_flight is not None            # B still runs in it
    engine.run_until_done()
    assert engine.result(b.request_id).token_ids == sync[1].token_ids
    got = engine.result(a.request_id)
    assert got.finish_reason == "cancelled"
    assert got.token_ids == sync[0].token_ids[:len(got.token_ids)]
    assert_idle(engine)
    # both cancelled: the step in flight has no request left and is dropped at once
    a = engine.add_request(PROMPTS[0], max_tokens=20, chat=False)
    b = engine.add_request(PROMPTS[1], max_tokens=20, chat=False)
    while engine.core.in_flight is None:
        engine.step()
    engine.cancel(a.request_id)
    engine.cancel(b.request_id)
    assert_idle(engine)


class FailingAt(pt.RecordingBackend):
    """The torch backend raising ``exc`` at the ``at``-th call of ``op``."""

    def __init__(self, exc, op, at):
        self.count = 0

        def on_call(call):
            self.count += 1
            if self.count == at:
                raise copy.copy(exc)            # a fresh one: see test_lifecycle.FailingBackend
        super().__init__("torch", ops=[op], on_call=on_call)


@pytest.mark.parametrize("exc", [Boom("in the model"), KeyboardInterrupt()])
@pytest.mark.parametrize("op, at", [("decode_attention", 9), ("decode_attention", 14),
                                    ("sample", 6), ("sample", 9)])
def test_a_failure_with_a_step_in_flight_rolls_both_back(tiny_model, exc, op, at):
    """Ops run at launch: a failure there hits the step launched ahead while the one before
    it is not committed; both are undone, and the requests are recomputed to the same
    tokens."""
    sync = engine_for(tiny_model, False).generate(PROMPTS[:2], max_tokens=12, chat=False)
    engine = engine_for(tiny_model, True, backend=FailingAt(exc, op, at))
    other = engine.add_request(PROMPTS[1], max_tokens=12, chat=False)
    with pytest.raises(type(exc)):
        engine.generate([PROMPTS[0]], max_tokens=12, chat=False)
    engine.cache.check_invariants()
    engine.scheduler.check_invariants()
    assert engine.core.in_flight is None
    assert engine.core.steps_ahead > 0
    engine.run_until_done()
    assert engine.result(other.request_id).token_ids == sync[1].token_ids
    assert_idle(engine)
    again = engine.generate(PROMPTS[:2], max_tokens=12, chat=False)
    assert [r.token_ids for r in again] == [r.token_ids for r in sync]


def test_no_step_is_launched_ahead_where_something_must_happen_between(tiny_model):
    """Recorded logits, sampling controls, or a waiting request with a free slot: the step
    runs as without asynchronous scheduling."""
    engine = engine_for(tiny_model, True)
    engine.record_logits = True
    engine.generate(PROMPTS[:2], max_tokens=8, chat=False)
    assert engine.core.steps_ahead == 0
    engine.record_logits = False
    engine.generate(PROMPTS[:2], pt.SamplingParams(max_tokens=8, top_k=5, temperature=1.0,
                                                   seed=1), chat=False)
    assert engine.core.steps_ahead == 0
    engine.generate(PROMPTS[:1], max_tokens=8, chat=False)
    assert engine.core.steps_ahead > 0
    # one slot free and a request waiting for it: nothing is launched ahead of its admission
    a = engine.add_request(PROMPTS[0], max_tokens=8, chat=False)
    engine.step()
    engine.step()
    engine.add_request(PROMPTS[1], max_tokens=8, chat=False)
    engine.core.in_flight is None or engine.step()
    before = engine.core.steps_ahead
    report = engine.step()
    assert report.kind == "prefill" and engine.core.steps_ahead == before
    engine.run_until_done()
    assert engine.result(a.request_id).finish_reason == "length"
    assert_idle(engine)


def test_a_step_in_flight_counts_as_unfinished_work(tiny_model):
    engine = engine_for(tiny_model, True)
    request = engine.add_request(PROMPTS[0], max_tokens=6, chat=False)
    while engine.core.in_flight is None:
        engine.step()
    assert engine.has_unfinished()
    assert request.status is Status.RUNNING
    engine.run_until_done()
    assert len(engine.result(request.request_id).token_ids) == 6
    assert_idle(engine)


def test_async_scheduling_is_a_bool_or_none_and_off_without_cuda_graphs(tiny_model):
    with pytest.raises(TypeError, match="async_scheduling must be None, True or False"):
        pt.Engine(tiny_model, backend="torch", async_scheduling="yes")
    assert pt.Engine(tiny_model, backend="torch", device="cpu").core.async_scheduling is False
    assert pt.Engine(tiny_model, backend="torch", cuda_graphs=False).core.async_scheduling \
        is False
    assert pt.Engine(tiny_model, backend="torch",
                     async_scheduling=True).core.async_scheduling is True
