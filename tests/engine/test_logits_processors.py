"""Per-request logits processors (vLLM v0's hook): ``SamplingParams(logits_processors=[fn])``
with ``fn(output_token_ids, logits) -> logits`` on the row's float32 logits, before the draw;
on every backend, with only the requests that ask for it affected."""

from __future__ import annotations

import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.backends.numba_cuda import SIMULATING
from paged_tutorial.backends.recording import RecordingBackend
from paged_tutorial.config import ModelConfig

TINY = ModelConfig(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                   max_position_embeddings=128, eos_token_ids=(2,))


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=4)


def only(token: int):
    """A processor that leaves ``token`` the only one that can be drawn."""
    def keep_only(output_token_ids, logits):
        masked = torch.full_like(logits, float("-inf"))
        masked[token] = logits[token]
        return masked
    return keep_only


@pytest.mark.parametrize("backend", ["torch", "numba-sim" if SIMULATING else "numba"])
def test_a_processor_decides_what_its_request_draws_and_spares_the_others(tiny_model,
                                                                           backend):
    engine = pt.Engine(tiny_model, backend=backend, max_slots=3, max_seq_len=32)
    plain = pt.SamplingParams(max_tokens=4, temperature=0.9, seed=7, ignore_eos=True)
    alone = engine.generate([[3, 4, 5]], plain)[0].token_ids
    forced = [pt.SamplingParams(max_tokens=4, ignore_eos=True, logits_processors=[only(11)]),
              pt.SamplingParams(max_tokens=4, temperature=1.0, seed=1, ignore_eos=True,
                                logits_processors=[only(23)])]
    # (generate keys request i's random stream by i: the plain request stays first)
    results = engine.generate([[3, 4, 5], [9, 8], [7]], [plain, forced[0], forced[1]])
    assert results[1].token_ids == [11] * 4          # greedy: the only token left
    assert results[2].token_ids == [23] * 4          # sampled: the only token left
    assert results[0].token_ids == alone             # the request without one: as alone


def test_a_processor_sees_its_requests_tokens_and_float32_logits(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=32)
    calls = []

    def watch(output_token_ids, logits):
        calls.append((list(output_token_ids), logits.dtype, tuple(logits.shape),
                      logits.clone()))
        return logits

    result = engine.generate([[3, 4, 5]], pt.SamplingParams(
        max_tokens=3, ignore_eos=True, logits_processors=[watch]))[0]
    assert [c[0] for c in calls] == [[], result.token_ids[:1], result.token_ids[:2]]
    assert {(c[1], c[2]) for c in calls} == {(torch.float32, (TINY.vocab_size,))}
    # returning the logits unchanged changes nothing: greedy picks their argmax
    assert [int(c[3].argmax()) for c in calls] == result.token_ids


def test_processors_run_in_order_each_given_the_last_ones_output(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=32)

    def ban_first_ten(output_token_ids, logits):
        logits[:10] = float("-inf")                  # in place is fine too
        return logits

    def prefer_lowest_allowed(output_token_ids, logits):
        allowed = torch.isfinite(logits).nonzero()[0, 0]
        out = torch.full_like(logits, float("-inf"))
        out[allowed] = 0.0
        return out

    result = engine.generate([[3, 4]], pt.SamplingParams(
        max_tokens=2, ignore_eos=True,
        logits_processors=[ban_first_ten, prefer_lowest_allowed]))[0]
    assert result.token_ids == [10, 10]


def test_a_failing_processor_ends_its_own_request_only(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=2, max_seq_len=32)

    def broken(output_token_ids, logits):
        if output_token_ids:
            raise KeyError("boom")
        return logits

    def wrong_shape(output_token_ids, logits):
        return logits[:5]

    results = engine.generate([[3, 4], [5, 6], [7]], [
        pt.SamplingParams(max_tokens=4, ignore_eos=True, logits_processors=[broken]),
        pt.SamplingParams(max_tokens=4, ignore_eos=True),
        pt.SamplingParams(max_tokens=4, ignore_eos=True, logits_processors=[wrong_shape])])
    assert results[0].finish_reason == "error" and "broken" in results[0].error
    assert "KeyError" in results[0].error and len(results[0].token_ids) == 1
    assert results[2].finish_reason == "error" and "shape (61,)" in results[2].error
    assert results[1].finish_reason == "length" and len(results[1].token_ids) == 4
    assert engine.cache.num_free == engine.cache.NUM_BLOCKS and not engine.has_unfinished()


def test_a_batch_with_processors_is_drawn_by_the_batched_rule_not_the_backends_sampler(
        tiny_model):
    recorder = RecordingBackend("torch", ops=["sample"])
    engine = pt.Engine(tiny_model, backend=recorder, max_slots=2, max_seq_len=32)
    engine.generate([[3, 4]], pt.SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(recorder.calls_of("sample")) == 3
    recorder.calls.clear()
    engine.generate([[3, 4]], pt.SamplingParams(max_tokens=3, ignore_eos=True,
                                                logits_processors=[lambda ids, x: x]))
    assert recorder.calls_of("sample") == []


@pytest.mark.parametrize("bad", [lambda ids, x: x, [1], "f", [None]])
def test_logits_processors_must_be_a_list_of_functions(bad):
    with pytest.raises(ValueError, match="logits_processors must be a list of functions"):
        pt.SamplingParams(logits_processors=bad)
