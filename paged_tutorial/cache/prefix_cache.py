"""Prefix caching: one copy of the K/V of a prompt prefix, shared by every request that has it.

Beyond the article.  Its block table already allows this: two table entries may name the same
physical block, and a kernel that follows either reads the same K/V.  K/V of a token depend on
the token, its position and every token before it (the model is causal), so two prompts that
agree up to the end of a block have equal K/V in that block, in every layer.  vLLM (automatic
prefix caching) and nano-vllm (``BlockManager``) use this; this module does it the same way,
with the article's cache underneath.

- **Only full blocks of prompt are shared.**  A full block is never written again: its owner
  writes its next tokens into later blocks.  So nothing is ever written into a shared block.
- **A hash chain names a block's contents.**  The key of logical block j is
  ``hash_fn(key of block j-1, tokens of block j)``, so it stands for *all* the tokens from the
  start of the prompt to the end of block j (``chain_hash``: 64-bit BLAKE2b).  A key is only a
  name: on a hit the stored tokens are compared with the request's and the stored parent must
  be the block matched just before, so a hash collision is a miss, never wrong K/V.
- **One entry per logical block, one physical block per layer.**  Each layer keeps its own
  blocks, as in the article; a ``CachedPrefix`` entry holds the prefix's block for every layer.
- **Reference counts.**  ``ref_counts[b]`` is the number of block-table entries that point at
  physical block b.  When the last one goes, a block that holds a registered prefix is not
  pushed to ``free_blocks``: it stays *cached*, findable by its key, so a later request with the
  same prefix reuses it (as vLLM does; the article's engine would have freed it).
- **Eviction, least recently used first.**  ``free_blocks`` keeps the article's meaning: blocks
  that hold nothing.  Only when an allocation finds it empty is a cached block evicted: the
  entry that has been unused longest, and among entries freed together the end of the chain
  first, so a prefix's head stays findable longest.  (A child entry always leaves the LRU order
  before its parent, so eviction never strands a child behind a missing parent.)
- **Registered when computed, committed when the step succeeds.**  A request's full prompt
  blocks that are not found are popped, computed in its prefill, and registered at admission
  as *pending*; ``commit_step`` (the step ran) makes them ordinary cached blocks,
  ``discard_uncommitted`` (the step failed) forgets them.  A request whose prefix is pending
  waits one step (``prefix_in_flight``) and then finds it, instead of computing it twice.
- **At least one prompt token is computed**, because the last one's logits give the first
  generated token: a prompt of exactly k full blocks shares at most k-1 of them.

``free + cached + owned = NUM_BLOCKS`` at all times (``check_invariants``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from paged_tutorial.config import CacheConfig
from paged_tutorial.cache.paged_cache import CacheFullError, PagedKVCache

ROOT_KEY = b"paged-tutorial prefix root"


def chain_hash(parent_key: int | None, tokens: tuple[int, ...]) -> int:
    """The key of a block of ``tokens`` that follows the block keyed ``parent_key`` (None for
    the first block of a prompt): 64 bits of BLAKE2b over the parent key and the token ids."""
    h = hashlib.blake2b(digest_size=8)
    h.update(ROOT_KEY if parent_key is None else parent_key.to_bytes(8, "little"))
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


@dataclass(eq=False)
class CachedPrefix:
    """One cached logical block of a prompt prefix: the tokens it holds, the entry of the
    block before it, and its physical block in every layer."""
    key: int
    tokens: tuple[int, ...]
    parent: "CachedPrefix | None"
    logical_block: int                   # its position in the prompt (the chain's depth)
    blocks: tuple[int, ...]              # physical block of each layer
    committed: bool = False              # False while the step computing it has not finished


def may_share(found: CachedPrefix, tokens: tuple[int, ...], previous: CachedPrefix | None,
              logical_block: int, n_tokens: int, BLOCK_SIZE: int) -> bool:
    """The sharing rule.  The index returned ``found`` for the key of logical block
    ``logical_block`` of a request's prompt; ``tokens`` are the request's own ids in that block,
    ``previous`` the cached block it already shares for the block before (None for block 0),
    ``n_tokens`` the tokens it has (its prompt, plus what it had generated if it is being
    recomputed after a preemption).  It may use ``found``'s blocks if

    - the block is not its last token's: at least one token is left to compute, because the
      first generated token comes from the last token's logits;
    - ``found`` holds exactly these tokens (a key is a hash: two contents can share one), and
    - ``found`` was computed after exactly the block this request shares before it (so after
      the same tokens all the way from the start: K/V depend on every earlier token)."""
    return ((logical_block + 1) * BLOCK_SIZE < n_tokens
            and found.tokens == tokens and found.parent is previous)


class PrefixCachingKVCache(PagedKVCache):
    """The article's paged cache, with full prompt blocks shared between requests and kept
    after use (see the module docstring).  ``hash_fn(parent_key, tokens) -> int`` names a
    block; replace it only for experiments (a constant one makes every block collide).
    ``share_rule`` has ``may_share``'s signature and decides each hit (chapter 09's puzzle
    puts the reader's rule there)."""

    def __init__(self, config: CacheConfig, device: str | torch.device = "cpu",
                 hash_fn: Callable[[int | None, tuple[int, ...]], int] = chain_hash,
                 share_rule: Callable[..., bool] = may_share):
        super().__init__(config, device)
        self.hash_fn = hash_fn
        self.share_rule = share_rule
        self.ref_counts = np.zeros(self.NUM_BLOCKS, dtype=np.int32)
        self.index: dict[int, CachedPrefix] = {}          # key -> entry
        self.entry_of_block: dict[int, CachedPrefix] = {}  # physical block -> its entry
        self.lru: OrderedDict[int, CachedPrefix] = OrderedDict()   # unused entries, oldest first
        self._pending: list[CachedPrefix] = []
        self.evictions = 0                # entries evicted over the cache's life

    # --- what is where ---------------------------------------------------------------------
    @property
    def num_evictable_blocks(self) -> int:
        """Blocks nobody uses that are kept for their prefix (evictable)."""
        return len(self.lru) * self.config.num_layers

    def blocks_available(self) -> int:
        return len(self.free_blocks) + self.num_evictable_blocks

    def block_keys(self, token_ids, n_blocks: int) -> list[int]:
        """The chain keys of the first ``n_blocks`` full blocks of ``token_ids``."""
        bs, keys, parent = self.BLOCK_SIZE, [], None
        for j in range(n_blocks):
            parent = self.hash_fn(parent, tuple(int(t) for t in token_ids[j * bs:(j + 1) * bs]))
            keys.append(parent)
        return keys

    def _walk(self, prompt_ids, new_len: int):
        """Follow the prompt's full blocks through the index while ``share_rule`` accepts what
        each key finds: (entries matched from the start, whether the walk stopped at an
        accepted entry that is still pending)."""
        bs, matched, previous, key = self.BLOCK_SIZE, [], None, None
        for j in range(len(prompt_ids) // bs):
            tokens = tuple(int(t) for t in prompt_ids[j * bs:(j + 1) * bs])
            key = self.hash_fn(key, tokens)
            found = self.index.get(key)
            if found is None or not self.share_rule(found, tokens, previous, j, new_len, bs):
                break
            if not found.committed:
                return matched, True
            matched.append(found)
            previous = found
        return matched, False

    def match(self, prompt_ids, new_len: int | None = None) -> list[CachedPrefix]:
        """The cached entries a request with this prompt would share now, from its first
        block on (read-only).  ``new_len`` is the request's length (default: the prompt's)."""
        return self._walk(prompt_ids, len(prompt_ids) if new_len is None else new_len)[0]

    def prefix_in_flight(self, prompt_ids, new_len: int) -> bool:
        return self._walk(prompt_ids, new_len)[1]

    # --- allocation ------------------------------------------------------------------------
    def _shortfall(self, matched: list[CachedPrefix], new_len: int) -> tuple[int, int]:
        """(blocks a new request sharing ``matched`` must take, blocks it can take): the
        cached entries it revives are no longer evictable room."""
        n_layers = self.config.num_layers
        need = (self.config.blocks_for_tokens(new_len) - len(matched)) * n_layers
        revived = sum(1 for e in matched if e.key in self.lru) * n_layers
        return need, self.blocks_available() - revived

    def can_allocate_prompt(self, slot: int, prompt_ids, new_len: int) -> bool:
        need, available = self._shortfall(self.match(prompt_ids, new_len), new_len)
        return need <= available

    def allocate_prompt(self, slot: int, prompt_ids, new_len: int) -> int:
        """Point ``slot``'s first table entries at the cached blocks of its prompt's prefix,
        pop blocks for the rest (evicting unused cached blocks if ``free_blocks`` runs out),
        and register its other full prompt blocks as pending.  Returns the number of prompt
        tokens found in the cache.  Raises CacheFullError, changing nothing, if too few blocks
        are available."""
        if self.blocks_owned(slot):
            raise ValueError(f"slot {slot} already owns blocks: allocate_prompt admits a slot")
        if new_len > self.config.max_seq_len:
            raise ValueError(f"slot {slot}: {new_len} tokens exceed max_seq_len "
                             f"{self.config.max_seq_len}")
        matched = self.match(prompt_ids, new_len)
        if len(matched) * self.BLOCK_SIZE >= new_len:
            raise ValueError(f"the share rule found all {new_len} tokens of slot {slot} in the "
                             "cache: at least the last one must be computed (its logits give "
                             "the first generated token)")
        need, available = self._shortfall(matched, new_len)
        if need > available:
            raise CacheFullError(f"slot {slot} needs {need} blocks, {available} available")
        events = []
        for entry in matched:
            self._attach(slot, entry, events)
        self._grow(slot, self.config.blocks_for_tokens(new_len), events)
        self._register_prompt_blocks(slot, prompt_ids, len(matched),
                                     matched[-1] if matched else None, events)
        self._notify(events)
        return len(matched) * self.BLOCK_SIZE

    def _attach(self, slot: int, entry: CachedPrefix, events: list) -> None:
        """Point (slot, every layer, entry.logical_block) at the entry's blocks."""
        kind = "reuse" if self.lru.pop(entry.key, None) is not None else "share"
        logical = entry.logical_block
        for layer, block in enumerate(entry.blocks):
            self.block_table[slot, layer, logical] = block
            self.ref_counts[block] += 1
            self._dirty.add(self.flat_index(slot, layer, logical))
            events.append((kind, block, slot, layer, logical, self.ref_counts[block], entry.key))

    def _register_prompt_blocks(self, slot: int, prompt_ids, first: int,
                                parent: CachedPrefix | None, events: list) -> None:
        """Make the slot's full prompt blocks from ``first`` on findable (pending until the
        step commits).  Stops at a key the index already holds: that block stays private (a
        prompt of whole blocks recomputing its last one, or a hash collision)."""
        n_full = len(prompt_ids) // self.BLOCK_SIZE
        keys = self.block_keys(prompt_ids, n_full)
        bs = self.BLOCK_SIZE
        for j in range(first, n_full):
            if keys[j] in self.index:
                return
            blocks = tuple(int(b) for b in self.block_table[slot, :, j])
            entry = CachedPrefix(keys[j], tuple(int(t) for t in prompt_ids[j * bs:(j + 1) * bs]),
                                 parent, j, blocks)
            self.index[entry.key] = entry
            for layer, block in enumerate(blocks):
                self.entry_of_block[block] = entry
                events.append(("register", block, slot, layer, j, self.ref_counts[block],
                               entry.key))
            self._pending.append(entry)
            parent = entry

    def _take_free_block(self, slot: int, layer: int, logical: int, events: list) -> int:
        if not self.free_blocks:
            self._evict_one(events)
        block = self.free_blocks.pop()
        self.ref_counts[block] = 1
        events.append(("pop", block, slot, layer, logical, 1, None))
        return block

    def _evict_one(self, events: list) -> None:
        """Drop the least recently used unused entry; its blocks (one per layer) go back to
        ``free_blocks``."""
        _, entry = self.lru.popitem(last=False)
        self._forget(entry)
        self.evictions += 1
        for layer in reversed(range(len(entry.blocks))):
            block = entry.blocks[layer]
            self.free_blocks.append(block)
            events.append(("evict", block, -1, layer, entry.logical_block, 0, entry.key))

    def evict_unused(self) -> int:
        """Evict every cached block nobody uses (oldest first), as if allocations had needed
        them all (vLLM's ``reset_prefix_cache``); returns how many blocks went back to
        ``free_blocks``.  Blocks in use keep their prefix."""
        n, events = 0, []
        while self.lru:
            n += len(self.lru[next(iter(self.lru))].blocks)
            self._evict_one(events)
        self._notify(events)
        return n

    def _forget(self, entry: CachedPrefix) -> None:
        del self.index[entry.key]
        for block in entry.blocks:
            del self.entry_of_block[block]

    # --- release ---------------------------------------------------------------------------
    def release(self, slot: int) -> list[int]:
        """Reset every entry of the slot and drop one reference per entry.  A block nobody uses
        any more stays cached if it holds a committed prefix, else goes back to
        ``free_blocks``.  Logical blocks are walked from the last to the first, so that the
        end of a prefix is evicted before its beginning.  Returns the blocks pushed to
        ``free_blocks``."""
        freed, events = [], []
        rows = self.block_table[slot]
        owned = np.flatnonzero((rows >= 0).any(axis=0))
        for logical in owned[::-1]:
            logical = int(logical)
            for layer in range(self.config.num_layers):
                block = int(rows[layer, logical])
                if block < 0:
                    continue
                rows[layer, logical] = -1
                self._dirty.add(self.flat_index(slot, layer, logical))
                self.ref_counts[block] -= 1
                count = int(self.ref_counts[block])
                entry = self.entry_of_block.get(block)
                if count > 0:
                    events.append(("unshare", block, slot, layer, logical, count,
                                   entry.key if entry else None))
                elif entry is not None and entry.committed:
                    events.append(("cache", block, slot, layer, logical, 0, entry.key))
                    if layer == len(entry.blocks) - 1:
                        self.lru[entry.key] = entry
                else:
                    if entry is not None:          # pending: its K/V may be incomplete
                        self._drop_pending(entry, events)
                    self.free_blocks.append(block)
                    freed.append(block)
                    events.append(("push", block, slot, layer, logical, 0, None))
        self._notify(events)
        return freed

    # --- step boundaries -------------------------------------------------------------------
    def commit_step(self) -> None:
        for entry in self._pending:
            entry.committed = True
        self._pending.clear()

    def discard_uncommitted(self) -> None:
        events = []
        for entry in list(self._pending):
            self._drop_pending(entry, events)
        self._notify(events)

    def _drop_pending(self, entry: CachedPrefix, events: list) -> None:
        if self.index.get(entry.key) is not entry:
            return
        self._forget(entry)
        self._pending.remove(entry)
        for layer, block in enumerate(entry.blocks):
            events.append(("unregister", block, -1, layer, entry.logical_block,
                           self.ref_counts[block], entry.key))

    # --- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Block accounting (tests and notebooks call this after every step):
        every reference count equals the table entries pointing at the block; owned (count >
        0), cached (count 0, in the index) and free blocks are disjoint and add up to
        NUM_BLOCKS; a free block is referenced by nothing and indexed by nothing; a block is
        reachable from at most one key, and a block used twice is an indexed prefix block."""
        table = self.block_table
        owned_entries = table[table >= 0]
        if owned_entries.size and owned_entries.max() >= self.NUM_BLOCKS:
            raise AssertionError("block table points past NUM_BLOCKS")
        counts = self.reference_counts()
        if not np.array_equal(counts, self.ref_counts):
            bad = int(np.flatnonzero(counts != self.ref_counts)[0])
            raise AssertionError(f"block {bad}: ref_count {int(self.ref_counts[bad])} but "
                                 f"{int(counts[bad])} table entries point at it")
        free = np.asarray(self.free_blocks, dtype=np.int64)
        if len(np.unique(free)) != free.size:
            raise AssertionError("free_blocks holds a block twice")
        if free.size and counts[free].any():
            raise AssertionError(f"block {int(free[counts[free] > 0][0])} is free but referenced")
        indexed = {}
        for key, entry in self.index.items():
            if entry.key != key:
                raise AssertionError(f"entry under key {key} says its key is {entry.key}")
            if entry.parent is not None and self.index.get(entry.parent.key) is not entry.parent:
                raise AssertionError(f"entry {key}'s parent is no longer in the cache")
            if entry.logical_block != (0 if entry.parent is None
                                       else entry.parent.logical_block + 1):
                raise AssertionError(f"entry {key} is not one block after its parent")
            entry_counts = {int(counts[b]) for b in entry.blocks}
            if len(entry_counts) != 1:
                raise AssertionError(f"entry {key}'s layers have different counts {entry_counts}")
            for layer, block in enumerate(entry.blocks):
                if block in indexed:
                    raise AssertionError(f"block {block} is reachable from two keys")
                indexed[block] = entry
                users = np.argwhere(table == block)
                if users.size and ((users[:, 1] != layer).any()
                                   or (users[:, 2] != entry.logical_block).any()):
                    raise AssertionError(f"block {block} is used outside (layer {layer}, "
                                         f"logical block {entry.logical_block})")
        if indexed.keys() != self.entry_of_block.keys() or any(
                self.entry_of_block[b] is not e for b, e in indexed.items()):
            raise AssertionError("entry_of_block disagrees with the index")
        unused = {e.key for e in self.index.values() if counts[e.blocks[0]] == 0}
        if unused != set(self.lru):
            raise AssertionError(f"LRU holds {sorted(self.lru)}, unused entries are "
                                 f"{sorted(unused)}")
        if any(not e.committed for e in self.lru.values()):
            raise AssertionError("an uncommitted entry is cached")
        if free.size and any(int(b) in indexed for b in free):
            raise AssertionError("a free block is still in the index")
        shared = np.flatnonzero(counts > 1)
        if any(int(b) not in indexed for b in shared):
            raise AssertionError("a block used by two entries holds no registered prefix")
        n_owned = int((counts > 0).sum())
        n_cached = self.num_evictable_blocks
        if n_owned + n_cached + free.size != self.NUM_BLOCKS:
            raise AssertionError(f"owned ({n_owned}) + cached ({n_cached}) + free "
                                 f"({free.size}) != NUM_BLOCKS ({self.NUM_BLOCKS})")
