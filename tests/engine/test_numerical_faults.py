"""Numerical faults are named: a request whose row of logits holds a NaN or an inf is finished
with finish_reason "non_finite" (no token appended, never a stream of token 0), its ``error``
names the first layer where its activations went non-finite, the other requests are served
with their solo tokens, and the engine ends idle and consistent."""

from __future__ import annotations

import math

import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.config import ModelConfig
from paged_tutorial.engine.numerical_faults import NON_FINITE
from paged_tutorial.engine.request import FINISH_REASONS

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
PROMPT, OTHER = [5, 6, 7], [11, 12, 13, 14]
POISONS = {"nan": math.nan, "inf": math.inf}


def model_with(poison: dict[str, float] | None = None, rows: dict[str, int] | None = None):
    """A fresh random model, ``poison`` {weight name: value} written over whole tensors (or
    over one row of it, ``rows`` {weight name: row})."""
    model = pt.random_model(TINY, dtype="float32", seed=0)
    for name, value in (poison or {}).items():
        with torch.no_grad():
            target = model.weights[name]
            if rows and name in rows:
                target = target[rows[name]]
            target.fill_(value)
    return model


def assert_idle(engine):
    assert not engine.has_unfinished() and engine.num_requests == 0
    engine.scheduler.check_invariants()
    engine.cache.check_invariants()
    assert engine.cache.num_free == engine.cache.NUM_BLOCKS


def test_non_finite_is_a_finish_reason():
    assert NON_FINITE == "non_finite" and NON_FINITE in FINISH_REASONS


@pytest.mark.parametrize("value", list(POISONS))
def test_a_whole_poisoned_model_is_named_not_a_stream_of_token_zero(value):
    model = model_with({name: POISONS[value] for name in
                        pt.random_model(TINY, dtype="float32", seed=0).weights})
    engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=64)
    results = engine.generate([PROMPT, OTHER], max_tokens=4)
    for result in results:
        assert result.finish_reason == "non_finite", result
        assert result.token_ids == []
        assert "non-finite" in result.error and "the embedding" in result.error
    assert_idle(engine)


@pytest.mark.parametrize("value", list(POISONS))
@pytest.mark.parametrize("layer, weight", [(1, "mlp.down_proj.weight"),
                                           (2, "input_layernorm.weight"),
                                           (0, "self_attn.o_proj.weight")])
def test_a_poisoned_layer_is_named(layer, weight, value):
    model = model_with({f"model.layers.{layer}.{weight}": POISONS[value]})
    engine = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=64)
    [result] = engine.generate([PROMPT], max_tokens=4)
    assert result.finish_reason == "non_finite" and result.token_ids == []
    assert f"in layer {layer} " in result.error, result.error
    assert "step 0" in result.error
    assert_idle(engine)


def test_the_final_norm_and_lm_head_are_named():
    engine = pt.Engine(model_with({"lm_head.weight": math.inf}), backend="torch", max_slots=1,
                       max_seq_len=64)
    [result] = engine.generate([PROMPT], max_tokens=2)
    assert result.finish_reason == "non_finite"
    assert "the final norm / LM head" in result.error


def test_only_the_faulty_request_stops_and_the_others_get_their_solo_tokens():
    # token 5's embedding row is NaN: only a request that reads token 5 goes non-finite
    solo_engine = pt.Engine(model_with(), backend="torch", max_slots=1, max_seq_len=64)
    solo = solo_engine.generate([OTHER], max_tokens=6)[0].token_ids
    engine = pt.Engine(model_with({"model.embed_tokens.weight": math.nan},
                                  rows={"model.embed_tokens.weight": 5}),
                       backend="torch", max_slots=2, max_seq_len=64)
    seen = []
    bad, good = engine.generate([PROMPT, OTHER], max_tokens=6,
                                on_token=lambda i, token, piece: seen.append(i))
    assert bad.finish_reason == "non_finite" and bad.token_ids == []
    assert "the embedding" in bad.error
    assert good.token_ids == solo and good.finish_reason == "length"
    assert 0 not in seen                       # no callback for a token that was not kept
    assert_idle(engine)
    # the engine keeps serving afterwards
    assert engine.generate([OTHER], max_tokens=6)[0].token_ids == solo


def test_a_fault_in_a_decode_step_keeps_the_tokens_before_it():
    """A token generated mid-run whose embedding row is inf: the request keeps the tokens up
    to that one, then stops with non_finite at the next step."""
    clean = pt.Engine(model_with(), backend="torch", max_slots=1, max_seq_len=64)
    tokens = clean.generate([OTHER], max_tokens=6)[0].token_ids
    target = next(t for t in tokens if t not in OTHER)
    cut = tokens.index(target) + 1
    engine = pt.Engine(model_with({"model.embed_tokens.weight": math.inf},
                                  rows={"model.embed_tokens.weight": target}),
                       backend="torch", max_slots=1, max_seq_len=64)
    record = engine.add_request(OTHER, max_tokens=6)
    engine.run_until_done()
    result = engine.pop_result(record.request_id)
    assert result.finish_reason == "non_finite" and result.token_ids == tokens[:cut]
    assert f"after {cut} generated token(s)" in result.error
    assert_idle(engine)


def test_a_stream_ends_with_the_fault():
    engine = pt.Engine(model_with({"model.layers.0.mlp.down_proj.weight": math.nan}),
                       backend="torch", max_slots=1, max_seq_len=64)
    stream = engine.stream(PROMPT, max_tokens=3)
    assert list(stream) == []
    assert stream.result.finish_reason == "non_finite" and "layer 0" in stream.result.error
    assert_idle(engine)


def test_llm_reports_a_non_finite_answer_as_an_error_with_the_layer():
    """vLLM's surface (``pt.LLM``) maps every engine finish reason: a non-finite answer is
    ``finish_reason="error"`` with the engine's message, not a KeyError or a stream of zeros."""
    from paged_tutorial.engine.request import FINISH_REASONS
    from paged_tutorial.serving.outputs import FINISH_REASON_OF_ENGINE

    assert set(FINISH_REASONS) <= set(FINISH_REASON_OF_ENGINE)
    llm = pt.LLM(model_with({"model.layers.1.mlp.down_proj.weight": math.nan}), backend="torch")
    [output] = llm.generate([{"prompt_token_ids": PROMPT}], pt.SamplingParams(max_tokens=4))
    completion = output.outputs[0]
    assert completion.finish_reason == "error" and completion.token_ids == []
    assert "layer 1" in completion.error
