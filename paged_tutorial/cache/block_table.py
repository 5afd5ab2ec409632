"""The block table: int32 [max_slots, n_layers, MAX_BLOCKS_PER_SEQ], -1 = unassigned.

Its flat index is the article's ``slot*N_LAYERS*MAX_BLOCKS_PER_SEQ + layer*MAX_BLOCKS_PER_SEQ
+ logical_block`` (numpy's C order gives exactly that).  Each layer of a sequence owns its own
blocks; a slot is one row of the table (one running sequence).

The host copy is the truth.  The kernels read a device copy; instead of copying all entries
after every change (the article copies the whole table each decode layer, TODO at
``src/main.cpp:551``), the table records which entries changed and ``device_table()`` sends
only those, once per engine step.

A request of 1056 tokens owns 66 logical blocks in each of 16 layers: 1056 entries.  Admitting
or releasing a batch of such requests edits tens of thousands of entries, so the table offers
edits of many entries at once (``assign_entries``, ``assign_columns``, ``unassign_column``,
``unassign_slot``), each one NumPy operation, and records changes in a boolean array of the
table's shape rather than entry by entry.
"""

from __future__ import annotations

import numpy as np
import torch

from paged_tutorial.config import CacheConfig


class BlockTable:
    """The host table (``entries``), the device copy the kernels read, and the set of entries
    changed since the last sync."""

    def __init__(self, config: CacheConfig, device: torch.device):
        self.config = config
        self.device = device
        self.entries = np.full(
            (config.max_slots, config.num_layers, config.MAX_BLOCKS_PER_SEQ), -1, dtype=np.int32)
        host = torch.from_numpy(self.entries)
        self._device_entries = host.to(device) if device.type != "cpu" else host
        #: True where an entry changed since the last sync
        self._changed = np.zeros(self.entries.shape, dtype=bool)
        #: whether any entry of ``_changed`` may be True: most decode steps change nothing,
        #: and the sync then skips scanning the whole table
        self._any_changed = False
        # Entries changed since the previous sync, summed over syncs: what a separate device
        # copy receives (on a GPU, what is sent; on the CPU the device table shares memory).
        self.entries_synced = 0

    def flat_index(self, slot: int, layer: int, logical_block: int) -> int:
        """The article's three-term index into the flat block table."""
        m = self.config.MAX_BLOCKS_PER_SEQ
        return slot * self.config.num_layers * m + layer * m + logical_block

    # --- edits (each records the entries it changed) ---------------------------------------
    def assign(self, slot: int, layer: int, logical_block: int, block: int) -> None:
        self.entries[slot, layer, logical_block] = block
        self._changed[slot, layer, logical_block] = True
        self._any_changed = True

    def assign_entries(self, slot: int, layers: np.ndarray, logical_blocks: np.ndarray,
                       blocks) -> None:
        """``entries[slot, layers[i], logical_blocks[i]] = blocks[i]`` for every i, at once."""
        self.entries[slot, layers, logical_blocks] = blocks
        self._changed[slot, layers, logical_blocks] = True
        self._any_changed = True

    def assign_columns(self, slot: int, first_logical: int, blocks: np.ndarray) -> None:
        """Point (slot, every layer, logical blocks first_logical ..) at ``blocks``
        [n_layers, n]: column j holds logical block first_logical + j's block of each layer."""
        end = first_logical + blocks.shape[1]
        self.entries[slot, :, first_logical:end] = blocks
        self._changed[slot, :, first_logical:end] = True
        self._any_changed = True

    def unassign(self, slot: int, layer: int, logical_block: int) -> int:
        """Reset the entry to -1; returns the block it held."""
        block = int(self.entries[slot, layer, logical_block])
        self.entries[slot, layer, logical_block] = -1
        self._changed[slot, layer, logical_block] = True
        self._any_changed = True
        return block

    def unassign_column(self, slot: int, logical_block: int) -> np.ndarray:
        """Reset (slot, every layer, logical_block) to -1; returns the blocks they held, one
        per layer (-1 where a layer had none)."""
        blocks = self.entries[slot, :, logical_block].copy()
        self.entries[slot, :, logical_block] = -1
        self._changed[slot, :, logical_block] = True
        self._any_changed = True
        return blocks

    def unassign_slot(self, slot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reset every assigned entry of the slot to -1; returns (layers, logical blocks,
        blocks) of those entries, layer by layer and in logical order within a layer."""
        rows = self.entries[slot]
        layers, logicals = np.nonzero(rows >= 0)
        blocks = rows[layers, logicals]
        rows[layers, logicals] = -1
        self._changed[slot, layers, logicals] = True
        self._any_changed = True
        return layers, logicals, blocks

    def mark_changed(self, slot: int | None = None, layer: int | None = None,
                     logical_block: int | None = None) -> None:
        """Record an entry edited through ``entries`` directly (every entry with no
        argument), so the next ``device_table()`` sends it."""
        if slot is None:
            self._changed[...] = True
        else:
            self._changed[slot, layer, logical_block] = True
        self._any_changed = True

    @property
    def num_changed(self) -> int:
        """Entries the next ``device_table()`` will send."""
        return int(np.count_nonzero(self._changed)) if self._any_changed else 0

    # --- the device copy ----------------------------------------------------------------
    def device_table(self) -> torch.Tensor:
        """The device block table, brought up to date by sending only changed entries."""
        if not self._any_changed:
            return self._device_entries
        idx = np.flatnonzero(self._changed.reshape(-1))
        self.entries_synced += idx.size
        self._any_changed = False
        if idx.size:
            self._changed[...] = False
        if self.device.type == "cpu":            # shares memory with the host table
            return self._device_entries
        if idx.size:                             # (index, value) pairs in one copy
            pairs = torch.from_numpy(np.stack([idx, self.entries.reshape(-1)[idx]]))
            if self.device.type == "cuda":
                # pinned: the copy is queued and the host goes on (a copy from pageable
                # memory would wait for the stream); torch keeps the pinned block until
                # the copy has read it
                pairs = pairs.pin_memory()
            pairs = pairs.to(self.device, non_blocking=True)
            self._device_entries.view(-1)[pairs[0]] = pairs[1].to(torch.int32)
        return self._device_entries

    # --- reading ----------------------------------------------------------------------------
    def blocks_owned(self, slot: int, layer: int | None = None) -> int:
        rows = self.entries[slot] if layer is None else self.entries[slot, layer]
        return int((rows >= 0).sum())

    def reference_counts(self) -> np.ndarray:
        """For every physical block, how many entries point at it."""
        owned = self.entries[self.entries >= 0]
        return np.bincount(owned, minlength=self.config.NUM_BLOCKS)

    def owner_map(self) -> np.ndarray:
        """For every physical block, the flat index of the entry that holds it, or -1."""
        owners = np.full(self.config.NUM_BLOCKS, -1, dtype=np.int64)
        flat = self.entries.reshape(-1)
        where = np.flatnonzero(flat >= 0)
        owners[flat[where]] = where
        return owners


def check_block_entries(cache, table, slot: int, layer: int, n_tokens: int, where: str) -> None:
    """Debug check before a kernel follows the table: every logical block below ``n_tokens``
    of (slot, layer) must name a physical block in [0, NUM_BLOCKS).  ``table`` is a host copy
    (numpy or a CPU tensor) of the block table, ``cache`` the ``PagedKVCache`` it belongs to.
    A wild entry would make the kernel read or write memory outside the cache; this raises a
    ValueError that names it instead."""
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
