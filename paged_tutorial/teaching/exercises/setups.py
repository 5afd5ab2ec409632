"""The caches and engines the exercises ask about (their right answers are computed on these).

- ``article_cache_config``: the article's cache (Llama-3.2-1B, bf16, 2 GiB, 2 slots, 2048
  tokens), optionally changed;
- ``small_article_cache``: a ``PagedKVCache`` with the article's shapes (block table
  2 x 16 x 128, the same addresses) but only a few blocks of buffer;
- ``tiny_engine``: a real ``Engine`` on a tiny random Llama (torch backend, CPU), for answers
  counted by running the engine.
"""

from __future__ import annotations

from paged_tutorial.config import CacheConfig, ModelConfig, llama_3_2_1b_config
from paged_tutorial.cache.paged_cache import PagedKVCache

ARTICLE_CACHE = dict(dtype="bfloat16", kv_cache_bytes=2 * 1024 ** 3, max_slots=2,
                     max_seq_len=2048)


def article_cache_config(**changes) -> CacheConfig:
    """The article's cache: Llama-3.2-1B, bf16, 2 GiB, 2 slots, 2048 tokens (``changes`` edits
    any of those)."""
    return CacheConfig.for_model(llama_3_2_1b_config(), **{**ARTICLE_CACHE, **changes})


def small_article_cache(num_blocks: int = 1, **changes) -> PagedKVCache:
    """A PagedKVCache with the article's shapes (block table 2 x 16 x 128, same addresses) but
    only ``num_blocks`` blocks of buffer, so that it fits in a checker's memory."""
    config = article_cache_config(**changes)
    return PagedKVCache(article_cache_config(kv_cache_bytes=num_blocks * config.BLOCK_BYTES,
                                             **changes))


def tiny_engine(num_layers: int = 2, max_slots: int = 1, max_seq_len: int = 128,
                prefix_caching: bool = False):
    """A real Engine on a tiny random Llama (torch backend, CPU, no EOS token)."""
    from paged_tutorial.engine.llm_engine import Engine
    from paged_tutorial.loading.models import random_model

    config = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=num_layers, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8)
    return Engine(random_model(config, seed=0), backend="torch", device="cpu",
                  max_slots=max_slots, max_seq_len=max_seq_len, prefix_caching=prefix_caching)
