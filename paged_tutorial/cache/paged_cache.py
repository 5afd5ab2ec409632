"""The paged KV cache: one flat buffer, a free list and a block table (article, part 6).

- ``buffer``: ``NUM_BLOCKS`` blocks of ``BLOCK_BYTES``; a block is K of ``BLOCK_SIZE`` tokens,
  then V of the same tokens ``V_OFFSET`` bytes later (``src/main.cpp:866-872``).
- ``free_blocks``: physical block ids not owned by anyone.  It starts as 0..NUM_BLOCKS-1 and is
  used as a stack, as in the article: allocation pops from the end, release pushes back
  (``src/main.cpp:577-578``, ``266-272``, ``859-865``, ``1018-1029``).
- ``block_table``: int32 [max_slots, n_layers, MAX_BLOCKS_PER_SEQ], -1 = unassigned.  Its flat
  index is the article's ``slot*N_LAYERS*MAX_BLOCKS_PER_SEQ + layer*MAX_BLOCKS_PER_SEQ +
  logical_block`` (numpy's C order gives exactly that).  Each layer of a sequence owns its own
  blocks.

Beyond the article, ``prefix_cache.PrefixCachingKVCache`` refines this class: full prompt
blocks shared between requests, reference counts, cached blocks evicted least-recently-used.
The hooks it overrides (``allocate_prompt``, ``can_allocate_prompt``, ``blocks_available``,
``_take_free_block``, ``release``, ``commit_step``, ``discard_uncommitted``) do the article's
thing here.

The host copy is the truth.  The kernels read a device copy; instead of copying all entries
after every change (the article copies the whole table each decode layer, TODO at
``src/main.cpp:551``), the cache records which entries changed and ``device_block_table()``
sends only those, once per engine step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from paged_tutorial.config import CacheConfig

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CacheFullError(RuntimeError):
    """Raised by ``ensure_capacity`` when ``free_blocks`` is too short (the scheduler preempts
    on it)."""


@dataclass(frozen=True)
class BlockEvent:
    """One change of a physical block, as a listener (``PagedKVCache.add_listener``) sees it.

    ``slot``, ``layer``, ``logical_block`` name the block-table entry that changed;
    ``ref_count`` is the number of table entries pointing at the block *after* the event;
    ``key`` is the block's hash when it holds a cached prompt prefix.

    Every cache emits:

    - ``"pop"``: taken from the end of ``free_blocks`` into ``block_table[slot, layer,
      logical_block]`` (count 0 -> 1);
    - ``"push"``: that entry reset to -1 and the block appended to ``free_blocks`` (1 -> 0).

    A cache with prefix caching (``prefix_cache.PrefixCachingKVCache``) also emits:

    - ``"register"``: the block, popped for a full block of prompt that this step computes, is
      now findable by its ``key`` (requests admitted in later steps may share it);
    - ``"share"``: the entry points at a block another entry already uses (n -> n+1, n >= 1);
    - ``"reuse"``: the entry points at a cached block nobody used (0 -> 1): a cache hit on a
      block that was kept after its last user finished;
    - ``"unshare"``: the entry reset to -1 while other entries still use the block (n -> n-1);
    - ``"cache"``: the entry reset to -1, nobody uses the block any more, and it stays cached,
      findable by its key, instead of going back to ``free_blocks`` (1 -> 0);
    - ``"evict"``: an unused cached block is dropped from the cache (least recently used
      first) and appended to ``free_blocks``, because an allocation found no free block;
    - ``"unregister"``: a block registered in a step that failed loses its key (its K/V were
      never completely computed), before the rollback releases it.

    ``"evict"`` and ``"unregister"`` change no table entry: their ``slot`` is -1, ``layer``
    the layer whose K/V the block holds and ``logical_block`` its position in the prompt."""
    kind: str
    block: int
    slot: int
    layer: int
    logical_block: int
    ref_count: int = -1
    key: int | None = None


#: every BlockEvent kind, in the order the docstring explains them
EVENT_KINDS = ("pop", "push", "register", "share", "reuse", "unshare", "cache", "evict",
               "unregister")


def check_block_entries(cache: "PagedKVCache", table, slot: int, layer: int, n_tokens: int,
                        where: str) -> None:
    """Debug check before a kernel follows the table: every logical block below ``n_tokens``
    of (slot, layer) must name a physical block in [0, NUM_BLOCKS).  ``table`` is a host copy
    (numpy or a CPU tensor) of the block table.  A wild entry would make the kernel read or
    write memory outside the cache; this raises a ValueError that names it instead."""
    n_logical = cache.config.blocks_for_tokens(n_tokens)
    row = np.asarray(table[slot, layer, :n_logical])
    bad = np.flatnonzero((row < 0) | (row >= cache.NUM_BLOCKS))
    if bad.size:
        logical = int(bad[0])
        entry = int(row[logical])
        what = "is unassigned (-1)" if entry == -1 else \
            f"is {entry}, outside [0, NUM_BLOCKS={cache.NUM_BLOCKS})"
        raise ValueError(
            f"{where}: block_table[slot={slot}, layer={layer}, logical_block={logical}] {what}, "
            f"but tokens up to {n_tokens} need it; the engine allocates blocks before a step "
            "(ensure_capacity) and never writes such entries: was the table edited by hand?")


class PagedKVCache:
    def __init__(self, config: CacheConfig, device: str | torch.device = "cpu"):
        self.config = config
        self.device = torch.device(device)
        # Article names, each derived once in CacheConfig.
        self.BLOCK_SIZE = config.BLOCK_SIZE
        self.KV_DIM = config.KV_DIM
        self.V_OFFSET = config.V_OFFSET
        self.BLOCK_BYTES = config.BLOCK_BYTES
        self.NUM_BLOCKS = config.NUM_BLOCKS
        self.MAX_BLOCKS_PER_SEQ = config.MAX_BLOCKS_PER_SEQ
        self.buffer = torch.zeros(config.NUM_BLOCKS * config.BLOCK_ELEMS,
                                  dtype=TORCH_DTYPES[config.dtype], device=self.device)
        self.free_blocks: list[int] = list(range(config.NUM_BLOCKS))
        self.block_table = np.full(
            (config.max_slots, config.num_layers, config.MAX_BLOCKS_PER_SEQ), -1, dtype=np.int32)
        self._block_table_device = torch.from_numpy(self.block_table).to(self.device) \
            if self.device.type != "cpu" else torch.from_numpy(self.block_table)
        self._dirty: set[int] = set()
        # Entries changed since the previous sync, summed over syncs: what a separate device
        # copy receives (on a GPU, what is sent; on the CPU the device table shares memory).
        self.dirty_entries_synced = 0
        self._listeners: list[Callable[[BlockEvent], None]] = []

    # --- observation ----------------------------------------------------------------------
    def add_listener(self, listener: Callable[[BlockEvent], None]) -> None:
        """Call ``listener(event)`` for every change of a block's owners (a ``BlockEvent``: pops
        from and pushes to ``free_blocks``, and with prefix caching the sharing events), in the
        order the cache did them.  Events are delivered after the
        operation that caused them has completed, so the cache is consistent when a listener
        runs, and stays so if it raises (the exception then propagates to the caller).
        Listeners observe; they must not change the cache or the engine."""
        if not callable(listener):
            raise TypeError(f"a listener must be callable, got {type(listener).__name__}")
        self._listeners.append(listener)

    def remove_listener(self, listener) -> None:
        self._listeners.remove(listener)

    def _notify(self, events: list[tuple]) -> None:
        """Deliver the events of one completed operation to every listener.  An event is
        (kind, block, slot, layer, logical_block, ref_count, key)."""
        if self._listeners and events:
            for kind, block, slot, layer, logical, ref_count, key in events:
                event = BlockEvent(kind, int(block), int(slot), int(layer), int(logical),
                                   int(ref_count), key)
                for listener in list(self._listeners):
                    listener(event)

    @property
    def num_blocks(self) -> int:
        return self.NUM_BLOCKS

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_evictable_blocks(self) -> int:
        """Blocks nobody uses that still hold K/V worth keeping (0 without prefix caching)."""
        return 0

    def blocks_available(self) -> int:
        """Blocks an allocation may take now: the free ones (with prefix caching, also the
        cached ones nobody uses, which it would evict)."""
        return len(self.free_blocks)

    def reference_counts(self) -> np.ndarray:
        """For every physical block, how many block-table entries point at it (0 or 1 here;
        with prefix caching a shared block has one entry per request that uses it)."""
        owned = self.block_table[self.block_table >= 0]
        return np.bincount(owned, minlength=self.NUM_BLOCKS)

    # --- addresses (the article's arithmetic, for notebooks and tests) --------------------
    def flat_index(self, slot: int, layer: int, logical_block: int) -> int:
        """The article's three-term index into the flat block table."""
        return (slot * self.config.num_layers * self.MAX_BLOCKS_PER_SEQ
                + layer * self.MAX_BLOCKS_PER_SEQ + logical_block)

    def k_byte_offset(self, physical_block: int, token_in_block: int, kv_head: int = 0,
                      dim: int = 0) -> int:
        c = self.config
        return (physical_block * self.BLOCK_BYTES + token_in_block * self.KV_DIM * c.ITEMSIZE
                + kv_head * c.head_dim * c.ITEMSIZE + dim * c.ITEMSIZE)

    def v_byte_offset(self, physical_block: int, token_in_block: int, kv_head: int = 0,
                      dim: int = 0) -> int:
        return self.k_byte_offset(physical_block, token_in_block, kv_head, dim) + self.V_OFFSET

    # --- ownership ------------------------------------------------------------------------
    def blocks_owned(self, slot: int, layer: int | None = None) -> int:
        rows = self.block_table[slot] if layer is None else self.block_table[slot, layer]
        return int((rows >= 0).sum())

    def blocks_needed(self, slot: int, new_len: int) -> int:
        """Free blocks that growing ``slot`` to ``new_len`` tokens would take (all layers)."""
        have = int((self.block_table[slot, 0] >= 0).sum())
        return max(0, self.config.blocks_for_tokens(new_len) - have) * self.config.num_layers

    def can_grow(self, slot: int, new_len: int) -> bool:
        """Whether ``ensure_capacity(slot, new_len)`` would find enough free blocks."""
        return self.blocks_needed(slot, new_len) <= self.blocks_available()

    def ensure_capacity(self, slot: int, new_len: int) -> None:
        """Give ``slot`` physical blocks (every layer) for positions < new_len.  A block is
        popped only when a logical block is first needed (its entry is -1), as the article's
        prefill and decode paths do.  Raises CacheFullError, changing nothing, if too few
        blocks are free."""
        if new_len > self.config.max_seq_len:
            raise ValueError(f"slot {slot}: {new_len} tokens exceed max_seq_len "
                             f"{self.config.max_seq_len}")
        n_logical = self.config.blocks_for_tokens(new_len)
        if n_logical == 0 or self.block_table[slot, 0, n_logical - 1] >= 0:
            return          # most decode steps: the last block still has room (blocks are
            #                 taken in logical order and all layers grow together)
        need = self.blocks_needed(slot, new_len)
        if need > self.blocks_available():
            raise CacheFullError(f"slot {slot} needs {need} blocks, {self.blocks_available()} "
                                 "available")
        events = []
        self._grow(slot, n_logical, events)
        self._notify(events)

    def _grow(self, slot: int, n_logical: int, events: list) -> None:
        """Fill the slot's -1 entries below ``n_logical`` (every layer) with blocks taken by
        ``_take_free_block`` (the caller has checked that enough are available)."""
        for layer in range(self.config.num_layers):
            row = self.block_table[slot, layer]
            for logical in np.flatnonzero(row[:n_logical] == -1).tolist():
                row[logical] = self._take_free_block(slot, layer, logical, events)
                self._dirty.add(self.flat_index(slot, layer, logical))

    def _take_free_block(self, slot: int, layer: int, logical: int, events: list) -> int:
        """Pop the block for a new entry."""
        block = self.free_blocks.pop()
        events.append(("pop", block, slot, layer, logical, 1, None))
        return block

    # --- admission and step boundaries (prefix caching refines these) ----------------------
    def can_allocate_prompt(self, slot: int, prompt_ids: list[int], new_len: int) -> bool:
        """Whether ``allocate_prompt`` would find enough blocks now."""
        return self.can_grow(slot, new_len)

    def allocate_prompt(self, slot: int, prompt_ids: list[int], new_len: int) -> int:
        """Give a slot that owns nothing its blocks for ``new_len`` tokens, the first of which
        are ``prompt_ids``.  Returns how many leading tokens are already in the cache (always 0
        here: every block is popped empty; a prefix cache returns the prompt tokens it found).
        Raises CacheFullError, changing nothing, if the blocks are not available."""
        self.ensure_capacity(slot, new_len)
        return 0

    def prefix_in_flight(self, prompt_ids: list[int], new_len: int) -> bool:
        """True if part of this prompt's prefix is being computed by a request admitted this
        step (so waiting one step would find it cached).  Never, without prefix caching."""
        return False

    def commit_step(self) -> None:
        """The step's model run succeeded: what it computed is now in the cache for good."""

    def discard_uncommitted(self) -> None:
        """The step's model run failed: forget anything that promised its results."""

    def release(self, slot: int) -> list[int]:
        """Push every block the slot owns back to free_blocks and reset its entries to -1
        (``src/main.cpp:1018-1029``: layer by layer, logical block by logical block)."""
        freed, events = [], []
        for layer in range(self.config.num_layers):
            row = self.block_table[slot, layer]
            for logical in np.flatnonzero(row >= 0):
                block = int(row[logical])
                freed.append(block)
                self.free_blocks.append(block)
                row[logical] = -1
                self._dirty.add(self.flat_index(slot, layer, int(logical)))
                events.append(("push", block, slot, layer, int(logical), 0, None))
        self._notify(events)
        return freed

    # --- the device copy ----------------------------------------------------------------
    def mark_table_changed(self, slot: int | None = None, layer: int | None = None,
                           logical_block: int | None = None) -> None:
        """Tell the cache that ``block_table`` was edited by hand (a notebook experiment, a
        test), so the next ``device_block_table()`` sends those entries.  With no argument
        every entry is re-sent.  The engine's own edits (ensure_capacity, release) mark
        themselves; on a CPU the device table shares memory and this changes nothing else."""
        if slot is None:
            self._dirty.update(range(self.block_table.size))
        else:
            self._dirty.add(self.flat_index(slot, layer, logical_block))

    def device_block_table(self) -> torch.Tensor:
        """The device block table, brought up to date by sending only changed entries."""
        self.dirty_entries_synced += len(self._dirty)
        if self.device.type == "cpu":
            self._dirty.clear()            # shares memory with the host table
            return self._block_table_device
        if self._dirty:
            idx = np.fromiter(sorted(self._dirty), dtype=np.int64)
            vals = self.block_table.reshape(-1)[idx]
            flat = self._block_table_device.view(-1)
            flat[torch.from_numpy(idx).to(self.device, non_blocking=False)] = \
                torch.from_numpy(vals).to(self.device)
            self._dirty.clear()
        return self._block_table_device

    # --- invariants (tests and notebooks call this at every step) -------------------------
    def check_invariants(self) -> None:
        owned = self.block_table[self.block_table >= 0]
        if owned.size and (owned.max() >= self.NUM_BLOCKS):
            raise AssertionError("block table points past NUM_BLOCKS")
        if len(np.unique(owned)) != owned.size:
            raise AssertionError("a physical block has more than one owner")
        free = np.asarray(self.free_blocks, dtype=np.int64)
        if len(np.unique(free)) != free.size:
            raise AssertionError("free_blocks holds a block twice")
        if np.intersect1d(owned, free).size:
            raise AssertionError("a block is both owned and free")
        if owned.size + free.size != self.NUM_BLOCKS:
            raise AssertionError(f"owned ({owned.size}) + free ({free.size}) != NUM_BLOCKS "
                                 f"({self.NUM_BLOCKS})")

    def owner_map(self) -> np.ndarray:
        """For every physical block, the flat block-table index that owns it, or -1."""
        owners = np.full(self.NUM_BLOCKS, -1, dtype=np.int64)
        flat = self.block_table.reshape(-1)
        where = np.flatnonzero(flat >= 0)
        owners[flat[where]] = where
        return owners
