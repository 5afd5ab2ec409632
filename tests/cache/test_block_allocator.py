"""The allocator contract (what a scheduler may call) and the article's free-list allocator."""

from __future__ import annotations

import ast
import inspect

import numpy as np
import pytest

import paged_tutorial as pt
from paged_tutorial.cache.block_allocator import BlockAllocator, CacheFullError, FreeListAllocator
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig
from paged_tutorial.engine import scheduler
from paged_tutorial.engine.request import Request

CONFIG = CacheConfig(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32",
                     kv_cache_bytes=8 * 2 * 16 * 8 * 4, max_slots=2, max_seq_len=64)


def request(n_tokens: int) -> Request:
    return Request(0, list(range(1, n_tokens + 1)), pt.SamplingParams())


def contract() -> set[str]:
    """The public methods and properties of ``BlockAllocator``."""
    return {name for name in dir(BlockAllocator) if not name.startswith("_")}


def test_the_scheduler_calls_only_the_contract():
    tree = ast.parse(inspect.getsource(scheduler))
    called = {node.attr for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "blocks"}
    assert called, "the scheduler reaches its allocator through self.blocks"
    assert called <= contract(), f"outside the contract: {sorted(called - contract())}"


def test_an_allocator_must_fill_in_the_whole_contract():
    class Partial(BlockAllocator):
        def blocks_available(self):
            return 0

    cache = PagedKVCache(CONFIG)
    with pytest.raises(TypeError, match="abstract"):
        Partial(CONFIG, cache.table, cache.listeners)
    with pytest.raises(TypeError, match="must return a BlockAllocator"):
        PagedKVCache(CONFIG, allocator=lambda config, table, listeners: object())


def test_the_article_pops_from_the_end_and_pushes_back_in_loop_order():
    cache = PagedKVCache(CONFIG)
    allocator = cache.allocator
    events = []
    cache.add_listener(events.append)
    assert allocator.can_allocate_prompt(0, request(17))
    assert allocator.allocate_prompt(0, request(17)) == 0      # nothing is ever cached here
    n = CONFIG.NUM_BLOCKS
    assert cache.block_table[0, :, :2].tolist() == [[n - 1, n - 2], [n - 3, n - 4]]
    assert [e.kind for e in events] == ["pop"] * 4
    allocator.ensure_capacity(0, 32)                            # block 1 holds position 31
    assert allocator.num_free == n - 4
    allocator.ensure_capacity(0, 33)
    assert allocator.num_free == n - 6
    assert not allocator.prefix_in_flight(request(17))
    assert allocator.evictable_blocks() == [] and allocator.num_evictable_blocks == 0
    allocator.commit_step()
    allocator.discard_uncommitted()
    assert allocator.num_free == n - 6                          # a step boundary moves nothing
    events.clear()
    pushed = allocator.release(0)
    assert pushed == [n - 1, n - 2, n - 5, n - 3, n - 4, n - 6]   # layer by layer
    assert allocator.free_blocks[-6:] == pushed and (cache.block_table == -1).all()
    assert [e.kind for e in events] == ["push"] * 6
    allocator.check_invariants()


def test_a_request_that_does_not_fit_changes_nothing():
    cache = PagedKVCache(CONFIG)
    allocator = cache.allocator
    allocator.ensure_capacity(1, 48)                            # 3 blocks x 2 layers of 8
    before = (cache.block_table.copy(), list(cache.free_blocks))
    assert not allocator.can_grow(0, 17) and not allocator.can_allocate_prompt(0, request(17))
    with pytest.raises(CacheFullError, match="needs 4 blocks, 2 available"):
        allocator.allocate_prompt(0, request(17))
    assert np.array_equal(before[0], cache.block_table) and before[1] == cache.free_blocks
    with pytest.raises(ValueError, match="exceed max_seq_len"):
        allocator.ensure_capacity(0, 65)


def test_check_invariants_finds_a_block_both_owned_and_free():
    cache = PagedKVCache(CONFIG)
    cache.ensure_capacity(0, 1)
    cache.free_blocks.append(int(cache.block_table[0, 0, 0]))
    with pytest.raises(AssertionError, match="free_blocks holds a block twice|owned and free"):
        cache.check_invariants()


def test_slots_to_grow_names_exactly_the_slots_a_decode_token_makes_grow():
    for n in range(1, CONFIG.max_seq_len + 1):
        cache = PagedKVCache(CONFIG)
        cache.allocator.ensure_capacity(0, n)
        predicted = cache.allocator.slots_to_grow([0], [n + 1]) == [0]
        before = (cache.block_table.copy(), list(cache.free_blocks))
        try:
            cache.allocator.ensure_capacity(0, n + 1)
            changed = not np.array_equal(before[0], cache.block_table) or \
                before[1] != cache.free_blocks
        except ValueError:                   # past max_seq_len
            changed = True
        assert predicted == changed, (n, predicted, changed)


def test_an_allocator_with_its_own_growth_is_asked_for_every_slot():
    class OwnGrowth(FreeListAllocator):
        def ensure_capacity(self, slot, new_len):
            super().ensure_capacity(slot, new_len)

    cache = PagedKVCache(CONFIG, allocator=OwnGrowth)
    assert cache.allocator.slots_to_grow([0, 1], [5, 6]) == [0, 1]
