"""The block table: int32 [max_slots, n_layers, MAX_BLOCKS_PER_SEQ], -1 = unassigned.

Its flat index is the article's ``slot*N_LAYERS*MAX_BLOCKS_PER_SEQ + layer*MAX_BLOCKS_PER_SEQ
+ logical_block`` (numpy's C order gives exactly that).  Each layer of a sequence owns its own
blocks; a slot is one row of the table (one running sequence).

The host copy is the truth.  The kernels read a device copy; instead of copying all entries
after every change (the article copies the whole table each decode layer, TODO at
``src/main.cpp:551``), the table records which entries changed and ``device_table()`` sends
only those, once per engine step.
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
        self._changed: set[int] = set()
        # Entries changed since the previous sync, summed over syncs: what a separate device
        # copy receives (on a GPU, what is sent; on the CPU the device table shares memory).
        self.entries_synced = 0

    def flat_index(self, slot: int, layer: int, logical_block: int) -> int:
        """The article's three-term index into the flat block table."""
        m = self.config.MAX_BLOCKS_PER_SEQ
        return slot * self.config.num_layers * m + layer * m + logical_block

    # --- edits (each records the entry it changed) ----------------------------------------
    def assign(self, slot: int, layer: int, logical_block: int, block: int) -> None:
        self.entries[slot, layer, logical_block] = block
        self._changed.add(self.flat_index(slot, layer, logical_block))

    def unassign(self, slot: int, layer: int, logical_block: int) -> int:
        """Reset the entry to -1; returns the block it held."""
        block = int(self.entries[slot, layer, logical_block])
        self.entries[slot, layer, logical_block] = -1
        self._changed.add(self.flat_index(slot, layer, logical_block))
        return block

    def mark_changed(self, slot: int | None = None, layer: int | None = None,
                     logical_block: int | None = None) -> None:
        """Record an entry edited through ``entries`` directly (every entry with no
        argument), so the next ``device_table()`` sends it."""
        if slot is None:
            self._changed.update(range(self.entries.size))
        else:
            self._changed.add(self.flat_index(slot, layer, logical_block))

    # --- the device copy ----------------------------------------------------------------
    def device_table(self) -> torch.Tensor:
        """The device block table, brought up to date by sending only changed entries."""
        self.entries_synced += len(self._changed)
        if self.device.type == "cpu":
            self._changed.clear()            # shares memory with the host table
            return self._device_entries
        if self._changed:
            idx = np.fromiter(sorted(self._changed), dtype=np.int64)
            vals = self.entries.reshape(-1)[idx]
            flat = self._device_entries.view(-1)
            flat[torch.from_numpy(idx).to(self.device)] = torch.from_numpy(vals).to(self.device)
            self._changed.clear()
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
