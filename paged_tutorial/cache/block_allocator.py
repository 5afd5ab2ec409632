"""Who owns which physical block: the ``free_blocks`` stack and the contract a scheduler uses.

``BlockAllocator`` is that contract: the only cache methods the scheduler
(``engine/scheduler.py``) calls.  ``FreeListAllocator`` follows the article: ``free_blocks``
starts as 0..NUM_BLOCKS-1 and is used as a stack, allocation pops from the end, release pushes
back (``src/main.cpp:577-578``, ``266-272``, ``859-865``, ``1018-1029``).  The prefix cache
(``prefix_cache.PrefixCache``) extends it; chapter 06's puzzles replace its rules.

A request handed to the prompt methods needs ``prompt_ids``, ``total_len`` (its prompt plus
what it generated before a preemption) and a ``block_hashes`` attribute the prefix cache fills
once (``engine/request.py``'s ``Request``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from paged_tutorial.cache.block_table import BlockTable
from paged_tutorial.cache.events import BlockListeners
from paged_tutorial.config import CacheConfig


class CacheFullError(RuntimeError):
    """Raised by ``ensure_capacity`` / ``allocate_prompt`` when too few blocks are available
    (the scheduler preempts, or waits, on it)."""


class BlockAllocator(ABC):
    """What a scheduler may call, between engine steps:

    - admission: ``prefix_in_flight(request)`` (wait one step?), ``can_allocate_prompt(slot,
      request)``, ``allocate_prompt(slot, request)`` -> prompt tokens already cached;
    - growth: ``can_grow(slot, new_len)``, ``ensure_capacity(slot, new_len)`` (raises
      ``CacheFullError``, changing nothing), ``slots_to_grow(slots, new_lens)`` (which of a
      decode step's slots need ``ensure_capacity`` at all);
    - retirement and preemption: ``release(slot)``;
    - the step's end: ``commit_step()`` (the model ran) or ``discard_uncommitted()`` (it
      failed, the batch is rolled back);
    - accounting: ``blocks_available()``, ``num_free``, ``num_evictable_blocks``,
      ``evictable_blocks()``, ``blocks_owned(slot)``, ``check_invariants()``.

    Every method that changes ownership edits the ``BlockTable`` and emits its events through
    the ``BlockListeners`` once it has completed."""

    def __init__(self, config: CacheConfig, table: BlockTable, events: BlockListeners):
        self.config = config
        self.table = table
        self.events = events
        self.free_blocks: list[int] = list(range(config.NUM_BLOCKS))

    # --- accounting (shared by every allocator) -------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def blocks_owned(self, slot: int, layer: int | None = None) -> int:
        return self.table.blocks_owned(slot, layer)

    def blocks_needed(self, slot: int, new_len: int) -> int:
        """Blocks that growing ``slot`` to ``new_len`` tokens would take (all layers)."""
        have = int((self.table.entries[slot, 0] >= 0).sum())
        return max(0, self.config.blocks_for_tokens(new_len) - have) * self.config.num_layers

    def can_grow(self, slot: int, new_len: int) -> bool:
        """Whether ``ensure_capacity(slot, new_len)`` would find enough blocks."""
        return self.blocks_needed(slot, new_len) <= self.blocks_available()

    def check_length(self, slot: int, new_len: int) -> None:
        if new_len > self.config.max_seq_len:
            raise ValueError(f"slot {slot}: {new_len} tokens exceed max_seq_len "
                             f"{self.config.max_seq_len}")

    @property
    def num_evictable_blocks(self) -> int:
        return len(self.evictable_blocks())

    def slots_to_grow(self, slots: list[int], new_lens: list[int]) -> list[int]:
        """The indices i for which ``ensure_capacity(slots[i], new_lens[i])`` may have
        something to do (take blocks, or refuse the length), in order: a decode step calls it
        for those only.  Here every index; an allocator that can tell at once which slots
        already hold their blocks answers fewer."""
        return list(range(len(slots)))

    # --- the contract each allocator fills in -----------------------------------------------
    @abstractmethod
    def evictable_blocks(self) -> list[int]:
        """Blocks nobody uses that are kept for their K/V (an allocation may evict them)."""

    @abstractmethod
    def blocks_available(self) -> int:
        """Blocks an allocation may take now."""

    @abstractmethod
    def prefix_in_flight(self, request) -> bool:
        """Whether part of the request's prompt is being computed by a request admitted this
        step (waiting one step would find it cached)."""

    @abstractmethod
    def can_allocate_prompt(self, slot: int, request) -> bool:
        """Whether ``allocate_prompt(slot, request)`` would find enough blocks now."""

    @abstractmethod
    def allocate_prompt(self, slot: int, request) -> int:
        """Give a slot that owns nothing its blocks for ``request.total_len`` tokens.  Returns
        how many leading tokens are already in the cache.  Raises CacheFullError, changing
        nothing, if the blocks are not available."""

    @abstractmethod
    def ensure_capacity(self, slot: int, new_len: int) -> None:
        """Give ``slot`` blocks (every layer) for positions < new_len.  Raises
        CacheFullError, changing nothing, if too few blocks are available."""

    @abstractmethod
    def release(self, slot: int) -> list[int]:
        """Reset every entry of the slot; returns the blocks pushed back to free_blocks."""

    @abstractmethod
    def commit_step(self) -> None:
        """The step's model run succeeded: what it computed is in the cache for good."""

    @abstractmethod
    def discard_uncommitted(self) -> None:
        """The step's model run failed: forget anything that promised its results."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Raise AssertionError if the block accounting does not add up."""


class FreeListAllocator(BlockAllocator):
    """The article's allocator: every block a slot owns is its own, popped empty from the end
    of ``free_blocks`` when a logical block is first needed, pushed back when the slot is
    released.  Nothing outlives a step, so a step has nothing to commit or discard."""

    def evictable_blocks(self) -> list[int]:
        return []                        # a block nobody uses is free

    def blocks_available(self) -> int:
        return len(self.free_blocks)

    def prefix_in_flight(self, request) -> bool:
        return False                     # nothing is shared, so nothing is worth waiting for

    def can_allocate_prompt(self, slot: int, request) -> bool:
        return self.can_grow(slot, request.total_len)

    def allocate_prompt(self, slot: int, request) -> int:
        self.ensure_capacity(slot, request.total_len)
        return 0                         # every block is popped empty

    def ensure_capacity(self, slot: int, new_len: int) -> None:
        """A block is popped only when a logical block is first needed (its entry is -1), as
        the article's prefill and decode paths do."""
        self.check_length(slot, new_len)
        n_logical = self.config.blocks_for_tokens(new_len)
        if n_logical == 0 or self.table.entries[slot, 0, n_logical - 1] >= 0:
            return          # most decode steps: the last block still has room (blocks are
            #                 taken in logical order and all layers grow together)
        need = self.blocks_needed(slot, new_len)
        if need > self.blocks_available():
            raise CacheFullError(f"slot {slot} needs {need} blocks, {self.blocks_available()} "
                                 "available")
        events = []
        self._grow(slot, n_logical, events)
        self.events.emit(events)

    def slots_to_grow(self, slots: list[int], new_lens: list[int]) -> list[int]:
        """A decode step grows each slot by one token, whose positions before it already
        have their blocks (all layers grow together, in logical order): only a token that
        opens a logical block (``(new_len - 1) % BLOCK_SIZE == 0``) can need one, and a
        length past max_seq_len is refused by ``ensure_capacity``.  Tested in Python, no
        table read: on most steps no index is returned.  A subclass with its own
        ``ensure_capacity`` gets every index, as from the contract."""
        if type(self).ensure_capacity is not FreeListAllocator.ensure_capacity:
            return super().slots_to_grow(slots, new_lens)
        size, limit = self.config.BLOCK_SIZE, self.config.max_seq_len
        return [i for i, n in enumerate(new_lens) if (n - 1) % size == 0 or n > limit]

    def _grow(self, slot: int, n_logical: int, events: list) -> None:
        """Fill the slot's -1 entries below ``n_logical`` (every layer) with blocks taken by
        ``_take_block``, layer by layer and in logical order within a layer (the caller has
        checked that enough are available).  When ``free_blocks`` holds them all, they are
        taken in one slice, in the order entry-by-entry pops would give."""
        layers, logicals = np.nonzero(self.table.entries[slot, :, :n_logical] == -1)
        n = layers.size
        if n == 0:
            return
        if len(self.free_blocks) >= n:
            blocks = self.free_blocks[-n:][::-1]       # what n pops from the end return
            del self.free_blocks[-n:]
            self.table.assign_entries(slot, layers, logicals, blocks)
            if self.events.active:
                events.extend(("pop", block, slot, layer, logical, 1, None)
                              for block, layer, logical
                              in zip(blocks, layers.tolist(), logicals.tolist()))
            return
        for layer, logical in zip(layers.tolist(), logicals.tolist()):
            block = self._take_block(events)       # may evict (``PrefixCache``)
            self.table.assign(slot, layer, logical, block)
            events.append(("pop", block, slot, layer, logical, 1, None))

    def _take_block(self, events: list) -> int:
        """Pop the block for a new entry when ``free_blocks`` holds fewer than a growth needs
        (a subclass may then make room: the prefix cache evicts)."""
        return self.free_blocks.pop()

    def release(self, slot: int) -> list[int]:
        """Push every block the slot owns back to free_blocks and reset its entries to -1
        (``src/main.cpp:1018-1029``: layer by layer, logical block by logical block)."""
        layers, logicals, blocks = self.table.unassign_slot(slot)
        freed = blocks.tolist()
        self.free_blocks.extend(freed)
        if self.events.active:
            self.events.emit([("push", block, slot, layer, logical, 0, None)
                              for block, layer, logical
                              in zip(freed, layers.tolist(), logicals.tolist())])
        return freed

    def commit_step(self) -> None:
        pass                             # the step's blocks are already its slots' own

    def discard_uncommitted(self) -> None:
        pass                             # a rollback releases the slots, blocks and all

    def check_invariants(self) -> None:
        """Each block is owned by at most one entry or free, never both, and all are one or
        the other."""
        n = self.config.NUM_BLOCKS
        owned = self.table.entries[self.table.entries >= 0]
        if owned.size and (owned.max() >= n):
            raise AssertionError("block table points past NUM_BLOCKS")
        if len(np.unique(owned)) != owned.size:
            raise AssertionError("a physical block has more than one owner")
        free = np.asarray(self.free_blocks, dtype=np.int64)
        if len(np.unique(free)) != free.size:
            raise AssertionError("free_blocks holds a block twice")
        if np.intersect1d(owned, free).size:
            raise AssertionError("a block is both owned and free")
        if owned.size + free.size != n:
            raise AssertionError(f"owned ({owned.size}) + free ({free.size}) != NUM_BLOCKS "
                                 f"({n})")
