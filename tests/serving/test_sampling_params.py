"""SamplingParams speaks vLLM's names, refuses what it cannot honour, and the sampler applies
top-k and min-p the same way on every path."""

from __future__ import annotations

import pytest
import torch

from paged_tutorial.backends.batched_sampling import sample_batched
from paged_tutorial.engine.sampling_params import SamplingParams
from paged_tutorial.backends.sampling_rule import sample_reference


def test_vllm_field_names_are_accepted_and_normalised():
    p = SamplingParams(n=2, temperature=0.7, top_p=0.9, top_k=-1, min_p=0.05, seed=3,
                       stop="###", stop_token_ids=[5], ignore_eos=True, max_tokens=9)
    assert (p.n, p.top_k, p.min_p, p.stop, p.stop_token_ids, p.max_tokens) == \
        (2, 0, 0.05, ["###"], [5], 9)


@pytest.mark.parametrize("field, value", [
    ("max_tokens", -1), ("max_tokens", 2.5), ("n", 0), ("top_k", -2), ("top_k", 1.5),
    ("min_p", 1.5), ("min_p", float("nan")), ("stop", [""]), ("stop", [3]),
    ("stop_token_ids", [-1]), ("stop_token_ids", "7"), ("top_p", 0.0), ("temperature", -1),
    ("presence_penalty", 2.5), ("presence_penalty", float("nan")), ("frequency_penalty", -2.1),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("min_tokens", -1),
    ("min_tokens", 65), ("min_tokens", 1.5), ("logprobs", -1), ("logprobs", 21),
    ("logprobs", 2.0), ("prompt_logprobs", 21), ("prompt_logprobs", True),
    ("logits_processors", "f")])
def test_out_of_range_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_a_field_this_engine_does_not_implement_is_refused_not_ignored():
    with pytest.raises(TypeError, match="bad_words"):
        SamplingParams(bad_words=["x"])


def test_vllms_penalty_and_logprob_fields_are_kept_as_plain_numbers():
    import numpy as np

    p = SamplingParams(presence_penalty=np.float32(-2.0), frequency_penalty=2, min_tokens=64,
                       repetition_penalty=np.float64(1.25), logprobs=np.int64(20),
                       prompt_logprobs=0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty, p.min_tokens,
            p.logprobs, p.prompt_logprobs) == (-2.0, 2.0, 1.25, 64, 20, 0)
    assert type(p.logprobs) is int and type(p.presence_penalty) is float
    assert p.needs_sampling_controls and not SamplingParams(prompt_logprobs=3)\
        .needs_sampling_controls


def _rows(seed: int, rows: int = 48, vocab: int = 40):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    temperature = torch.rand(rows, generator=g) + 0.3
    top_p = torch.where(torch.rand(rows, generator=g) < 0.5, 1.0,
                        0.3 + 0.7 * torch.rand(rows, generator=g))
    uniforms = torch.rand(rows, generator=g)
    top_k = torch.randint(0, 6, (rows,), generator=g)
    min_p = torch.where(torch.rand(rows, generator=g) < 0.5, 0.0,
                        0.3 * torch.rand(rows, generator=g))
    return logits, temperature, top_p, uniforms, top_k, min_p


@pytest.mark.parametrize("seed", range(4))
def test_reference_and_batched_samplers_pick_the_same_token_with_top_k_and_min_p(seed):
    args = _rows(seed)
    assert torch.equal(sample_reference(*args), sample_batched(*args))


def test_top_k_keeps_only_the_k_most_likely_tokens():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(1)).repeat(400, 1)
    ones = torch.ones(400)
    drawn = sample_batched(logits, ones, ones, torch.rand(400), top_k=torch.full((400,), 3))
    top3 = set(logits[0].topk(3).indices.tolist())
    assert set(drawn.tolist()) == top3          # all three drawn, nothing else


def test_min_p_keeps_only_tokens_near_the_most_likely():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(2)).repeat(400, 1)
    ones = torch.ones(400)
    drawn = sample_batched(logits, ones, ones, torch.rand(400), min_p=torch.full((400,), 0.3))
    p = torch.softmax(logits[0], -1)
    allowed = set(torch.nonzero(p >= 0.3 * p.max()).flatten().tolist())
    assert 1 < len(allowed) < 10 and set(drawn.tolist()) == allowed


def test_top_p_applies_to_what_top_k_kept():
    # p = [0.5, 0.3, 0.2]: top_k=2 keeps 0.5 and 0.3 (renormalised 0.625, 0.375); top_p=0.6
    # then keeps only the first (0.625 >= 0.6) where top_p alone would keep two
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(200, 1)
    ones = torch.ones(200)
    u = torch.rand(200)
    alone = sample_batched(logits, ones, torch.full((200,), 0.6), u)
    with_k = sample_batched(logits, ones, torch.full((200,), 0.6), u, top_k=torch.full((200,), 2))
    assert set(alone.tolist()) == {0, 1} and set(with_k.tolist()) == {0}


def test_the_numba_backend_serves_top_k_and_min_p_through_the_torch_rule():
    import paged_tutorial as pt
    from paged_tutorial.config import ModelConfig

    config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_ids=())
    from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

    device = "cpu" if SIMULATING else "cuda"      # Numba runs one way per process
    engine = pt.Engine(pt.random_model(config, seed=1).to(device),
                       backend="numba-sim" if SIMULATING else "numba", max_slots=2,
                       max_seq_len=32)
    prompts = [[1, 2, 3], [4, 5]]
    greedy = engine.generate(prompts, pt.SamplingParams(max_tokens=3), chat=False)
    filtered = engine.generate(prompts, [pt.SamplingParams(max_tokens=3, temperature=2.0, top_k=1),
                                         pt.SamplingParams(max_tokens=3, temperature=2.0,
                                                           min_p=1.0)], chat=False)
    assert [r.token_ids for r in filtered] == [r.token_ids for r in greedy]
