"""``StepReport.phase_seconds``: where a step's host time went (the prefix-sharing benchmark
splits its time to first token with it)."""

from __future__ import annotations

import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)


def test_every_step_reports_its_phases_within_its_time():
    # eager steps: on a GPU a replayed decode graph reports one "graph" phase instead of
    # inputs / forward / sample (test_a_replayed_step_reports_its_graph below)
    engine = pt.Engine(pt.random_model(TINY, seed=0), backend="torch", max_slots=2,
                       max_seq_len=96, prefix_caching=True, cuda_graphs=False)
    steps = []
    engine.generate([list(range(1, 40)), list(range(1, 45))], max_tokens=3,
                    on_step=steps.append)
    assert [s.kind for s in steps][:1] == ["prefill"]
    for step in steps:
        phases = step.phase_seconds
        assert set(phases) == {"schedule", "inputs", "forward", "sample", "postprocess",
                               "release"}, phases
        assert all(v >= 0 for v in phases.values())
        assert sum(phases.values()) <= step.seconds
    assert engine.model_runner.phase_seconds.keys() == {"inputs", "forward", "sample"}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_replayed_step_reports_its_graph(async_scheduling):
    """On a GPU, a decode step replayed from a CUDA graph has one phase for the replay (with
    asynchronous scheduling, the wait for it; the launch of the step after it is
    ``launch_ahead``); the phases fit in the step's seconds."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a GPU")
    engine = pt.Engine(pt.random_model(TINY, seed=0, device="cuda"), backend="torch",
                       max_slots=2, max_seq_len=96, async_scheduling=async_scheduling)
    steps = []
    engine.generate([list(range(1, 40))], max_tokens=6, on_step=steps.append)
    decode = [s for s in steps if s.kind == "decode"]
    assert decode and engine.model_runner.graphs.replays > 0
    expected = {"schedule", "graph", "postprocess", "release"}
    for step in decode:
        assert set(step.phase_seconds) - {"launch_ahead"} <= expected
        assert {"graph", "postprocess", "release"} <= set(step.phase_seconds)
        assert sum(step.phase_seconds.values()) <= step.seconds
    assert any("launch_ahead" in s.phase_seconds for s in decode) == async_scheduling


def test_phases_of_steps_launched_ahead_fit_in_their_seconds():
    """On a CPU too: a step launched ahead ran its layers in the call before the one that
    commits it, and is counted there (``launch_ahead``), not twice."""
    engine = pt.Engine(pt.random_model(TINY, seed=0), backend="torch", device="cpu", max_slots=2, max_seq_len=96,
                       async_scheduling=True)
    steps = []
    engine.generate([list(range(1, 40)), [5, 6, 7]], max_tokens=8, on_step=steps.append)
    assert engine.core.steps_ahead > 0
    for step in steps:
        assert sum(step.phase_seconds.values()) <= step.seconds
    assert any("launch_ahead" in s.phase_seconds for s in steps)
