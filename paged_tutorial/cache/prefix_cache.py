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
- **One record per cached logical block, one physical block per layer.**  Each layer keeps its
  own blocks, as in the article; a ``CachedBlock`` holds everything about one cached block of a
  prompt: its key, tokens and parent, its physical block in every layer, how many slots use it
  (``ref_count``) and whether the step computing it is still running (``pending``).  Indexes
  find records and hold no state of their own: ``by_key`` (the hash index), ``by_block``
  (physical block -> record), ``lru`` (the idle records, least recently used first: the
  eviction queue) and ``pending`` (the records the running step registered);
  ``check_invariants`` checks each against the records.
- **Kept after use.**  When the last slot using a committed record lets go, its blocks are not
  pushed to ``free_blocks``: they stay *cached*, findable by their key, so a later request with
  the same prefix reuses them (as vLLM does; the article's engine would have freed them).
- **Eviction, least recently used first.**  ``free_blocks`` keeps the article's meaning: blocks
  that hold nothing.  Only when an allocation finds it empty is a cached block evicted: the
  record that has been idle longest, and among records freed together the end of the chain
  first, so a prefix's head stays findable longest.  (A child always becomes idle before its
  parent, so eviction never strands a child behind a missing parent.)
- **Registered when computed, committed when the step succeeds.**  A request's full prompt
  blocks that are not found are popped, computed in its prefill, and registered at admission
  as *pending*; ``commit_step`` (the step ran) makes them ordinary cached blocks,
  ``discard_uncommitted`` (the step failed) forgets them.  A request whose prefix is pending
  waits one step (``prefix_in_flight``) and then finds it, instead of computing it twice.
- **A request's keys are computed once.**  The first admission check hashes the prompt's full
  blocks and keeps the keys on the request (``Request.block_hashes``); every later check, the
  allocation and the registration read them from there.
- **At least one prompt token is computed**, because the last one's logits give the first
  generated token: a prompt of exactly k full blocks shares at most k-1 of them.

``free + cached + owned = NUM_BLOCKS`` at all times (``check_invariants``).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
import torch

from paged_tutorial.cache.block_allocator import CacheFullError, FreeListAllocator
from paged_tutorial.cache.block_table import BlockTable
from paged_tutorial.cache.events import BlockListeners
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig

ROOT_KEY = b"paged-tutorial prefix root"


def chain_hash(parent_key: int | None, tokens: tuple[int, ...]) -> int:
    """The key of a block of ``tokens`` that follows the block keyed ``parent_key`` (None for
    the first block of a prompt): 64 bits of BLAKE2b over the parent key and the token ids."""
    h = hashlib.blake2b(digest_size=8)
    h.update(ROOT_KEY if parent_key is None else parent_key.to_bytes(8, "little"))
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))      # little-endian int64 ids
    return int.from_bytes(h.digest(), "little")


@dataclass(eq=False)
class CachedBlock:
    """Everything about one cached logical block of a prompt prefix."""
    key: int
    tokens: tuple[int, ...]
    parent: "CachedBlock | None"
    logical_block: int                   # its position in the prompt (the chain's depth)
    blocks: tuple[int, ...]              # physical block of each layer
    ref_count: int = 1                   # slots whose table row points at it
    pending: bool = True                 # registered by the step still running

    @property
    def idle(self) -> bool:
        return self.ref_count == 0


def may_share(found: CachedBlock, tokens: tuple[int, ...], previous: CachedBlock | None,
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


class PrefixCache(FreeListAllocator):
    """The article's allocator, with full prompt blocks shared between requests and kept
    after use (see the module docstring).  ``hash_fn(parent_key, tokens) -> int`` names a
    block; replace it only for experiments (a constant one makes every block collide).
    ``share_rule`` has ``may_share``'s signature and decides each hit (chapter 09's puzzle
    puts the reader's rule there)."""

    def __init__(self, config: CacheConfig, table: BlockTable, events: BlockListeners,
                 hash_fn: Callable[[int | None, tuple[int, ...]], int] = chain_hash,
                 share_rule: Callable[..., bool] = may_share):
        super().__init__(config, table, events)
        self.hash_fn = hash_fn
        self.share_rule = share_rule
        self.by_key: dict[int, CachedBlock] = {}
        self.by_block: dict[int, CachedBlock] = {}
        #: key -> record of the records nobody uses, in the order they became idle
        self.lru: dict[int, CachedBlock] = {}
        #: records registered by the step still running (``commit_step`` commits them)
        self.pending: list[CachedBlock] = []
        self.evictions = 0                # records evicted over the cache's life
        # Admission asks three questions of one request in a row (prefix in flight? room?
        # allocate), each a walk of its prompt's blocks; a walk depends only on the index
        # (which records exist, which are pending) and the request's length, so the last
        # one is kept until either changes (``_index_changed``).
        self._index_version = 0
        self._last_walk: tuple | None = None

    # --- what is where ---------------------------------------------------------------------
    def idle_records(self) -> list[CachedBlock]:
        """Records nobody uses, least recently used first (the eviction order)."""
        return list(self.lru.values())

    def evictable_blocks(self) -> list[int]:
        return [b for r in self.lru.values() for b in r.blocks]

    @property
    def num_evictable_blocks(self) -> int:
        return len(self.lru) * self.config.num_layers

    def blocks_available(self) -> int:
        return len(self.free_blocks) + self.num_evictable_blocks

    def block_keys(self, token_ids, n_blocks: int | None = None) -> list[int]:
        """The chain keys of the first ``n_blocks`` full blocks of ``token_ids`` (default:
        all of them)."""
        bs, keys, parent = self.config.BLOCK_SIZE, [], None
        n_blocks = len(token_ids) // bs if n_blocks is None else n_blocks
        for j in range(n_blocks):
            parent = self.hash_fn(parent, tuple(token_ids[j * bs:(j + 1) * bs]))
            keys.append(parent)
        return keys

    def prompt_keys(self, request) -> list[int]:
        """The keys of the request's full prompt blocks, hashed at its first check and kept
        on the request (``request.block_hashes``)."""
        if request.block_hashes is None:
            request.block_hashes = self.block_keys(request.prompt_ids)
        return request.block_hashes

    def _block_tokens(self, request, j: int) -> tuple[int, ...]:
        """The ids of logical block j of the request's prompt (the engine's prompts hold
        Python ints already: a slice, no conversion)."""
        bs = self.config.BLOCK_SIZE
        return tuple(request.prompt_ids[j * bs:(j + 1) * bs])

    def _index_changed(self) -> None:
        self._index_version += 1

    def _walk(self, request):
        """Follow the prompt's full blocks through the index while ``share_rule`` accepts what
        each key finds: (records matched from the start, whether the walk stopped at an
        accepted record that is still pending).  The same request at the same length and
        index gets the previous walk back."""
        state = (self._index_version, request.total_len)
        last = self._last_walk
        if last is not None and last[0] is request and last[1] == state:
            return last[2]
        result = self._walk_index(request)
        self._last_walk = (request, state, result)
        return result

    def _walk_index(self, request):
        matched, previous = [], None
        for j, key in enumerate(self.prompt_keys(request)):
            found = self.by_key.get(key)
            if found is None or not self.share_rule(found, self._block_tokens(request, j),
                                                    previous, j, request.total_len,
                                                    self.config.BLOCK_SIZE):
                break
            if found.pending:
                return matched, True
            matched.append(found)
            previous = found
        return matched, False

    def match(self, request) -> list[CachedBlock]:
        """The cached records the request would share now, from its first block on
        (read-only)."""
        return list(self._walk(request)[0])

    def prefix_in_flight(self, request) -> bool:
        return self._walk(request)[1]

    # --- allocation ------------------------------------------------------------------------
    def _shortfall(self, matched: list[CachedBlock], new_len: int) -> tuple[int, int]:
        """(blocks a new request sharing ``matched`` must take, blocks it can take): the
        idle records it revives are no longer evictable room."""
        n_layers = self.config.num_layers
        need = (self.config.blocks_for_tokens(new_len) - len(matched)) * n_layers
        revived = sum(1 for r in matched if r.idle) * n_layers
        return need, self.blocks_available() - revived

    def can_allocate_prompt(self, slot: int, request) -> bool:
        need, available = self._shortfall(self.match(request), request.total_len)
        return need <= available

    def allocate_prompt(self, slot: int, request) -> int:
        """Point ``slot``'s first table entries at the cached blocks of its prompt's prefix,
        pop blocks for the rest (evicting idle cached blocks if ``free_blocks`` runs out),
        and register its other full prompt blocks as pending.  Returns the number of prompt
        tokens found in the cache.  Raises CacheFullError, changing nothing, if too few blocks
        are available."""
        new_len = request.total_len
        if self.blocks_owned(slot):
            raise ValueError(f"slot {slot} already owns blocks: allocate_prompt admits a slot")
        self.check_length(slot, new_len)
        matched = self.match(request)
        if len(matched) * self.config.BLOCK_SIZE >= new_len:
            raise ValueError(f"the share rule found all {new_len} tokens of slot {slot} in the "
                             "cache: at least the last one must be computed (its logits give "
                             "the first generated token)")
        need, available = self._shortfall(matched, new_len)
        if need > available:
            raise CacheFullError(f"slot {slot} needs {need} blocks, {available} available")
        events = []
        self._attach(slot, matched, events)
        self._grow(slot, self.config.blocks_for_tokens(new_len), events)
        self._register_prompt_blocks(slot, request, len(matched),
                                     matched[-1] if matched else None, events)
        self.events.emit(events)
        return len(matched) * self.config.BLOCK_SIZE

    def _attach(self, slot: int, matched: list[CachedBlock], events: list) -> None:
        """Point (slot, every layer, logical blocks 0 .. len(matched)-1) at the matched
        records' blocks (one table edit for them all: the walk matches from block 0 on, so
        record i is logical block i) and count the slot as a user of each."""
        if not matched:
            return
        self.table.assign_columns(slot, 0, np.array([r.blocks for r in matched]).T)
        listening = self.events.active
        for record in matched:
            kind = "reuse" if record.idle else "share"
            record.ref_count += 1
            self.lru.pop(record.key, None)
            if listening:
                events.extend((kind, block, slot, layer, record.logical_block, record.ref_count,
                               record.key) for layer, block in enumerate(record.blocks))

    def _register_prompt_blocks(self, slot: int, request, first: int,
                                parent: CachedBlock | None, events: list) -> None:
        """Make the slot's full prompt blocks from ``first`` on findable (pending until the
        step commits).  Stops at a key the index already holds: that block stays private (a
        prompt of whole blocks recomputing its last one, or a hash collision)."""
        keys = self.prompt_keys(request)
        for j in range(first, len(keys)):
            if keys[j] in self.by_key:
                return
            blocks = tuple(self.table.entries[slot, :, j].tolist())
            tokens = tuple(int(t) for t in self._block_tokens(request, j))
            record = CachedBlock(keys[j], tokens, parent, j, blocks)
            self.by_key[record.key] = record
            self._index_changed()
            self.pending.append(record)
            self.by_block.update(dict.fromkeys(blocks, record))
            if self.events.active:
                events.extend(("register", block, slot, layer, j, 1, record.key)
                              for layer, block in enumerate(blocks))
            parent = record

    def _take_block(self, events: list) -> int:
        if not self.free_blocks:
            self._evict_one(events)
        return self.free_blocks.pop()

    def _evict_one(self, events: list) -> None:
        """Drop the record idle longest; its blocks (one per layer) go back to
        ``free_blocks``."""
        record = next(iter(self.lru.values()))
        self._forget(record)
        self.evictions += 1
        for layer in reversed(range(len(record.blocks))):
            block = record.blocks[layer]
            self.free_blocks.append(block)
            events.append(("evict", block, -1, layer, record.logical_block, 0, record.key))

    def evict_unused(self) -> int:
        """Evict every cached block nobody uses (oldest first), as if allocations had needed
        them all (vLLM's ``reset_prefix_cache``); returns how many blocks went back to
        ``free_blocks``.  Blocks in use keep their prefix."""
        n, events = 0, []
        while self.lru:
            n += self.config.num_layers
            self._evict_one(events)
        self.events.emit(events)
        return n

    def _forget(self, record: CachedBlock) -> None:
        del self.by_key[record.key]
        self._index_changed()
        for block in record.blocks:
            del self.by_block[block]
        self.lru.pop(record.key, None)
        if record.pending:
            self.pending.remove(record)

    # --- release ---------------------------------------------------------------------------
    def release(self, slot: int) -> list[int]:
        """Reset every entry of the slot and drop its use of each record.  A block nobody uses
        any more stays cached if it holds a committed prefix, else goes back to
        ``free_blocks``.  Logical blocks are walked from the last to the first, so that the
        end of a prefix is evicted before its beginning.  Returns the blocks pushed to
        ``free_blocks``."""
        freed, events = [], []
        rows = self.table.entries[slot]
        owned = np.flatnonzero((rows >= 0).any(axis=0))
        listening = self.events.active
        for logical in owned[::-1].tolist():
            record = self.by_block.get(int(rows[0, logical]))
            if record is not None:
                record.ref_count -= 1
                if record.idle and record.pending:
                    self._release_pending(slot, logical, record, freed, events)
                    continue
            layers = np.flatnonzero(rows[:, logical] >= 0)
            blocks = self.table.unassign_column(slot, logical)[layers].tolist()
            if record is None:
                kind, count, key = "push", 0, None
                self.free_blocks.extend(blocks)
                freed.extend(blocks)
            elif not record.idle:
                kind, count, key = "unshare", record.ref_count, record.key
            else:
                kind, count, key = "cache", 0, record.key
                self.lru[record.key] = record        # the newest idle record: evicted last
            if listening:
                events.extend((kind, block, slot, layer, logical, count, key)
                              for layer, block in zip(layers.tolist(), blocks))
        self.events.emit(events)
        return freed

    def _release_pending(self, slot: int, logical: int, record: CachedBlock, freed: list,
                         events: list) -> None:
        """``release`` of a column whose record nobody else uses and whose step has not
        committed (its K/V may be incomplete): the record is forgotten as its first layer's
        entry is reset, and every block goes back to ``free_blocks``."""
        rows = self.table.entries[slot]
        for layer in np.flatnonzero(rows[:, logical] >= 0).tolist():
            block = self.table.unassign(slot, layer, logical)
            if layer == 0:
                self._drop_pending(record, events)
            self.free_blocks.append(block)
            freed.append(block)
            events.append(("push", block, slot, layer, logical, 0, None))

    # --- step boundaries -------------------------------------------------------------------
    def commit_step(self) -> None:
        if not self.pending:                 # a decode step registers nothing
            return
        for record in self.pending:
            record.pending = False
        self._index_changed()
        self.pending.clear()

    def discard_uncommitted(self) -> None:
        events = []
        for record in list(self.pending):
            self._drop_pending(record, events)
        self.events.emit(events)

    def _drop_pending(self, record: CachedBlock, events: list) -> None:
        self._forget(record)
        for layer, block in enumerate(record.blocks):
            users = int((self.table.entries[:, layer, record.logical_block] == block).sum())
            events.append(("unregister", block, -1, layer, record.logical_block, users,
                           record.key))

    # --- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Block accounting (tests and notebooks call this after every step): every record's
        ``ref_count`` equals the table entries pointing at each of its blocks, and they sit at
        its (layer, logical block); records chain to parents that are still cached; idle
        records are committed and have an LRU place, used ones none; ``by_block`` finds
        exactly the records' blocks; owned, cached and free blocks are disjoint and add up to
        NUM_BLOCKS; a block used twice belongs to a record."""
        n = self.config.NUM_BLOCKS
        table = self.table.entries
        owned_entries = table[table >= 0]
        if owned_entries.size and owned_entries.max() >= n:
            raise AssertionError("block table points past NUM_BLOCKS")
        counts = self.table.reference_counts()
        free = np.asarray(self.free_blocks, dtype=np.int64)
        if len(np.unique(free)) != free.size:
            raise AssertionError("free_blocks holds a block twice")
        if free.size and counts[free].any():
            raise AssertionError(f"block {int(free[counts[free] > 0][0])} is free but referenced")
        recorded = {}
        for key, record in self.by_key.items():
            if record.key != key:
                raise AssertionError(f"record under key {key} says its key is {record.key}")
            parent = record.parent
            if parent is not None and self.by_key.get(parent.key) is not parent:
                raise AssertionError(f"record {key}'s parent is no longer in the cache")
            if record.logical_block != (0 if parent is None else parent.logical_block + 1):
                raise AssertionError(f"record {key} is not one block after its parent")
            if record.idle != (self.lru.get(key) is record) or (record.idle and record.pending):
                raise AssertionError(f"record {key}: ref_count {record.ref_count}, pending "
                                     f"{record.pending}, in the LRU queue {key in self.lru}")
            for layer, block in enumerate(record.blocks):
                if block in recorded:
                    raise AssertionError(f"block {block} is reachable from two keys")
                recorded[block] = record
                if counts[block] != record.ref_count:
                    raise AssertionError(f"block {block}: its record counts {record.ref_count} "
                                         f"users but {int(counts[block])} entries point at it")
                users = np.argwhere(table == block)
                if users.size and ((users[:, 1] != layer).any()
                                   or (users[:, 2] != record.logical_block).any()):
                    raise AssertionError(f"block {block} is used outside (layer {layer}, "
                                         f"logical block {record.logical_block})")
        if not self.lru.keys() <= self.by_key.keys():
            raise AssertionError("the LRU queue holds a record the index does not")
        if {id(r) for r in self.pending} != {id(r) for r in self.by_key.values() if r.pending} \
                or len(self.pending) != len({id(r) for r in self.pending}):
            raise AssertionError("the pending list disagrees with the records")
        if recorded.keys() != self.by_block.keys() or any(
                self.by_block[b] is not r for b, r in recorded.items()):
            raise AssertionError("by_block disagrees with the records")
        if free.size and any(int(b) in recorded for b in free):
            raise AssertionError("a free block still belongs to a record")
        if any(int(b) not in recorded for b in np.flatnonzero(counts > 1)):
            raise AssertionError("a block used by two entries holds no registered prefix")
        n_owned = int((counts > 0).sum())
        n_cached = self.num_evictable_blocks
        if n_owned + n_cached + free.size != n:
            raise AssertionError(f"owned ({n_owned}) + cached ({n_cached}) + free "
                                 f"({free.size}) != NUM_BLOCKS ({n})")


class PrefixCachingKVCache(PagedKVCache):
    """A ``PagedKVCache`` whose allocator is a ``PrefixCache`` (``hash_fn`` and ``share_rule``
    go to it)."""

    def __init__(self, config: CacheConfig, device: str | torch.device = "cpu",
                 hash_fn: Callable[[int | None, tuple[int, ...]], int] = chain_hash,
                 share_rule: Callable[..., bool] = may_share):
        super().__init__(config, device,
                         allocator=partial(PrefixCache, hash_fn=hash_fn, share_rule=share_rule))
