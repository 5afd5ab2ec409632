"""``LLM(async_scheduling=True)`` answers exactly as without it: stop strings and stop tokens
(applied by ``LLM`` as the tokens arrive, so a request stops while its next step is already in
flight), several samples per prompt, lengths that differ; and the engine ends idle."""

from __future__ import annotations

import paged_tutorial as pt

MAX_SEQ_LEN = 128                    # the serving fixtures' llm (conftest.py)

PROMPTS = ["Hello there", "The capital of France is", "안녕하세요", "Count to ten:"]


def answers(llm, params):
    return [[(o.text, o.token_ids, o.finish_reason, o.stop_reason) for o in out.outputs]
            for out in llm.generate(PROMPTS, params)]


def test_async_scheduling_answers_as_without_it(llm, tiny_model):
    full = llm.generate(PROMPTS, pt.SamplingParams(max_tokens=24))
    stop_id = full[0].outputs[0].token_ids[5]
    stop_text = full[1].outputs[0].text[6:9]
    cases = [
        [pt.SamplingParams(max_tokens=n) for n in (5, 24, 11, 17)],
        [pt.SamplingParams(max_tokens=24, stop_token_ids=[stop_id]),
         pt.SamplingParams(max_tokens=24, stop=[stop_text]),
         pt.SamplingParams(max_tokens=9, temperature=0.8, seed=3, n=2),
         pt.SamplingParams(max_tokens=20, temperature=1.1, top_p=0.9, seed=4)],
    ]
    ahead = pt.LLM(tiny_model, backend="torch", max_num_seqs=4, max_model_len=MAX_SEQ_LEN,
                   async_scheduling=True)
    for params in cases:
        expected = answers(llm, params)
        assert answers(ahead, params) == expected
    assert any(o[2] == "stop" for case in expected for o in case)
    engine = ahead.engine
    assert engine.core.steps_ahead > 0
    assert not engine.has_unfinished() and engine.num_requests == 0
    assert engine.cache.num_free == engine.cache.NUM_BLOCKS
