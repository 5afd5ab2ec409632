"""The paged KV cache, one job per module: the flat K|V buffer (``kv_buffer``), the block table
and its device sync (``block_table``), the ``free_blocks`` allocator and the contract a
scheduler calls (``block_allocator``), block events (``events``), the prefix cache that lets
requests share full blocks of equal prompts (``prefix_cache``), and ``PagedKVCache``, which
puts them together (``paged_cache``)."""

from paged_tutorial.cache.block_allocator import BlockAllocator, CacheFullError, FreeListAllocator
from paged_tutorial.cache.events import BlockEvent
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.cache.prefix_cache import PrefixCache, PrefixCachingKVCache

__all__ = ["BlockAllocator", "BlockEvent", "CacheFullError", "FreeListAllocator", "PagedKVCache",
           "PrefixCache", "PrefixCachingKVCache"]
