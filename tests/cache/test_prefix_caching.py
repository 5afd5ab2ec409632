"""Prefix caching: full prompt blocks shared by hash, reference counts, cached blocks
kept after use and evicted least-recently-used.

Every engine test checks the block accounting after every step with ``accounting`` below,
which recomputes it from the block table and the free list independently of the cache's own
``check_invariants``, and compares greedy tokens with those the request gets alone on an engine
*without* prefix caching."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.backends.base import Backend
from paged_tutorial.config import CacheConfig, ModelConfig
from paged_tutorial.cache.events import EVENT_KINDS
from paged_tutorial.engine.request import Request
from paged_tutorial.step_inputs import prefill_layout
from paged_tutorial.cache.prefix_cache import PrefixCachingKVCache, chain_hash, may_share
from helpers.streams import Boom, SwitchableFailure, drive
from helpers.threads import generate_in_threads

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                   max_position_embeddings=512, tie_word_embeddings=False)
BS = 16
BLOCK_BYTES = 2 * BS * TINY.kv_dim * 4
rng0 = np.random.default_rng(7)
SYSTEM = rng0.integers(0, 97, 40).tolist()          # a "system prompt" of 2.5 blocks


@pytest.fixture(scope="module")
def tiny_model():
    return pt.random_model(TINY, dtype="float32", seed=0)


def make_engine(model, backend="torch", **kw):
    kw.setdefault("max_slots", 3)
    kw.setdefault("max_seq_len", 96)
    kw.setdefault("prefix_caching", True)
    return pt.Engine(model, backend=backend, **kw)


@pytest.fixture(scope="module")
def solo(tiny_model):
    """Greedy tokens of one prompt served alone, prefix caching off."""
    memo = {}

    def get(prompt, n, max_seq_len=96):
        key = (tuple(prompt), n, max_seq_len)
        if key not in memo:
            engine = make_engine(tiny_model, max_slots=1, prefix_caching=False,
                                 max_seq_len=max_seq_len)
            memo[key] = engine.generate([prompt], max_tokens=n)[0].token_ids
        return memo[key]

    return get


def accounting(cache) -> dict:
    """Recompute the block accounting from the table, the free list and the index; raise if
    it does not add up.  Returns the three sets."""
    if not isinstance(cache, PrefixCachingKVCache):          # the article's cache
        cache.check_invariants()
        return {}
    table = cache.block_table
    counts = np.bincount(table[table >= 0], minlength=cache.NUM_BLOCKS)
    for record in cache.allocator.by_key.values():
        assert (counts[list(record.blocks)] == record.ref_count).all(), \
            "a record's reference count differs from the table"
    owned = set(np.flatnonzero(counts > 0).tolist())
    free = list(cache.free_blocks)
    assert len(set(free)) == len(free), "free_blocks holds a block twice"
    free = set(free)
    indexed = [b for entry in cache.allocator.by_key.values() for b in entry.blocks]
    assert len(set(indexed)) == len(indexed), "a block is reachable from two keys"
    cached = set(indexed) - owned
    assert not free & owned, "a referenced block is free"
    assert not free & set(indexed), "a free block is still findable by its hash"
    assert len(owned) + len(cached) + len(free) == cache.NUM_BLOCKS
    assert len(cached) == cache.num_evictable_blocks
    shared = set(np.flatnonzero(counts > 1).tolist())
    assert shared <= set(indexed), "a block used twice holds no registered prefix"
    cache.check_invariants()
    return {"owned": owned, "cached": cached, "free": free}


def assert_idle(engine):
    sets = accounting(engine.cache)
    engine.scheduler.check_invariants()
    assert not engine.has_unfinished()
    assert not sets["owned"] and (engine.cache.block_table == -1).all()


def small_cache(num_blocks=16, layers=2, slots=3, hash_fn=chain_hash, max_seq_len=64,
                share_rule=may_share):
    config = CacheConfig(num_layers=layers, num_kv_heads=1, head_dim=8, dtype="float32",
                         kv_cache_bytes=num_blocks * 2 * BS * 8 * 4, max_slots=slots,
                         max_seq_len=max_seq_len)
    cache = PrefixCachingKVCache(config, hash_fn=hash_fn, share_rule=share_rule)
    events = []
    cache.add_listener(events.append)
    return cache, events


def req(prompt, n_tokens=None):
    """A request with this prompt; ``n_tokens`` beyond the prompt stand for tokens it had
    generated before a preemption."""
    n_tokens = len(prompt) if n_tokens is None else n_tokens
    return Request(0, list(prompt), pt.SamplingParams(), output_ids=[0] * (n_tokens - len(prompt)))


def lru_keys(cache) -> list[int]:
    """Keys of the idle cached records, least recently used first."""
    return [record.key for record in cache.allocator.idle_records()]


def kinds(events, kind):
    return [e for e in events if e.kind == kind]


# --- the cache on its own ------------------------------------------------------------------
def test_a_second_request_shares_the_full_prompt_blocks():
    cache, events = small_cache()
    a = list(range(1, 41))                               # 2 full blocks + 8 tokens
    assert cache.allocator.allocate_prompt(0, req(a, 40)) == 0
    assert len(kinds(events, "register")) == 2 * 2       # 2 full blocks x 2 layers
    assert cache.allocator.prefix_in_flight(req(a[:32] + [90] * 5, 37))  # being computed this step
    assert cache.allocator.match(req(a[:32] + [90] * 5)) == []          # pending blocks are not shared yet
    cache.allocator.commit_step()
    events.clear()
    b = a[:32] + [90] * 5
    assert not cache.allocator.prefix_in_flight(req(b, 37))
    assert cache.allocator.allocate_prompt(1, req(b, 37)) == 32
    assert np.array_equal(cache.block_table[1, :, :2], cache.block_table[0, :, :2])
    assert cache.block_table[1, 0, 2] not in cache.block_table[0]
    assert [e.kind for e in events] == ["share"] * 4 + ["pop"] * 2
    assert all(e.ref_count == 2 for e in kinds(events, "share"))
    shared = cache.block_table[0, :, :2].ravel()
    assert (cache.reference_counts()[shared] == 2).all()
    accounting(cache)


def test_a_different_block_in_the_middle_stops_the_sharing():
    cache, _ = small_cache()
    a = list(range(1, 49))
    cache.allocator.allocate_prompt(0, req(a, 48))
    cache.allocator.commit_step()
    b = a[:16] + [0] * 16 + a[32:]                        # block 1 differs; block 2 equal again
    assert cache.allocator.allocate_prompt(1, req(b, 48)) == 16
    accounting(cache)


def test_at_least_one_prompt_token_is_computed():
    cache, _ = small_cache()
    a = list(range(1, 33))                                # exactly 2 blocks
    cache.allocator.allocate_prompt(0, req(a, 32))
    cache.allocator.commit_step()
    assert cache.allocator.allocate_prompt(1, req(a, 32)) == 16          # the last block is computed again
    # its recomputed copy of block 1 is private: the key is taken by slot 0's block
    assert cache.reference_counts()[cache.block_table[1, 0, 1]] == 1
    # a recomputed (preempted) request has generated tokens after its prompt: all of it
    assert cache.allocator.allocate_prompt(2, req(a, 40)) == 32
    accounting(cache)


def test_released_blocks_stay_cached_and_are_reused():
    cache, events = small_cache()
    a = list(range(1, 41))
    cache.allocator.allocate_prompt(0, req(a, 40))
    cache.allocator.commit_step()
    free_before = cache.num_free
    events.clear()
    pushed = cache.release(0)
    assert [e.kind for e in events] == ["push"] * 2 + ["cache"] * 4   # tail (partial) first
    assert len(pushed) == 2 and cache.num_free == free_before + 2
    assert cache.num_evictable_blocks == 4 and not set(cache.free_blocks) & set(cache.allocator.by_block)
    events.clear()
    assert cache.allocator.allocate_prompt(1, req(a[:32] + [5], 33)) == 32
    assert [e.kind for e in events] == ["reuse"] * 4 + ["pop"] * 2
    assert cache.num_evictable_blocks == 0
    accounting(cache)


def test_eviction_is_least_recently_used_and_tail_first():
    cache, events = small_cache(num_blocks=12, max_seq_len=80)   # 6 logical blocks x 2 layers
    a, b = list(range(1, 34)), list(range(40, 73))       # 2 full blocks + 1 token each
    for slot, p in ((0, a), (1, b)):
        cache.allocator.allocate_prompt(slot, req(p, 33))
        cache.allocator.commit_step()
    keys_a, keys_b = cache.allocator.block_keys(a, 2), cache.allocator.block_keys(b, 2)
    cache.release(0)                                      # a's entries enter the LRU first
    cache.release(1)
    assert lru_keys(cache) == [keys_a[1], keys_a[0], keys_b[1], keys_b[0]]
    # a prompt sharing only a's first block touches it: it becomes the most recent
    cache.allocator.allocate_prompt(0, req(a[:16] + [9] * 4, 20))
    cache.allocator.commit_step()
    cache.release(0)
    assert lru_keys(cache) == [keys_a[1], keys_b[1], keys_b[0], keys_a[0]]
    events.clear()
    # 5 logical blocks of new tokens: 2 free + 3 evicted (a1, b1, b0), a0 survives
    c = list(range(80, 97)) * 5
    assert cache.allocator.allocate_prompt(1, req(c[:65], 65)) == 0
    evicted = [e.key for e in kinds(events, "evict")]
    assert evicted == [keys_a[1]] * 2 + [keys_b[1]] * 2 + [keys_b[0]] * 2
    assert [(e.slot, e.logical_block) for e in kinds(events, "evict")] == \
        [(-1, 1)] * 4 + [(-1, 0)] * 2
    assert lru_keys(cache) == [keys_a[0]] and cache.allocator.evictions == 3
    assert cache.allocator.match(req(a[:16] + [1])) == [cache.allocator.by_key[keys_a[0]]]
    accounting(cache)


def test_allocation_that_does_not_fit_changes_nothing():
    cache, events = small_cache(num_blocks=8, max_seq_len=80)
    a = list(range(1, 34))
    cache.allocator.allocate_prompt(0, req(a, 33))
    cache.allocator.commit_step()
    snapshot = (cache.block_table.copy(), list(cache.free_blocks), cache.reference_counts())
    events.clear()
    with pytest.raises(pt.cache.CacheFullError):
        cache.allocator.allocate_prompt(1, req(a[:32] + list(range(50, 70)), 52))     # needs 2 + 2 more
    assert not events
    assert np.array_equal(snapshot[0], cache.block_table)
    assert snapshot[1] == cache.free_blocks and np.array_equal(snapshot[2], cache.reference_counts())
    # a hit on cached (unused) blocks is not counted as evictable room for itself
    cache.release(0)
    assert cache.allocator.blocks_available() == 8 and cache.num_evictable_blocks == 4
    with pytest.raises(pt.cache.CacheFullError):
        cache.allocator.allocate_prompt(1, req(a[:32] + list(range(50, 83)), 65))    # 3 new: 6 > 8 - 4
    assert cache.num_evictable_blocks == 4 and not cache.blocks_owned(1)
    assert cache.allocator.allocate_prompt(1, req(a[:32] + list(range(50, 77)), 59)) == 32
    accounting(cache)


def test_a_rule_that_would_leave_nothing_to_compute_is_refused():
    cache, _ = small_cache(share_rule=lambda *args: True)
    a = list(range(1, 33))
    cache.allocator.allocate_prompt(0, req(a, 32))
    cache.allocator.commit_step()
    with pytest.raises(ValueError, match="at least the last one must be computed"):
        cache.allocator.allocate_prompt(1, req(a, 32))
    accounting(cache)


def test_a_hash_collision_never_shares_different_tokens():
    cache, events = small_cache(hash_fn=lambda parent, tokens: 0)    # every block collides
    a, b = list(range(1, 34)), list(range(40, 73))
    cache.allocator.allocate_prompt(0, req(a, 33))
    cache.allocator.commit_step()
    assert len(cache.allocator.by_key) == 1                          # one key only: a's first block
    assert cache.allocator.match(req(b)) == []                           # same key, other tokens: refused
    assert cache.allocator.allocate_prompt(1, req(b, 33)) == 0
    assert not set(cache.block_table[1].ravel()) & set(cache.block_table[0].ravel()) - {-1}
    assert cache.allocator.allocate_prompt(2, req(a, 33)) == 16          # a's own block still matches
    accounting(cache)


def test_a_collision_after_a_different_parent_is_refused():
    """A hash that ignores the chain: block 1 of "V Y" and of "X Y" get the same key.  The
    stored parent must be the block matched before, or X Y would read V Y's K/V."""
    cache, _ = small_cache(hash_fn=lambda parent, tokens: chain_hash(None, tokens))
    v, x, y = [3] * 16, [4] * 16, list(range(20, 36))
    cache.allocator.allocate_prompt(0, req(v + y + [1], 33))            # registers V, then Y (parent V)
    cache.allocator.commit_step()
    cache.allocator.allocate_prompt(1, req(x + y + [1], 33))            # registers X; Y's key is taken
    cache.allocator.commit_step()
    assert cache.allocator.allocate_prompt(2, req(x + y + [1], 33)) == 16   # X shared, Y refused
    assert cache.block_table[2, 0, 1] != cache.block_table[0, 0, 1]
    accounting(cache)


def test_every_event_kind_is_documented():
    doc = pt.BlockEvent.__doc__
    for kind in EVENT_KINDS:
        assert f'"{kind}"' in doc


# --- the backend op -------------------------------------------------------------------------
@pytest.mark.parametrize("context, new", [(16, 5), (32, 16), (7, 9)])
def test_prefill_from_cache_equals_the_full_causal_prefill(context, new):
    """The tail of a prompt attending to its cached head gives the rows a full prefill gives."""
    torch.manual_seed(0)
    config = CacheConfig(num_layers=1, num_kv_heads=2, head_dim=8, dtype="float32",
                         kv_cache_bytes=8 * 2 * BS * 16 * 4, max_slots=2, max_seq_len=64)
    cache = pt.PagedKVCache(config)
    total = context + new
    cache.ensure_capacity(1, total)
    backend = pt.backends.make_backend("torch")
    q = torch.randn(total, 4, 8)
    k, v = torch.randn(total, 2, 8), torch.randn(total, 2, 8)
    table = cache.device_block_table()
    backend.write_kv(cache, k, v, table, 0, torch.full((total,), 1, dtype=torch.int32),
                     torch.arange(total, dtype=torch.int32))
    full = backend.prefill_attention(q, k, v, prefill_layout([0, total]), 0.3)
    tail = Backend.prefill_attention_from_cache(
        backend, q[context:].clone(), cache, table, 0,
        prefill_layout([0, new], context_lens=[context], seq_slots=[1]), 0.3)
    torch.testing.assert_close(tail, full[context:], rtol=1e-6, atol=1e-6)


# --- the engine -----------------------------------------------------------------------------
def shared_prompts():
    r = np.random.default_rng(3)
    return [SYSTEM + r.integers(0, 97, 9).tolist(),      # 49 tokens: shares 2 blocks
            SYSTEM + r.integers(0, 97, 30).tolist(),     # 70
            SYSTEM[:32],                                  # exactly 2 blocks: shares 1
            SYSTEM[:10],                                  # under a block: shares nothing
            SYSTEM + r.integers(0, 97, 9).tolist()]


def run_checked(engine, prompts, n):
    steps = []

    def on_step(report):
        accounting(engine.cache)
        engine.scheduler.check_invariants()
        steps.append(report)

    return engine.generate(prompts, max_tokens=n, on_step=on_step), steps


def test_greedy_tokens_are_identical_with_prefix_caching_on_and_off(tiny_model, solo):
    prompts = shared_prompts()
    on = make_engine(tiny_model)
    results, steps = run_checked(on, prompts, 12)
    off, off_steps = run_checked(make_engine(tiny_model, prefix_caching=False), prompts, 12)
    assert [r.token_ids for r in results] == [r.token_ids for r in off]
    assert [r.token_ids for r in results] == [solo(p, 12) for p in prompts]
    assert [r.num_cached_tokens for r in results] == [0, 32, 16, 0, 32]
    assert [r.num_cached_tokens for r in off] == [0] * 5
    computed = sum(s.num_tokens for s in steps if s.kind == "prefill")
    assert computed == sum(len(p) for p in prompts) - 80
    assert computed < sum(s.num_tokens for s in off_steps if s.kind == "prefill")
    assert_idle(on)
    # the prefix stays cached: a later call finds it without anyone holding it
    again = on.generate([prompts[1]], max_tokens=4)[0]        # all its 4 full blocks
    assert again.num_cached_tokens == 64 and again.token_ids == solo(prompts[1], 4)


def test_a_request_waits_one_step_for_a_prefix_being_computed(tiny_model):
    engine = make_engine(tiny_model)
    prompts = shared_prompts()[:2]
    for p in prompts:
        engine.add_request(p, max_tokens=3)
    first = engine.step()
    assert first.kind == "prefill" and len(first.request_ids) == 1
    second = engine.step()
    assert second.kind == "prefill" and second.num_tokens == len(prompts[1]) - 32
    engine.run_until_done()
    assert_idle(engine)


def test_nothing_is_written_into_a_shared_block(tiny_model):
    checked = []

    def on_call(call):
        if call.layer != 0:
            return
        cache = engine.cache
        for slot, pos in zip(call.values["slots"].tolist(), call.values["positions"].tolist()):
            block = int(cache.block_table[slot, 0, pos // BS])
            entry = cache.allocator.by_block.get(block)
            assert cache.reference_counts()[block] == 1, f"write into block {block} used by others"
            assert entry is None or entry.pending, "write into a cached prefix block"
            checked.append(block)

    backend = pt.RecordingBackend("torch", ops=["rope_write_kv"],
                                  keep={"rope_write_kv": ["slots", "positions"]},
                                  on_call=on_call)
    engine = make_engine(tiny_model, backend=backend)
    run_checked(engine, shared_prompts(), 20)
    assert checked
    assert_idle(engine)


def test_the_cached_prefix_is_read_by_the_context_attention(tiny_model):
    backend = pt.RecordingBackend("torch", ops=["prefill_attention",
                                                "prefill_attention_from_cache"],
                                  keep={"prefill_attention_from_cache": ["inputs"]})
    engine = make_engine(tiny_model, backend=backend)
    run_checked(engine, shared_prompts()[:2], 3)
    ctx = backend.calls_of("prefill_attention_from_cache", layer=0)
    assert len(ctx) == 1 and ctx[0].values["inputs"].context_lens_host == (32,)
    assert len(backend.calls_of("prefill_attention")) == TINY.num_hidden_layers   # 1st prompt


def test_preemption_and_eviction_under_cache_pressure(tiny_model, solo):
    # 10 blocks = 5 logical blocks: shared prefixes, growth, preemption and eviction
    engine = make_engine(tiny_model, kv_cache_bytes=10 * BLOCK_BYTES, max_slots=2,
                         max_seq_len=64)
    events = []
    engine.cache.add_listener(events.append)
    prompts = [SYSTEM[:33], SYSTEM[:32] + [5, 6, 7], list(range(50, 85)), SYSTEM[:40]]
    results, steps = run_checked(engine, prompts, 24)
    assert [r.token_ids for r in results] == [solo(p, 24, max_seq_len=64) for p in prompts]
    assert sum(r.num_preemptions for r in results) >= 1
    assert kinds(events, "evict") and kinds(events, "reuse")
    assert_idle(engine)


def test_a_failed_prefill_forgets_the_blocks_it_registered(tiny_model, solo):
    class FailOnce(pt.RecordingBackend):
        def __init__(self, op):
            self.armed = True

            def on_call(call):
                if self.armed:
                    self.armed = False
                    raise KeyboardInterrupt
            super().__init__("torch", ops=[op], on_call=on_call)

    prompts = shared_prompts()[:2]
    # fails in the first prefill: the 4 full blocks it registered must not stay findable
    engine = make_engine(tiny_model, backend=FailOnce("prefill_attention"))
    events = []
    engine.cache.add_listener(events.append)
    other = engine.add_request(prompts[1], max_tokens=6)
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    assert len(kinds(events, "unregister")) == 4 * 2 and not engine.cache.allocator.by_key
    accounting(engine.cache)
    engine.run_until_done(on_step=lambda r: accounting(engine.cache))
    assert engine.result(other.request_id).token_ids == solo(prompts[1], 6)
    assert_idle(engine)
    # fails in a prefill that found its prefix: the shared blocks go back to the cache
    engine = make_engine(tiny_model, backend=FailOnce("prefill_attention_from_cache"))
    engine.generate([prompts[0]], max_tokens=2)
    with pytest.raises(KeyboardInterrupt):
        engine.generate([prompts[1]], max_tokens=6)
    accounting(engine.cache)
    assert engine.cache.num_evictable_blocks == 3 * 2             # the first prompt's 3 full blocks
    res = engine.generate([prompts[1]], max_tokens=6)[0]
    assert res.token_ids == solo(prompts[1], 6) and res.num_cached_tokens == 32
    assert_idle(engine)


def test_cancel_and_stream_close_drop_only_their_references(tiny_model, solo):
    engine = make_engine(tiny_model)
    prompts = shared_prompts()
    keep = engine.add_request(prompts[0], max_tokens=10)
    victim = engine.add_request(prompts[1], max_tokens=30)
    stream = engine.stream(prompts[4], max_tokens=30)
    for _ in range(4):
        engine.step()
        accounting(engine.cache)
    shared = int(engine.cache.block_table[keep.slot, 0, 0])
    assert engine.cache.reference_counts()[shared] == 3
    engine.cancel(victim.request_id)
    assert engine.cache.reference_counts()[shared] == 2
    stream.close()
    assert engine.cache.reference_counts()[shared] == 1
    accounting(engine.cache)
    engine.run_until_done()
    assert engine.result(keep.request_id).token_ids == solo(prompts[0], 10)
    assert len(engine.cache.allocator.match(req(SYSTEM + [1]))) == 2       # the prefix outlives its users
    assert engine.cache.num_evictable_blocks == len(engine.cache.allocator.by_key) * TINY.num_hidden_layers
    assert_idle(engine)


def test_threads_share_a_prefix(tiny_model, solo):
    engine = make_engine(tiny_model)
    prompts = shared_prompts()
    jobs = {0: prompts[:2], 1: prompts[2:4], 2: prompts[4:]}
    out = generate_in_threads(engine, jobs, lambda k: 6 + k)
    for k, ps in jobs.items():
        assert out[k] == [solo(p, 6 + k) for p in ps]
    assert_idle(engine)


def test_the_events_rebuild_the_cache_state_every_step(tiny_model):
    from paged_tutorial.teaching.chapters.ch09_prefix_sharing.sharing import (
        CACHED, SHARED, SharingRecorder)

    engine = make_engine(tiny_model, kv_cache_bytes=12 * BLOCK_BYTES, max_slots=2,
                         max_seq_len=64)
    recorder = SharingRecorder(engine)
    for p in (SYSTEM[:33], SYSTEM[:32] + [5, 6, 7], list(range(50, 85)), SYSTEM[:40]):
        engine.add_request(p, max_tokens=20)
    steps = recorder.run(check=True)                # rebuilt state == cache state every step
    assert any(s.count(SHARED) for s in steps) and steps[-1].count(CACHED)
    assert recorder.key_steps()


def test_prefix_caching_argument_and_cli_flag(tiny_model):
    with pytest.raises(TypeError, match="prefix_caching must be True or False"):
        pt.Engine(tiny_model, backend="torch", prefix_caching="yes")
    engine = make_engine(tiny_model)
    assert "prefix caching on" in engine.describe()
    assert isinstance(engine.cache, PrefixCachingKVCache)
    assert type(make_engine(tiny_model, prefix_caching=False).cache) is pt.PagedKVCache
    from paged_tutorial.cli.options import build_parser

    assert build_parser().parse_args(["hi", "--prefix-caching"]).prefix_caching is True
    assert build_parser().parse_args(["hi"]).prefix_caching is False


@pytest.mark.slow
def test_numba_backend_runs_prefix_caching_through_the_default_op():
    from paged_tutorial.backends.numba_cuda import backend_name

    # small enough for the simulator: every CUDA thread is a Python thread
    SIM_CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=8, max_position_embeddings=128, tie_word_embeddings=True)
    model = pt.random_model(SIM_CONFIG, dtype="float32", seed=1)
    r = np.random.default_rng(1)
    head = r.integers(0, 64, 16).tolist()
    prompts = [head + r.integers(0, 64, 3).tolist(), head + r.integers(0, 64, 2).tolist()]
    kw = dict(max_slots=2, max_seq_len=32, kv_cache_bytes=16 * 2 * BS * SIM_CONFIG.kv_dim * 4)
    ref = pt.Engine(model, backend="torch", **kw).generate(prompts, max_tokens=3)
    engine = pt.Engine(model, backend=backend_name(), prefix_caching=True, **kw)
    ours = engine.generate(prompts, max_tokens=3)
    assert [r.token_ids for r in ours] == [r.token_ids for r in ref]
    assert [r.num_cached_tokens for r in ours] == [0, 16]
    accounting(engine.cache)


# --- random request streams built around shared prefixes -------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HASHES = {"blake2b": chain_hash,
          "4 keys": lambda parent, tokens: chain_hash(parent, tokens) % 4,
          "tokens only": lambda parent, tokens: chain_hash(None, tokens)}

event_st = st.tuples(st.integers(0, 6),                                    # step it happens at
                     st.sampled_from(["submit", "submit", "stream", "close", "cancel_thread",
                                      "fail"]),
                     st.integers(0, 2),                                     # which prefix
                     st.integers(0, 40),                                    # prefix length used
                     st.integers(0, 20),                                    # own tail length
                     st.integers(1, 20))                                    # max_tokens




@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(events=st.lists(event_st, min_size=1, max_size=8), cache_blocks=st.integers(6, 24),
       slots=st.integers(1, 3), seed=st.integers(0, 2**16),
       hash_name=st.sampled_from(sorted(HASHES)))
def test_random_streams_around_shared_prefixes(tiny_model, solo, events, cache_blocks, slots,
                                              seed, hash_name):
    backend = SwitchableFailure()
    engine = make_engine(tiny_model, backend=backend, max_slots=slots, max_seq_len=64,
                         kv_cache_bytes=cache_blocks * BLOCK_BYTES)
    engine.cache.allocator.hash_fn = HASHES[hash_name]
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 97, 40).tolist() for _ in range(2)] + [SYSTEM]

    def make_prompt(which, plen, tail):
        prompt = prefixes[which][:plen] + rng.integers(0, 97, tail).tolist()
        return prompt or [int(rng.integers(0, 97))]

    def check():
        accounting(engine.cache)
        engine.scheduler.check_invariants()

    finished = drive(engine, events, make_prompt, backend.arm, Boom, rng, check, max_seq_len=64)
    backend.armed = False
    assert_idle(engine)
    for res, prompt, n in finished:
        expected = solo(prompt, n, max_seq_len=64)
        assert res.num_cached_tokens % BS == 0 and res.num_cached_tokens < len(prompt)
        if res.finish_reason == "cancelled":
            assert res.token_ids == expected[:len(res.token_ids)]
        else:
            assert res.token_ids == expected, res.finish_reason
