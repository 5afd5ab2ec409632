"""The paged KV cache: one flat K|V buffer in ``BLOCK_SIZE``-token blocks, the ``free_blocks``
allocator, the ``block_table`` that maps (slot, layer, logical block) to a physical block, and
the prefix cache that lets requests share full blocks of equal prompts."""

from paged_tutorial.cache.paged_cache import BlockEvent, CacheFullError, PagedKVCache
from paged_tutorial.cache.prefix_cache import PrefixCachingKVCache

__all__ = ["BlockEvent", "CacheFullError", "PagedKVCache", "PrefixCachingKVCache"]
