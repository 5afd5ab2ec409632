"""A server's warm-up captures the decode graph of every batch-size bucket before the first
client arrives (marker ``gpu``); the engine then gives the tokens of one that captured lazily."""

from __future__ import annotations

import pytest

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_warm_up_for_every_batch_size_captures_every_bucket_and_changes_no_token(backend):
    model = pt.random_model(ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=16),
                            dtype="float32", seed=0, device="cuda")
    prompts = [[(5 * i + j) % 200 + 1 for j in range(3 + i)] for i in range(19)]
    params = pt.SamplingParams(max_tokens=6, ignore_eos=True)
    answers = {}
    for every in (True, False):
        engine = pt.Engine(model, backend=backend, max_slots=20, max_seq_len=64)
        free_before = sorted(engine.cache.free_blocks)
        engine.warm_up(every_batch_size=every)
        graphs = engine.model_runner.graphs
        captured = set(graphs.graphs)
        assert captured == (set(graphs.buckets) if every else {1}), (every, captured)
        assert sorted(engine.cache.free_blocks) == free_before
        answers[every] = [r.token_ids for r in engine.generate(prompts, params, chat=False)]
        assert not graphs.capture_every_bucket
    assert answers[True] == answers[False]
