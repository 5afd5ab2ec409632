"""DecodeRows: a decode step's host lists, carried from one commit to the next step.  Whatever
happened between two steps (requests finished, cancelled, preempted, admitted), the rows a
step runs must be its running requests' own: their last token, its position, their slots."""

from __future__ import annotations

import paged_tutorial as pt
from paged_tutorial.backends.recording import RecordingBackend
from paged_tutorial.config import ModelConfig
from paged_tutorial.engine.decode_rows import DecodeRows

TINY = ModelConfig(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                   max_position_embeddings=128, eos_token_ids=(2,))


def test_every_decode_step_runs_its_requests_own_rows():
    recorder = RecordingBackend("torch", ops=["embed", "decode_attention"],
                                keep={"embed": ["token_ids"],
                                      "decode_attention": ["seq_lens", "active_slots"]})
    # 3 slots and a cache of 12 blocks: requests finish, wait and get preempted
    engine = pt.Engine(pt.random_model(TINY, seed=1), backend=recorder, max_slots=3,
                       max_seq_len=64, block_size=4, kv_cache_bytes=12 * 4 * 8 * 2 * 4,
                       cuda_graphs=False)
    requests = [engine.add_request([(7 * i + j) % 55 + 3 for j in range(3 + 2 * i)],
                                   pt.SamplingParams(max_tokens=6 + 5 * i, ignore_eos=True,
                                                     temperature=0.8 * (i % 2), seed=3),
                                   chat=False) for i in range(5)]
    decode_steps = preempted = 0
    while engine.has_unfinished():
        index = engine.step_count
        if index == 9:
            engine.cancel(requests[1].request_id)
        if index == 11:
            requests.append(engine.add_request([4, 5, 6], pt.SamplingParams(max_tokens=9),
                                               chat=False))
        report = engine.step()
        preempted += len(report.preempted)
        if report.kind != "decode" or not report.request_ids:
            continue
        decode_steps += 1
        ran = [next(r for r in requests if r.request_id == i) for i in report.request_ids]
        embed, = [c for c in recorder.calls_of("embed") if c.step == index]
        attention, = [c for c in recorder.calls_of("decode_attention", layer=0)
                      if c.step == index]
        # each request gained one token this step: it ran the one before, at its position
        assert embed.values["token_ids"].tolist() == [r.output_ids[-2] for r in ran]
        assert attention.values["seq_lens"].tolist() == [r.total_len - 1 for r in ran]
        assert attention.values["active_slots"].tolist() == report.slots
    assert decode_steps > 20 and preempted > 0
    assert [r.finish_reason for r in requests].count("cancelled") == 1


def test_advanced_rows_leave_out_the_requests_that_stopped():
    engine = pt.Engine(pt.random_model(TINY, seed=1), backend="torch", max_slots=3,
                       max_seq_len=64)
    requests = [engine.add_request([3, 4, 5], pt.SamplingParams(
        max_tokens=4, temperature=t, top_k=k, seed=1), chat=False)
        for t, k in ((0.0, 0), (0.5, 3), (0.7, 0))]
    engine.step()                                   # the prefill: each has one token
    rows = DecodeRows.of(requests)
    assert rows.token_ids == [r.output_ids[-1] for r in requests]
    assert rows.positions == [3, 3, 3] and rows.samples and rows.controlled
    rest = rows.advanced([10, 11], [4, 4], kept=[0, 2])
    assert rest.requests == [requests[0], requests[2]] and rest.token_ids == [10, 11]
    assert rest.slots == [rows.slots[0], rows.slots[2]] and rest.temperature == [0.0, 0.7]
    assert rest.samples and not rest.controlled
    assert not rows.advanced([10], [4], kept=[0]).samples
