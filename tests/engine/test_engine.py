"""The engine against HF transformers: same greedy tokens, close logits, batch invariance and
exact block accounting at every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.config import llama_3_2_1b_config, CacheConfig

# Float32 logit tolerance against HF.  Both sides compute in float32 but not in the same order
# (we fuse the Q/K/V and gate/up GEMMs, and read K/V back from the paged cache in another
# reduction order), so logits agree to rounding, not bit for bit: a relative error of a few
# 1e-6 is expected; 1e-4 leaves margin while still catching any wrong op (a missing norm
# weight or a RoPE slip moves logits by O(1)).
LOGIT_RTOL = 1e-4


def article_cache_config():
    return CacheConfig.for_model(llama_3_2_1b_config(), dtype="bfloat16",
                                 kv_cache_bytes=2 * 1024**3, max_slots=2, max_seq_len=2048)


def test_article_constants_without_weights():
    c = article_cache_config()
    assert (c.BLOCK_SIZE, c.KV_DIM, c.V_OFFSET, c.BLOCK_BYTES, c.NUM_BLOCKS,
            c.MAX_BLOCKS_PER_SEQ) == (16, 512, 16384, 32768, 65536, 128)
    assert c.block_table_entries == 4096


def test_block_table_flat_index_is_the_articles():
    cache = pt.PagedKVCache(CacheConfig(num_layers=16, num_kv_heads=8, head_dim=64,
                                        dtype="bfloat16", kv_cache_bytes=64 * 32768,
                                        max_slots=2, max_seq_len=2048))
    flat = cache.block_table.reshape(-1)
    rng = np.random.default_rng(0)
    for _ in range(50):
        slot, layer, lb = rng.integers(2), rng.integers(16), rng.integers(128)
        cache.block_table[slot, layer, lb] = 7
        assert flat[slot * 16 * 128 + layer * 128 + lb] == 7 == flat[cache.flat_index(slot, layer, lb)]
        cache.block_table[slot, layer, lb] = -1


def hf_greedy(hf_model, ids, n):
    out = hf_model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("name", ["gqa2-tied-default", "gqa3-untied-llama3-hub",
                                  "mha-untied-default", "gqa4-tied-llama3"])
def test_tiny_llama_tokens_and_logits_match_hf(tiny_llama, name):
    folder, hf = tiny_llama(name)
    model = pt.load_model(str(folder), dtype="float32")
    engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=256)
    engine.record_logits = True
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 320, n).tolist() for n in (5, 16, 17, 40)]
    logits_by_request = {i: [] for i in range(len(prompts))}

    def keep(report):
        for row, rid in enumerate(report.request_ids):
            logits_by_request[rid].append(report.logits[row])

    results = engine.generate(prompts, max_tokens=32, on_step=keep)
    for i, (prompt, res) in enumerate(zip(prompts, results)):
        assert res.token_ids == hf_greedy(hf, prompt, 32), f"prompt {i} ({len(prompt)} tokens)"
        full = torch.tensor([prompt + res.token_ids[:-1]])
        with torch.no_grad():
            ref = hf(full).logits[0, len(prompt) - 1:].float()
        ours = torch.stack(logits_by_request[i])
        rel = (ours - ref).norm() / ref.norm()
        assert rel < LOGIT_RTOL, f"prompt {i}: relative logit error {rel:.2e}"


def test_batch_invariance_through_two_slots(tiny_llama):
    folder, _ = tiny_llama("gqa3-untied-llama3-hub")
    model = pt.load_model(str(folder), dtype="float32")
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 320, n).tolist() for n in (3, 33, 16, 20, 9)]
    lengths = [20, 7, 31, 12, 25]
    batched = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=128)
    together = []
    for p, n in zip(prompts, lengths):
        batched.add_request(p, max_tokens=n, temperature=0.8, top_p=0.9, seed=5,
                            sample_key=len(together))
        together.append(p)
    batched.run_until_done()
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        alone = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=128)
        solo = alone.add_request(p, max_tokens=n, temperature=0.8, top_p=0.9, seed=5,
                                 sample_key=i)
        alone.run_until_done()
        assert batched.result(i).token_ids == alone.result(solo.request_id).token_ids
        assert len(batched.result(i).token_ids) == n


def test_block_accounting_every_step(tiny_llama):
    folder, _ = tiny_llama("gqa2-tied-default")
    model = pt.load_model(str(folder), dtype="float32")
    # each step committed before the next is launched: with a step launched ahead a request
    # also holds the block of its next token (tests/engine/test_async_scheduling.py)
    engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=128,
                       async_scheduling=False)
    cache = engine.cache
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 320, n).tolist() for n in (4, 18, 33)]
    steps = []

    def check(report):
        cache.check_invariants()
        owned = cache.block_table[cache.block_table >= 0]
        assert len(set(owned.tolist())) == owned.size
        assert owned.size + len(cache.free_blocks) == cache.NUM_BLOCKS
        # each running request owns exactly ceil(cached / BLOCK_SIZE) blocks in every layer
        for r in engine.scheduler.running:
            for layer in range(model.config.num_hidden_layers):
                assert cache.blocks_owned(r.slot, layer) == -(-r.num_computed_tokens // 16)
        steps.append(report.kind)

    engine.generate(prompts, max_tokens=17, on_step=check)
    assert "prefill" in steps and "decode" in steps
    assert (cache.block_table == -1).all()
    assert sorted(cache.free_blocks) == list(range(cache.NUM_BLOCKS))


def test_streaming_callback_and_iterator(smollm2_f32):
    engine = pt.Engine(smollm2_f32, backend="torch", max_slots=2, max_seq_len=512)
    pieces = []
    res = engine.generate(["Say hello."], max_tokens=12,
                          on_token=lambda i, tok, piece: pieces.append(piece))[0]
    assert "".join(pieces) == res.text
    streamed = "".join(engine.stream("Say hello.", max_tokens=12))
    assert streamed == res.text


SMOL_PROMPTS = ["What is the capital of France?",
                "Write a haiku about the sea.",
                "List three prime numbers and explain why they are prime.",
                "Translate 'good morning' into Spanish and German."]


@pytest.mark.slow
def test_smollm2_greedy_matches_hf_float32(smollm2_f32, hf_smollm2):
    engine = pt.Engine(smollm2_f32, backend="torch", max_slots=2, max_seq_len=1024)
    results = engine.generate(SMOL_PROMPTS, max_tokens=40)
    assert results[0].text.startswith("The capital of France is Paris")
    for prompt, res in zip(SMOL_PROMPTS, results):
        ids = res.prompt_token_ids
        ref = hf_greedy(hf_smollm2, ids, 40)
        # HF keeps generating up to max_new_tokens only if no EOS; compare up to our stop
        assert res.token_ids == ref[:len(res.token_ids)], prompt
        assert len(res.token_ids) == 40 or res.finish_reason == "eos"


def test_finish_reasons(tiny_llama):
    folder, _ = tiny_llama("gqa2-tied-default")
    model = pt.load_model(str(folder), dtype="float32")
    engine = pt.Engine(model, backend="torch", max_slots=2, max_seq_len=40)
    with pytest.raises(pt.AdmissionError, match="the prompt has 40 tokens but max_seq_len is 40"):
        engine.generate([[2] * 30, [1] * 40], max_tokens=20)
    assert not engine.has_unfinished() and engine.num_requests == 0    # nothing was queued
    fits_edge, zero = engine.generate([[2] * 30, [3] * 5], max_tokens=20)
    assert fits_edge.finish_reason == "max_seq_len" and len(fits_edge.token_ids) == 10
    assert zero.finish_reason == "length" and len(zero.token_ids) == 20


@pytest.mark.parametrize("every_batch_size", [False, True])
def test_warm_up_serves_one_request_and_leaves_no_trace(every_batch_size):
    from paged_tutorial.loading.models import random_model
    from helpers.fixtures_loading import tiny_config

    model = random_model(tiny_config(), seed=0)
    warmed = pt.Engine(model, backend="torch")
    free_before = sorted(warmed.cache.free_blocks)
    warmed.warm_up(every_batch_size=every_batch_size)    # no graphs on a CPU: the same
    assert warmed.step_count == 2 and not warmed.has_unfinished()
    assert sorted(warmed.cache.free_blocks) == free_before
    fresh = pt.Engine(model, backend="torch")
    prompt = [[5, 6, 7]]
    assert warmed.generate(prompt, max_tokens=4, chat=False)[0].token_ids == \
        fresh.generate(prompt, max_tokens=4, chat=False)[0].token_ids
    warmed.add_request([5, 6], max_tokens=2, chat=False)
    with pytest.raises(RuntimeError, match="before any request"):
        warmed.warm_up()
