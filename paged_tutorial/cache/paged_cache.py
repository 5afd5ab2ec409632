"""The paged KV cache (article, part 6), put together from one object per job:

- ``buffer`` (``kv_buffer.KVBuffer``): ``NUM_BLOCKS`` blocks of ``BLOCK_BYTES``, K then V
  ``V_OFFSET`` bytes later, and the byte-offset helpers;
- ``block_table`` (``block_table.BlockTable``): (slot, layer, logical block) -> physical block,
  -1 = unassigned, and its changed-entries sync to the device (``device_block_table``);
- ``allocator`` (``block_allocator.BlockAllocator``): ``free_blocks`` and the rules that move
  blocks between it and the table: the article's (``FreeListAllocator``) by default, prefix
  sharing with ``prefix_cache.PrefixCachingKVCache``;
- listeners (``events.BlockListeners``): every pop, push and share as a ``BlockEvent``.

``clone_cache`` makes an independent copy of a cache, on any device (the checkers' oracles).

The scheduler talks to ``allocator`` only; kernels read ``buffer`` and
``device_block_table()``; notebooks use the article's names listed here.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from paged_tutorial.cache.block_allocator import BlockAllocator, FreeListAllocator
from paged_tutorial.cache.block_table import BlockTable
from paged_tutorial.cache.events import BlockEvent, BlockListeners
from paged_tutorial.cache.kv_buffer import KVBuffer
from paged_tutorial.config import CacheConfig

#: builds a cache's allocator from its config, table and listeners
AllocatorFactory = Callable[[CacheConfig, BlockTable, BlockListeners], BlockAllocator]


class PagedKVCache:
    """The buffer, the table, the listeners and an allocator built by ``allocator(config,
    table, listeners)`` (default: the article's ``FreeListAllocator``), on ``device``."""

    def __init__(self, config: CacheConfig, device: str | torch.device = "cpu",
                 allocator: AllocatorFactory = FreeListAllocator):
        self.config = config
        self.device = torch.device(device)
        # Article names, each derived once in CacheConfig.
        self.BLOCK_SIZE = config.BLOCK_SIZE
        self.KV_DIM = config.KV_DIM
        self.V_OFFSET = config.V_OFFSET
        self.BLOCK_BYTES = config.BLOCK_BYTES
        self.NUM_BLOCKS = config.NUM_BLOCKS
        self.MAX_BLOCKS_PER_SEQ = config.MAX_BLOCKS_PER_SEQ
        self.kv = KVBuffer(config, self.device)
        self.table = BlockTable(config, self.device)
        self.listeners = BlockListeners()
        self.allocator = allocator(config, self.table, self.listeners)
        if not isinstance(self.allocator, BlockAllocator):
            raise TypeError(f"allocator(config, table, listeners) must return a BlockAllocator, "
                            f"got {type(self.allocator).__name__}")

    # --- the article's names ----------------------------------------------------------------
    @property
    def buffer(self) -> torch.Tensor:
        return self.kv.tensor

    @property
    def block_table(self) -> np.ndarray:
        """The host table, int32 [max_slots, n_layers, MAX_BLOCKS_PER_SEQ]; edit it by hand only
        with ``mark_table_changed`` after."""
        return self.table.entries

    @property
    def free_blocks(self) -> list[int]:
        return self.allocator.free_blocks

    @free_blocks.setter
    def free_blocks(self, blocks: list[int]) -> None:
        self.allocator.free_blocks = blocks

    @property
    def num_blocks(self) -> int:
        return self.NUM_BLOCKS

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def num_evictable_blocks(self) -> int:
        """Idle blocks kept for their prefix (0 without prefix caching)."""
        return self.allocator.num_evictable_blocks

    def evictable_blocks(self) -> list[int]:
        """The idle blocks kept for their prefix, which an allocation may evict."""
        return self.allocator.evictable_blocks()

    # --- observation ----------------------------------------------------------------------
    def add_listener(self, listener: Callable[[BlockEvent], None]) -> None:
        """Call ``listener(event)`` for every change of a block's owners (a ``BlockEvent``: pops
        from and pushes to ``free_blocks``, and with prefix caching the sharing events), in the
        order the cache did them.  Events are delivered after the operation that caused them
        has completed, so the cache is consistent when a listener runs, and stays so if it
        raises (the exception then propagates to the caller).  Listeners observe; they must
        not change the cache or the engine."""
        self.listeners.add(listener)

    def remove_listener(self, listener) -> None:
        self.listeners.remove(listener)

    # --- addresses (the article's arithmetic, for notebooks and tests) --------------------
    def flat_index(self, slot: int, layer: int, logical_block: int) -> int:
        return self.table.flat_index(slot, layer, logical_block)

    def k_byte_offset(self, physical_block: int, token_in_block: int, kv_head: int = 0,
                      dim: int = 0) -> int:
        return self.kv.k_byte_offset(physical_block, token_in_block, kv_head, dim)

    def v_byte_offset(self, physical_block: int, token_in_block: int, kv_head: int = 0,
                      dim: int = 0) -> int:
        return self.kv.v_byte_offset(physical_block, token_in_block, kv_head, dim)

    # --- ownership: the article's pop and push, and what they leave ---------------------
    def ensure_capacity(self, slot: int, new_len: int) -> None:
        """Give ``slot`` blocks for positions < new_len (the allocator's rules)."""
        self.allocator.ensure_capacity(slot, new_len)

    def release(self, slot: int) -> list[int]:
        """Give back every block of ``slot`` (the allocator's rules)."""
        return self.allocator.release(slot)

    def blocks_owned(self, slot: int, layer: int | None = None) -> int:
        return self.table.blocks_owned(slot, layer)

    def reference_counts(self) -> np.ndarray:
        """For every physical block, how many block-table entries point at it (0 or 1 without
        prefix caching; a shared block has one entry per request that uses it)."""
        return self.table.reference_counts()

    def owner_map(self) -> np.ndarray:
        """For every physical block, the flat block-table index that owns it, or -1."""
        return self.table.owner_map()

    def check_invariants(self) -> None:
        """Block accounting (tests and notebooks call this at every step)."""
        self.allocator.check_invariants()

    # --- the device copy ----------------------------------------------------------------
    @property
    def dirty_entries_synced(self) -> int:
        """Entries sent to the device table so far (changed entries only)."""
        return self.table.entries_synced

    def mark_table_changed(self, slot: int | None = None, layer: int | None = None,
                           logical_block: int | None = None) -> None:
        """Tell the cache that ``block_table`` was edited by hand (a notebook experiment, a
        test), so the next ``device_block_table()`` sends those entries.  With no argument
        every entry is re-sent.  The allocator's own edits mark themselves; on a CPU the
        device table shares memory and this changes nothing else."""
        self.table.mark_changed(slot, layer, logical_block)

    def device_block_table(self) -> torch.Tensor:
        """The device block table, brought up to date by sending only changed entries."""
        return self.table.device_table()


def clone_cache(cache: PagedKVCache, device=None) -> PagedKVCache:
    """An independent copy of a cache (config, buffer, block table, free list), on ``device``
    (default: the cache's)."""
    twin = PagedKVCache(cache.config, cache.device if device is None else device)
    twin.buffer.copy_(cache.buffer)
    twin.block_table[...] = cache.block_table
    twin.free_blocks = list(cache.free_blocks)
    twin.mark_table_changed()                  # send the whole table once
    return twin
