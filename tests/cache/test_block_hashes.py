"""A request's block hashes are computed once, kept on the request, and read by every
admission check of the prefix cache."""

from __future__ import annotations

import pytest

import paged_tutorial as pt
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.cache.prefix_cache import PrefixCache, chain_hash
from paged_tutorial.config import CacheConfig
from paged_tutorial.engine.request import Request
from paged_tutorial.engine.scheduler import Scheduler

BS = 16


class RehashingPrefixCache(PrefixCache):
    """A mutant that ignores ``Request.block_hashes`` and hashes the prompt at every check."""

    def prompt_keys(self, request):
        return self.block_keys(request.prompt_ids)


def hash_calls_admitting_two_five_block_prompts(allocator_cls) -> int:
    """Hash calls while one ``schedule()`` admits two prompts of 5 full blocks (and a token)."""
    calls = []

    def counting_hash(parent, tokens):
        calls.append(tokens)
        return chain_hash(parent, tokens)

    config = CacheConfig(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32",
                         kv_cache_bytes=32 * 2 * BS * 8 * 4, max_slots=2, max_seq_len=128)
    cache = PagedKVCache(config, allocator=lambda c, t, e: allocator_cls(
        c, t, e, hash_fn=counting_hash))
    scheduler = Scheduler(cache.allocator, max_slots=2, max_seq_len=128)
    for i, first in enumerate((1, 200)):
        scheduler.add(Request(i, list(range(first, first + 5 * BS + 1)), pt.SamplingParams()))
    batch = scheduler.schedule()
    assert batch.kind == "prefill" and len(batch.requests) == 2
    return len(calls)


def check_hashed_once(allocator_cls) -> None:
    calls = hash_calls_admitting_two_five_block_prompts(allocator_cls)
    assert calls == 10, f"{calls} hash calls to admit two 5-block prompts; 10 hash each once"


def test_two_five_block_prompts_take_ten_hash_calls():
    check_hashed_once(PrefixCache)
    assert hash_calls_admitting_two_five_block_prompts(RehashingPrefixCache) == 20


def test_the_count_catches_a_cache_that_rehashes_at_every_check():
    with pytest.raises(AssertionError, match="hash calls"):
        check_hashed_once(RehashingPrefixCache)


def test_the_hashes_on_the_request_are_the_chain_keys_of_its_full_blocks():
    config = CacheConfig(num_layers=1, num_kv_heads=1, head_dim=8, dtype="float32",
                         kv_cache_bytes=8 * 2 * BS * 8 * 4, max_slots=1, max_seq_len=64)
    cache = pt.cache.PrefixCachingKVCache(config)
    prompt = list(range(40))
    request = Request(0, prompt, pt.SamplingParams())
    assert request.block_hashes is None
    cache.allocator.can_allocate_prompt(0, request)
    first = chain_hash(None, tuple(prompt[:16]))
    assert request.block_hashes == [first, chain_hash(first, tuple(prompt[16:32]))]
