"""Public observation hooks: RecordingBackend, cache listeners, the step counter.
Notebooks and viz use only these, never a patched method or a private name."""

from __future__ import annotations

import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
PROMPTS = [list(range(1, 21)), [5, 6, 7], list(range(40, 75))]


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


def test_recording_backend_records_without_changing_tokens(tiny_model):
    plain = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=96)
    expected = [r.token_ids for r in plain.generate(PROMPTS, max_tokens=5)]
    recorder = pt.RecordingBackend("torch", keep={"decode_attention": ["seq_lens",
                                                                       "active_slots"]})
    engine = pt.Engine(tiny_model, backend=recorder, max_slots=2, max_seq_len=96)
    assert engine.model_runner.graphs is None
    reports = []
    got = engine.generate(PROMPTS, max_tokens=5, on_step=reports.append)
    assert [r.token_ids for r in got] == expected
    names = {c.name for c in recorder.calls}
    assert {"embed", "linear", "rope_write_kv", "prefill_attention", "decode_attention",
            "silu_mul", "sample"} <= names
    # one decode_attention per layer per decode step, tagged with the step it ran in
    for report in reports:
        calls = [c for c in recorder.calls if c.step == report.index]
        attn = [c for c in calls if c.name == "decode_attention"]
        if report.kind == "decode":
            assert [c.layer for c in attn] == list(range(TINY.num_hidden_layers))
            seq_lens = attn[0].values["seq_lens"].tolist()
            assert len(seq_lens) == len(report.request_ids)
            assert attn[0].values["active_slots"].tolist() == report.slots
            assert attn[0].shapes["q"] == (len(report.request_ids), 4, 8)
        else:
            assert not attn and any(c.name == "prefill_attention" for c in calls)
    assert recorder.calls_of("decode_attention", layer=1)
    assert all(c.layer == 1 for c in recorder.calls_of("decode_attention", layer=1))


def test_recording_backend_refuses_unknown_names():
    with pytest.raises(ValueError, match="unknown op"):
        pt.RecordingBackend("torch", ops=["decode_attn"])
    with pytest.raises(ValueError, match="has no argument"):
        pt.RecordingBackend("torch", keep={"decode_attention": ["seqlens"]})
    with pytest.raises(TypeError):
        pt.RecordingBackend(3)


def test_cache_listener_replays_the_free_list(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=96)
    cache = engine.cache
    replay = list(cache.free_blocks)
    table = np.full_like(cache.block_table, -1)
    events = []

    def listen(event: pt.BlockEvent):
        events.append(event)
        if event.kind == "pop":
            assert replay.pop() == event.block                  # pops come off the end
            table[event.slot, event.layer, event.logical_block] = event.block
        else:
            assert table[event.slot, event.layer, event.logical_block] == event.block
            replay.append(event.block)
            table[event.slot, event.layer, event.logical_block] = -1
        # delivered after the operation completed: the cache already shows it
        assert cache.block_table[event.slot, event.layer, event.logical_block] == (
            event.block if event.kind == "pop" else -1)

    cache.add_listener(listen)
    engine.generate(PROMPTS, max_tokens=20)
    assert replay == cache.free_blocks
    assert (table == cache.block_table).all()
    pops = [e for e in events if e.kind == "pop"]
    pushes = [e for e in events if e.kind == "push"]
    assert len(pops) == len(pushes) > 0
    # release order: layer by layer, logical block by logical block (main.cpp:1018-1029)
    first_release = [e for e in pushes if e.slot == pushes[0].slot][:6]
    keys = [(e.layer, e.logical_block) for e in first_release]
    assert keys == sorted(keys)
    cache.remove_listener(listen)
    with pytest.raises(TypeError):
        cache.add_listener("not callable")


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("fail_at", [1, 3, 5, 7, 12, 20, 30])
def test_a_raising_listener_leaves_the_engine_consistent(tiny_model, fail_at,
                                                         async_scheduling):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=96,
                       async_scheduling=async_scheduling)
    solo = pt.Engine(tiny_model, backend="torch", max_slots=1, max_seq_len=96)
    other = engine.add_request(PROMPTS[2], max_tokens=20)
    seen = []

    def listen(event):
        seen.append(event)
        if len(seen) == fail_at:
            raise RuntimeError("listener bug")

    engine.cache.add_listener(listen)
    try:
        engine.generate([PROMPTS[0]], max_tokens=20)
    except RuntimeError as exc:
        assert "listener bug" in str(exc)
    assert engine.core.in_flight is None              # a failed step leaves none in flight
    engine.cache.check_invariants()
    engine.scheduler.check_invariants()
    engine.cache.remove_listener(listen)
    engine.run_until_done()
    assert engine.result(other.request_id).token_ids == \
        solo.generate([PROMPTS[2]], max_tokens=20)[0].token_ids
    assert sorted(engine.cache.free_blocks) == list(range(engine.cache.NUM_BLOCKS))
    assert (engine.cache.block_table == -1).all()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_step_count_and_reports(tiny_model, async_scheduling):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=96,
                       async_scheduling=async_scheduling)
    assert engine.step_count == 0
    reports = []
    engine.generate(PROMPTS[:2], max_tokens=3, on_step=reports.append)
    assert [r.index for r in reports] == list(range(len(reports)))
    assert engine.step_count == len(reports)
    assert engine.step().kind == "idle" and engine.step_count == len(reports) + 1
