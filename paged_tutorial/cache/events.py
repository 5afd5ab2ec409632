"""Block events: every change of a physical block's owners, delivered to listeners after the
operation that caused it has completed (``PagedKVCache.add_listener``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


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


class BlockListeners:
    """The listeners of one cache.  An operation collects its events as tuples
    ``(kind, block, slot, layer, logical_block, ref_count, key)`` and calls ``emit`` once it
    has completed, so a listener always sees a consistent cache."""

    def __init__(self):
        self._listeners: list[Callable[[BlockEvent], None]] = []

    def add(self, listener: Callable[[BlockEvent], None]) -> None:
        if not callable(listener):
            raise TypeError(f"a listener must be callable, got {type(listener).__name__}")
        self._listeners.append(listener)

    def remove(self, listener) -> None:
        self._listeners.remove(listener)

    @property
    def active(self) -> bool:
        """Whether anyone listens: an operation that edits many entries at once builds its
        event tuples only then (one per entry, as the listeners expect)."""
        return bool(self._listeners)

    def emit(self, events: list[tuple]) -> None:
        """Deliver the events of one completed operation to every listener, in order."""
        if self._listeners and events:
            for kind, block, slot, layer, logical, ref_count, key in events:
                event = BlockEvent(kind, int(block), int(slot), int(layer), int(logical),
                                   int(ref_count), key)
                for listener in list(self._listeners):
                    listener(event)
