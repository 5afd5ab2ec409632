"""Asynchronous scheduling on the GPU (marker ``gpu``): decode steps replayed from CUDA
graphs, each launched before the previous one is read back, its input tokens gathered on the
device.  The tokens are those of the engine without it (greedy and sampled, requests ending
by length and by EOS at different steps so that the batch shrinks and changes bucket), and
the engine ends idle with every block free."""

from __future__ import annotations

import dataclasses

import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

pytestmark = pytest.mark.gpu

CONFIG = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16)


def params_for(n: int, sampled: bool) -> list:
    if sampled:
        return [pt.SamplingParams(max_tokens=4 + (7 * i) % 23, temperature=0.9, top_p=0.9,
                                  seed=i) for i in range(n)]
    return [pt.SamplingParams(max_tokens=4 + (7 * i) % 23) for i in range(n)]


@pytest.mark.parametrize("backend", ["numba", "torch"])
@pytest.mark.parametrize("sampled", [False, True])
def test_graph_replays_launched_ahead_give_the_same_tokens(backend, sampled):
    model = pt.random_model(CONFIG, dtype="float32", seed=0, device="cuda")
    prompts = [[(5 * i + j) % 200 + 1 for j in range(3 + i)] for i in range(11)]
    first = pt.Engine(model, backend=backend, max_slots=12, max_seq_len=64).generate(
        prompts[:1], max_tokens=12, chat=False)[0].token_ids
    # an EOS that request 0 meets mid-answer, so some rows stop while a step is in flight
    model = dataclasses.replace(model, config=dataclasses.replace(
        model.config, eos_token_ids=(first[5],)))
    answers = {}
    for flag in (False, True):
        engine = pt.Engine(model, backend=backend, max_slots=12, max_seq_len=64,
                           async_scheduling=flag)
        free = sorted(engine.cache.free_blocks)
        results = engine.generate(prompts, params_for(len(prompts), sampled), chat=False)
        answers[flag] = [(r.token_ids, r.finish_reason) for r in results]
        assert engine.model_runner.graphs.replays > 0
        assert (engine.core.steps_ahead > 0) == flag
        assert not engine.has_unfinished() and engine.core.in_flight is None
        assert sorted(engine.cache.free_blocks) == free
    assert answers[True] == answers[False]
    # where decode steps replay CUDA graphs, the engine schedules asynchronously by default
    assert pt.Engine(model, backend=backend, max_slots=2, max_seq_len=64).core.async_scheduling
    if not sampled:                         # greedy: request 0 meets that EOS
        assert any(reason == "eos" for _, reason in answers[True])
