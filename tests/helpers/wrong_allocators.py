"""Classic wrong answers to ``06.allocator``, each a small change of the worked solution."""

from __future__ import annotations

from paged_tutorial.cache import CacheFullError
from paged_tutorial.cache.block_allocator import FreeListAllocator
from paged_tutorial.teaching.chapters.ch06_block_lifetime.allocator import AllocatorBase


class ArticleAllocator(AllocatorBase):
    """The article's block manager as a reader writes it (the worked solution's code, written
    out here: an answer that inherits the worked solution itself is refused)."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        self.check_length(slot, new_len)
        needed = [(layer, logical) for layer in range(c.num_layers)
                  for logical in range(c.blocks_for_tokens(new_len))
                  if self.table.entries[slot, layer, logical] == -1]
        if len(needed) > len(self.free_blocks):
            raise CacheFullError(f"slot {slot} needs {len(needed)} blocks")
        for layer, logical in needed:
            self.table.assign(slot, layer, logical, self.free_blocks.pop())

    def release(self, slot):
        pushed = []
        for layer in range(self.config.num_layers):
            for logical in range(self.config.MAX_BLOCKS_PER_SEQ):
                if self.table.entries[slot, layer, logical] != -1:
                    block = self.table.unassign(slot, layer, logical)
                    self.free_blocks.append(block)
                    pushed.append(block)
        return pushed


class NeverPreempts(ArticleAllocator):
    """Pops without counting first: an empty free list raises IndexError, not CacheFullError."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        for layer in range(c.num_layers):
            for logical in range(c.blocks_for_tokens(new_len)):
                if self.table.entries[slot, layer, logical] == -1:
                    self.table.assign(slot, layer, logical, self.free_blocks.pop())


class ReturnsWhenFull(ArticleAllocator):
    """Returns None, without the blocks, when too few are free."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        needed = [(layer, lb) for layer in range(c.num_layers)
                  for lb in range(c.blocks_for_tokens(new_len))
                  if self.table.entries[slot, layer, lb] == -1]
        if len(needed) > len(self.free_blocks):
            return None
        for layer, lb in needed:
            self.table.assign(slot, layer, lb, self.free_blocks.pop())


class ReverseRelease(ArticleAllocator):
    """Pushes the slot's blocks in the reverse of the article's order."""

    def release(self, slot):
        pushed = super().release(slot)
        del self.free_blocks[-len(pushed):]
        self.free_blocks.extend(pushed[::-1])
        return pushed[::-1]


class LogicalMajorRelease(ArticleAllocator):
    """Walks logical block by logical block, then layer (the loops swapped)."""

    def release(self, slot):
        pushed = []
        for logical in range(self.config.MAX_BLOCKS_PER_SEQ):
            for layer in range(self.config.num_layers):
                if self.table.entries[slot, layer, logical] != -1:
                    block = self.table.unassign(slot, layer, logical)
                    self.free_blocks.append(block)
                    pushed.append(block)
        return pushed


class DoubleFree(ArticleAllocator):
    """Pushes one block twice."""

    def release(self, slot):
        pushed = super().release(slot)
        self.free_blocks.append(pushed[0])
        return pushed


class LeaksLayers(ArticleAllocator):
    """Gives back layer 0 only and clears the rest of the slot: the other layers' blocks leak."""

    def release(self, slot):
        pushed = []
        for logical in range(self.config.MAX_BLOCKS_PER_SEQ):
            if self.table.entries[slot, 0, logical] != -1:
                block = self.table.unassign(slot, 0, logical)
                self.free_blocks.append(block)
                pushed.append(block)
        for layer in range(1, self.config.num_layers):
            for logical in range(self.config.MAX_BLOCKS_PER_SEQ):
                if self.table.entries[slot, layer, logical] != -1:
                    self.table.unassign(slot, layer, logical)
        return pushed


class DecodeNeverPops(ArticleAllocator):
    """Ignores rule 2: only a prefill (a slot that owns nothing) gets blocks."""

    def ensure_capacity(self, slot, new_len):
        if self.blocks_owned(slot) == 0:
            super().ensure_capacity(slot, new_len)


class PopsEveryDecode(ArticleAllocator):
    """Ignores rule 2 the other way: every decode step pops a block per layer."""

    def ensure_capacity(self, slot, new_len):
        if self.blocks_owned(slot) == 0:
            return super().ensure_capacity(slot, new_len)
        c = self.config
        if len(self.free_blocks) < c.num_layers:
            raise CacheFullError("full")
        logical = (new_len - 1) // c.BLOCK_SIZE
        for layer in range(c.num_layers):
            self.table.assign(slot, layer, logical, self.free_blocks.pop())


class PopsThenFails(ArticleAllocator):
    """Pops block by block and raises CacheFullError when the free list runs dry: the blocks
    popped before it stay taken (a refused call must change nothing)."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        for layer in range(c.num_layers):
            for logical in range(c.blocks_for_tokens(new_len)):
                if self.table.entries[slot, layer, logical] == -1:
                    if not self.free_blocks:
                        raise CacheFullError("full")
                    self.table.assign(slot, layer, logical, self.free_blocks.pop())


class DelegatesToThePackage(AllocatorBase):
    """Hands both methods to the package's own allocator."""

    def ensure_capacity(self, slot, new_len):
        return FreeListAllocator.ensure_capacity(self, slot, new_len)

    def release(self, slot):
        return FreeListAllocator.release(self, slot)


class CountsForTwoLayers(ArticleAllocator):
    """Counts the blocks a growth needs as if every model had two layers."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        n_logical = c.blocks_for_tokens(new_len)
        missing = int((self.table.entries[slot, 0, :n_logical] == -1).sum())
        if missing * 2 > len(self.free_blocks):
            raise CacheFullError("full")
        for layer in range(c.num_layers):
            for logical in range(n_logical):
                if self.table.entries[slot, layer, logical] == -1:
                    if not self.free_blocks:
                        raise CacheFullError("full")
                    self.table.assign(slot, layer, logical, self.free_blocks.pop())


class InheritsTheWorkedSolution(AllocatorBase):
    """Hands both methods to the worked solution's class."""

    def ensure_capacity(self, slot, new_len):
        from paged_tutorial.teaching.exercises.solutions import ArticleAllocator as Worked

        return Worked.ensure_capacity(self, slot, new_len)

    def release(self, slot):
        from paged_tutorial.teaching.exercises import solutions

        return solutions.ArticleAllocator.release(self, slot)


class HardCodedBlockSize(ArticleAllocator):
    """Counts logical blocks with BLOCK_SIZE taken as 16, the size of every cache the grader
    used to run: right there, wrong at any other BLOCK_SIZE."""

    def ensure_capacity(self, slot, new_len):
        c = self.config
        needed = [(layer, logical) for layer in range(c.num_layers)
                  for logical in range(-(-new_len // 16))
                  if self.table.entries[slot, layer, logical] == -1]
        if len(needed) > len(self.free_blocks):
            raise CacheFullError(f"slot {slot} needs {len(needed)} blocks")
        for layer, logical in needed:
            self.table.assign(slot, layer, logical, self.free_blocks.pop())


WRONG = {
    "hard-coded BLOCK_SIZE 16": HardCodedBlockSize,
    "delegates to the worked solution": InheritsTheWorkedSolution,
    "pops some blocks, then raises CacheFullError (0 < free < needed)": PopsThenFails,
    "delegates to the package's allocator": DelegatesToThePackage,
    "counts the need for two layers only": CountsForTwoLayers,
    "never preempts (pops from an empty free list)": NeverPreempts,
    "never preempts (returns without blocks when full)": ReturnsWhenFull,
    "release in reverse order": ReverseRelease,
    "release loops swapped (logical block, then layer)": LogicalMajorRelease,
    "double free": DoubleFree,
    "leaks on release (layer 0 only)": LeaksLayers,
    "ignores rule 2 (decode never pops)": DecodeNeverPops,
    "ignores rule 2 (pops every decode step)": PopsEveryDecode,
}
