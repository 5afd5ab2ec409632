"""Penalties, min_tokens and logprobs in the sampler, token for token against HF transformers
where HF has the feature (repetition_penalty; logprobs = HF's log_softmax of its logits), and
against a plain-torch reference of OpenAI's formula for presence / frequency penalties; the
same on the numba-sim backend's batched path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.backends.numba_cuda import SIMULATING
from paged_tutorial.config import ModelConfig

LOGPROB_ATOL = 1e-4          # float32 on both sides, summed in another order (test_engine.py)


@pytest.fixture(scope="module")
def hf_pair(tiny_llama):
    folder, hf = tiny_llama("gqa2-tied-default")
    model = pt.load_model(str(folder), dtype="float32")
    return model, hf


def prompts(n=3, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 320, length).tolist() for length in (5, 12, 9)[:n]]


def hf_generate(hf, ids, n, **kw):
    out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                      attention_mask=torch.ones(1, len(ids), dtype=torch.long), pad_token_id=0,
                      **kw)
    return out[0, len(ids):].tolist()


def test_repetition_penalty_matches_hf_token_for_token(hf_pair):
    model, hf = hf_pair
    engine = pt.Engine(model, backend="torch", max_slots=3, max_seq_len=128)
    params = pt.SamplingParams(max_tokens=24, repetition_penalty=1.8, ignore_eos=True)
    plain = engine.generate(prompts(), pt.SamplingParams(max_tokens=24, ignore_eos=True))
    results = engine.generate(prompts(), params)
    for prompt, res, base in zip(prompts(), results, plain):
        assert res.token_ids == hf_generate(hf, prompt, 24, repetition_penalty=1.8)
    assert [r.token_ids for r in results] != [b.token_ids for b in plain]   # it did bite


def openai_reference(hf, prompt, n, presence, frequency):
    """Greedy decoding over HF's logits minus OpenAI's penalties, in plain torch."""
    ids, out = list(prompt), []
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
        counts = torch.bincount(torch.tensor(out, dtype=torch.long),
                                minlength=logits.numel()).float()
        logits = logits - frequency * counts - presence * (counts > 0).float()
        out.append(int(logits.argmax()))
        ids.append(out[-1])
    return out


@pytest.mark.parametrize("presence, frequency", [(1.5, 0.0), (0.0, 0.7), (-0.5, 1.2)])
def test_presence_and_frequency_penalties_follow_openais_formula(hf_pair, presence, frequency):
    model, hf = hf_pair
    engine = pt.Engine(model, backend="torch", max_slots=3, max_seq_len=128)
    results = engine.generate(prompts(), pt.SamplingParams(
        max_tokens=16, presence_penalty=presence, frequency_penalty=frequency,
        ignore_eos=True))
    for prompt, res in zip(prompts(), results):
        assert res.token_ids == openai_reference(hf, prompt, 16, presence, frequency)


def test_logprobs_are_hfs_log_softmax_with_ranks(hf_pair):
    model, hf = hf_pair
    engine = pt.Engine(model, backend="torch", max_slots=3, max_seq_len=128)
    # the middle request samples (temperature 1): logprobs are still the raw model's
    params = [pt.SamplingParams(max_tokens=6, logprobs=4, prompt_logprobs=2, ignore_eos=True),
              pt.SamplingParams(max_tokens=6, logprobs=0, temperature=1.0, seed=3,
                                ignore_eos=True),
              pt.SamplingParams(max_tokens=6, ignore_eos=True)]
    results = engine.generate(prompts(), params)
    for prompt, res, p in zip(prompts()[:2], results[:2], params[:2]):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + res.token_ids])).logits[0].float()
        ref = torch.log_softmax(logits, dim=-1)
        assert len(res.logprobs) == len(res.token_ids)
        cumulative = 0.0
        for j, (token, row) in enumerate(zip(res.token_ids, res.logprobs)):
            expected = ref[len(prompt) - 1 + j]
            assert row[0][0] == token                       # the sampled token first
            assert abs(row[0][1] - float(expected[token])) < LOGPROB_ATOL
            assert row[0][2] == int((expected >= expected[token]).sum())
            top = row[1:]
            assert len(top) == p.logprobs
            assert [t for t, _, _ in top] == expected.topk(p.logprobs).indices.tolist()
            assert [r for _, _, r in top] == list(range(1, p.logprobs + 1))
            cumulative += row[0][1]
        assert res.cumulative_logprob == pytest.approx(cumulative)
    assert results[0].logprobs[0][0][2] == 1                 # greedy: always the top token
    assert results[2].logprobs is None and results[2].cumulative_logprob is None
    # prompt logprobs: None first, then each prompt token's under the positions before it
    prompt = prompts()[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    pl = results[0].prompt_logprobs
    assert pl[0] is None and len(pl) == len(prompt)
    for j in range(1, len(prompt)):
        assert pl[j][0][0] == prompt[j]
        assert abs(pl[j][0][1] - float(ref[j - 1, prompt[j]])) < LOGPROB_ATOL
        assert [t for t, _, _ in pl[j][1:]] == ref[j - 1].topk(2).indices.tolist()
    assert results[1].prompt_logprobs is None


TINY = ModelConfig(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                   max_position_embeddings=128)


def test_min_tokens_keeps_end_of_sequence_away_until_reached():
    probe = pt.Engine(pt.random_model(TINY, dtype="float32", seed=2), backend="torch",
                      max_slots=2, max_seq_len=64)
    first = probe.generate([[3, 4, 5]], max_tokens=1)[0].token_ids[0]
    # the same weights, with the greedy first token as end-of-sequence
    config = ModelConfig(**{**TINY.__dict__, "eos_token_ids": (first,)})
    engine = pt.Engine(pt.random_model(config, dtype="float32", seed=2), backend="torch",
                       max_slots=2, max_seq_len=64)
    stopped, held = engine.generate([[3, 4, 5], [3, 4, 5]], [
        pt.SamplingParams(max_tokens=12), pt.SamplingParams(max_tokens=12, min_tokens=6)])
    assert stopped.token_ids == [first] and stopped.finish_reason == "eos"
    assert len(held.token_ids) >= 6 and first not in held.token_ids[:6]


def test_penalties_and_logprobs_on_the_batched_path_match_the_torch_backend():
    backend = "numba-sim" if SIMULATING else "numba"      # Numba runs one way per process
    model = pt.random_model(TINY, dtype="float32", seed=5)
    params = [pt.SamplingParams(max_tokens=5, repetition_penalty=1.5, presence_penalty=0.4,
                                frequency_penalty=0.3, logprobs=3, ignore_eos=True),
              pt.SamplingParams(max_tokens=5, temperature=0.8, seed=9, top_k=5,
                                ignore_eos=True)]
    runs = {}
    for name in ("torch", backend):
        engine = pt.Engine(model, backend=name, max_slots=2, max_seq_len=32)
        runs[name] = engine.generate([[3, 4, 5, 3], [7, 8]], params)
    for ours, ref in zip(runs[backend], runs["torch"]):
        assert ours.token_ids == ref.token_ids
    for ours, ref in zip(runs[backend][0].logprobs, runs["torch"][0].logprobs):
        assert [t for t, _, _ in ours] == [t for t, _, _ in ref]
        assert np.allclose([v for _, v, _ in ours], [v for _, v, _ in ref], atol=1e-4)


def test_prompt_logprobs_cover_the_whole_prompt_with_prefix_caching_on():
    model = pt.random_model(TINY, dtype="float32", seed=6)
    prompt = [(5 * i) % 50 + 3 for i in range(40)]             # 2 full blocks of 16 and more
    plain = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=64)
    want = pt.SamplingParams(max_tokens=2, prompt_logprobs=1)
    ref = plain.generate([prompt], want)[0].prompt_logprobs
    engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=64,
                       prefix_caching=True)
    engine.generate([prompt], pt.SamplingParams(max_tokens=2))  # its blocks are cached now
    again = engine.generate([prompt], pt.SamplingParams(max_tokens=2))[0]
    asked = engine.generate([prompt], want)[0]
    assert again.num_cached_tokens == 32                        # the cache does serve it
    assert asked.num_cached_tokens == 0 and len(asked.prompt_logprobs) == len(prompt)
    for ours, theirs in zip(asked.prompt_logprobs[1:], ref[1:]):
        assert [t for t, _, _ in ours] == [t for t, _, _ in theirs]
        assert np.allclose([v for _, v, _ in ours], [v for _, v, _ in theirs], atol=1e-5)


def test_logprobs_survive_a_preemption_unchanged():
    model = pt.random_model(TINY, dtype="float32", seed=7)
    params = pt.SamplingParams(max_tokens=20, logprobs=2, ignore_eos=True)
    prompts_ = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
    roomy = pt.Engine(model, backend="torch", max_slots=3, max_seq_len=64)
    ref = roomy.generate(prompts_, params)
    # blocks of 4 tokens, 12 blocks for three requests of up to 24 tokens: preemptions
    tight = pt.Engine(model, backend="torch", max_slots=3, max_seq_len=64, block_size=4,
                      kv_cache_bytes=12 * 4 * 8 * 2 * 4)
    got = tight.generate(prompts_, params)
    assert sum(r.num_preemptions for r in got) > 0
    for ours, theirs in zip(got, ref):
        assert ours.token_ids == theirs.token_ids and len(ours.logprobs) == 20
        assert [[t for t, _, _ in row] for row in ours.logprobs] == \
            [[t for t, _, _ in row] for row in theirs.logprobs]
        assert ours.cumulative_logprob == pytest.approx(theirs.cumulative_logprob, abs=1e-4)
