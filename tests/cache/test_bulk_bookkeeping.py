"""A request of many blocks is admitted and released with a few table edits, not one Python
operation per (layer, logical block) entry: 16 requests of 1056 tokens own ~17 000 entries in
Llama-3.2-1B's 16 layers, and that per-entry work once cost more than the prefill step it
prepared.  What a listener sees is unchanged: one event per entry, in the same order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import paged_tutorial as pt
from paged_tutorial.cache.block_allocator import FreeListAllocator
from paged_tutorial.cache.block_table import BlockTable
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.cache.prefix_cache import PrefixCachingKVCache
from paged_tutorial.config import CacheConfig
from paged_tutorial.engine.request import Request

BS = 16
LAYERS = 8
CONFIG = CacheConfig(num_layers=LAYERS, num_kv_heads=1, head_dim=8, dtype="float32",
                     kv_cache_bytes=400 * 2 * BS * 8 * 4, max_slots=3, max_seq_len=512)


class CountingTable(BlockTable):
    """A block table that counts its single-entry edits."""
    single_edits = 0

    def assign(self, *args):
        CountingTable.single_edits += 1
        super().assign(*args)

    def unassign(self, *args):
        CountingTable.single_edits += 1
        return super().unassign(*args)


def counting_cache(cls, monkeypatch):
    monkeypatch.setattr("paged_tutorial.cache.paged_cache.BlockTable", CountingTable)
    CountingTable.single_edits = 0
    return cls(CONFIG)


PROMPT = list(range(1000, 1000 + 20 * BS + 3))          # 20 full blocks and 3 tokens


@pytest.mark.parametrize("cls", [PagedKVCache, PrefixCachingKVCache])
def test_admission_and_release_edit_the_table_in_bulk(cls, monkeypatch):
    cache = counting_cache(cls, monkeypatch)
    first, second = Request(0, PROMPT, pt.SamplingParams()), \
        Request(1, PROMPT, pt.SamplingParams())
    cache.allocator.allocate_prompt(0, first)
    cache.allocator.commit_step()
    cached = cache.allocator.allocate_prompt(1, second)
    assert cached == (20 * BS if cls is PrefixCachingKVCache else 0)
    cache.allocator.commit_step()
    cache.check_invariants()
    cache.release(0)
    cache.release(1)
    cache.check_invariants()
    assert CountingTable.single_edits == 0, \
        f"{CountingTable.single_edits} single-entry edits for 2 x {21 * LAYERS} entries"


def pop_by_pop(free: list[int], entries: np.ndarray, slot: int, n_logical: int):
    """The article's order: every layer, every -1 entry below n_logical, one pop each."""
    for layer in range(entries.shape[1]):
        for logical in range(n_logical):
            if entries[slot, layer, logical] == -1:
                entries[slot, layer, logical] = free.pop()


def test_bulk_growth_and_release_keep_the_articles_order():
    cache = PagedKVCache(CONFIG)
    events = []
    cache.add_listener(events.append)
    free, entries = list(cache.free_blocks), cache.block_table.copy()
    cache.ensure_capacity(0, 5 * BS)
    pop_by_pop(free, entries, 0, 5)
    cache.ensure_capacity(0, 7 * BS + 1)                  # grows from a partly filled row
    pop_by_pop(free, entries, 0, 8)
    assert np.array_equal(cache.block_table, entries) and cache.free_blocks == free
    pops = [(e.block, e.layer, e.logical_block) for e in events]
    assert pops == [(int(entries[0, layer, j]), layer, j) for first, last in ((0, 5), (5, 8))
                    for layer in range(LAYERS) for j in range(first, last)]
    events.clear()
    freed = cache.release(0)
    assert freed == entries[0][entries[0] >= 0].tolist()  # layer by layer, logical order
    assert cache.free_blocks == free + freed
    assert [(e.kind, e.block, e.layer, e.logical_block) for e in events] == \
        [("push", int(entries[0, layer, j]), layer, j) for layer in range(LAYERS)
         for j in range(8)]


def test_no_listener_no_event_tuples(monkeypatch):
    """Without a listener an allocation builds no per-entry event list."""
    cache = PrefixCachingKVCache(CONFIG)
    emitted = []
    monkeypatch.setattr(cache.listeners, "emit", lambda events: emitted.append(len(events)))
    cache.allocator.allocate_prompt(0, Request(0, PROMPT, pt.SamplingParams()))
    cache.allocator.commit_step()
    cache.allocator.allocate_prompt(1, Request(1, PROMPT, pt.SamplingParams()))
    cache.release(0)
    assert sum(emitted) == 0, f"{sum(emitted)} event tuples built with nobody listening"


def test_admission_walks_a_cached_prompt_once():
    """``can_allocate_prompt`` and ``allocate_prompt`` ask about the same request with the
    index unchanged: the second reads the first's walk (each walk calls the share rule once
    per block)."""
    from paged_tutorial.cache.prefix_cache import may_share
    from paged_tutorial.engine.scheduler import Scheduler

    calls = []

    def counting_rule(*args):
        calls.append(args[3])
        return may_share(*args)

    cache = PrefixCachingKVCache(CONFIG, share_rule=counting_rule)
    scheduler = Scheduler(cache.allocator, max_slots=3, max_seq_len=512)
    scheduler.add(Request(0, PROMPT, pt.SamplingParams()))
    scheduler.postprocess(scheduler.schedule(), [1])          # computed and committed
    calls.clear()
    scheduler.add(Request(1, PROMPT, pt.SamplingParams()))
    batch = scheduler.schedule()
    assert batch.requests[0].num_computed_tokens == 20 * BS
    assert calls == list(range(20)), f"share rule asked for blocks {calls}"
    cache.check_invariants()
