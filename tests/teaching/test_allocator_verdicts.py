"""Each way an allocator can be wrong has its verdict: one plausible wrong allocator per path of
``06.allocator``'s checks, each a right allocator (the worked solution, run as her cell) with
one thing changed, and each verdict read for its words."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.cache.block_allocator import CacheFullError, FreeListAllocator
from test_verdict_paths import her_allocator

Worked = her_allocator()


class OverwritesAnEntry(Worked):
    """Gives logical block 0 of layer 0 a fresh block on every call, pushing its old one back
    (where only a -1 entry gets a block)."""

    def ensure_capacity(self, slot, new_len):
        super().ensure_capacity(slot, new_len)
        old = int(self.table.entries[slot, 0, 0])
        if old >= 0 and self.free_blocks:
            self.table.assign(slot, 0, 0, self.free_blocks.pop())
            self.free_blocks.append(old)


class OneBlockTooMany(Worked):
    """Rounds the logical blocks up once too often: backs the block after the last position."""

    def ensure_capacity(self, slot, new_len):
        super().ensure_capacity(slot, new_len)
        past = self.config.blocks_for_tokens(new_len)
        if past < self.config.MAX_BLOCKS_PER_SEQ and self.free_blocks and \
                self.table.entries[slot, 0, past] == -1:
            self.table.assign(slot, 0, past, self.free_blocks.pop())


class EnsureNotWritten(Worked):
    def ensure_capacity(self, slot, new_len):
        raise NotImplementedError


class ReleaseNotWritten(Worked):
    def release(self, slot):
        raise NotImplementedError


class ReleaseBehindTheTable(Worked):
    """Frees the slot by writing -1 into the host table's array itself."""

    def release(self, slot):
        pushed = [int(b) for b in self.table.entries[slot].ravel() if b >= 0]
        self.free_blocks.extend(pushed)
        self.table.entries[slot] = -1
        return pushed


class ReleaseLooksUpTheSlot(Worked):
    """Keeps a dict of the slots it gave blocks to and fails on one it never saw."""

    def release(self, slot):
        return {}[slot]


class ReleaseChecksTheSlot(Worked):
    def release(self, slot):
        raise ValueError(f"slot {slot} is not in use")


class PushesTheRowsEnd(Worked):
    """Walks layer 0's row up to and including the -1 that ends it."""

    def release(self, slot):
        c = self.config
        end = int(self.table.entries[slot, 0, 0])
        pushed = super().release(slot)
        if end >= 0 and c.MAX_BLOCKS_PER_SEQ > 1:
            self.free_blocks.append(-1)
            return pushed + [-1]
        return pushed


class ReturnsNothing(Worked):
    def release(self, slot):
        super().release(slot)


class RaisesOneEarly(Worked):
    """Counts the blocks it needs, then refuses when they would empty the free list (>= where
    > belongs)."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        needed = sum(int(self.table.entries[slot, layer, logical] == -1)
                     for layer in range(c.num_layers)
                     for logical in range(c.blocks_for_tokens(new_len)))
        if needed and needed >= len(self.free_blocks):
            raise CacheFullError(f"{needed} needed, {len(self.free_blocks)} free")
        super().ensure_capacity(slot, new_len)


class PopsThenCounts(Worked):
    """Pops a block for every -1 entry in turn and raises when the free list runs dry, leaving
    the blocks it popped so far in the table."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        self.check_length(slot, new_len)
        for layer in range(c.num_layers):
            for logical in range(c.blocks_for_tokens(new_len)):
                if self.table.entries[slot, layer, logical] == -1:
                    if not self.free_blocks:
                        raise CacheFullError("out of blocks")
                    self.table.assign(slot, layer, logical, self.free_blocks.pop())


class InheritsThePackages(Worked, FreeListAllocator):
    """Hands every step it does not write to the package's own allocator."""


@pytest.mark.parametrize("answer, status, words", [
    (OverwritesAnEntry, "wrong", "overwrote block_table["),
    (OneBlockTooMany, "wrong", "a block, but positions <"),
    (EnsureNotWritten, "unsolved", "write ensure_capacity and release"),
    (ReleaseNotWritten, "unsolved", "write ensure_capacity and release"),
    (ReleaseBehindTheTable, "wrong", "self.table.entries"),
    (ReleaseLooksUpTheSlot, "wrong", "raised KeyError"),
    (ReleaseChecksTheSlot, "wrong", "raised ValueError: slot"),
    (PushesTheRowsEnd, "wrong", "pushed -1: that entry is unassigned"),
    (ReturnsNothing, "wrong", "it must return the list of blocks it pushed"),
    (RaisesOneEarly, "wrong", "exactly"),
    (PopsThenCounts, "wrong", "raised CacheFullError after changing the table"),
    (InheritsThePackages, "wrong", "paged_tutorial.cache.block_allocator.FreeListAllocator"),
])
def test_each_wrong_allocator_gets_its_verdict(answer, status, words):
    verdict = ex.grade("06.allocator", answer)
    assert verdict.status == status and words in verdict.message, verdict.message


class TracksOwners(Worked):
    """Keeps, besides the table, who owns each block (an array) and a lock for the pops: its
    state is compared across a refused call like any other."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.owner = np.full(self.config.NUM_BLOCKS, -1)
        self.lock = threading.Lock()

    def ensure_capacity(self, slot, new_len):
        with self.lock:
            before = set(np.flatnonzero(self.table.entries[slot].ravel() >= 0))
            super().ensure_capacity(slot, new_len)
            for block in self.table.entries[slot].ravel():
                if block >= 0 and int(block) not in before:
                    self.owner[int(block)] = slot

    def release(self, slot):
        pushed = super().release(slot)
        self.owner[pushed] = -1
        return pushed


class TracksOwnersBeforeRefusing(TracksOwners):
    """Marks the slot as an owner of the next free block before finding it cannot grow."""

    def ensure_capacity(self, slot, new_len):
        if self.free_blocks:
            self.owner[self.free_blocks[-1]] = slot
        super().ensure_capacity(slot, new_len)


def test_state_kept_beside_the_table_is_compared_across_a_refusal():
    assert ex.grade("06.allocator", TracksOwners).ok
    verdict = ex.grade("06.allocator", TracksOwnersBeforeRefusing)
    assert verdict.status == "wrong"
    assert "raised CacheFullError after changing the table" in verdict.message, verdict.message


class RefusesWhenNothingIsFree(Worked):
    """Raises CacheFullError whenever the free list is empty, even for a call that needs no
    block (a decode step inside the slot's last block, with the cache exactly full)."""

    def ensure_capacity(self, slot, new_len):
        if not self.free_blocks:
            raise CacheFullError("no block free")
        super().ensure_capacity(slot, new_len)


def test_a_call_that_needs_no_block_succeeds_with_none_free():
    verdict = ex.grade("06.allocator", RefusesWhenNothingIsFree)
    assert verdict.status == "wrong", verdict.message
    assert "no block free" in verdict.message and "within the blocks it owns" in \
        verdict.message, verdict.message
