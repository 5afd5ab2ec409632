"""Exercises of notebook 01 (one block's layout: K first, V at V_OFFSET).

Every expected answer is computed from ``CacheConfig`` / ``PagedKVCache``; the questions' inputs
(the model shapes, positions, block ids) are the only numbers written here.
"""

from __future__ import annotations

from ..config import CacheConfig, llama_3_2_1b_config
from ..kv_cache import PagedKVCache
from . import as_int

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


def as_int_tuple(value, n: int):
    try:
        items = tuple(value)
    except TypeError:
        return None
    if len(items) != n:
        return None
    ints = tuple(as_int(v) for v in items)
    return None if any(v is None for v in ints) else ints


def compare_tuple(answer, expected: tuple, names: str, hint: str):
    got = as_int_tuple(answer, len(expected))
    if got is None:
        return False, f"give a tuple of {len(expected)} integers ({names})"
    if got == expected:
        return True, f"({names}) = {expected}"
    wrong = [n.strip() for n, g, e in zip(names.split(","), got, expected) if g != e]
    return False, f"{', '.join(wrong)} wrong; {hint}"


def _float32_constants(answer):
    c = article_cache_config(dtype="float32")
    return compare_tuple(answer, (c.V_OFFSET, c.BLOCK_BYTES, c.NUM_BLOCKS),
                         "V_OFFSET, BLOCK_BYTES, NUM_BLOCKS",
                         "a float32 element takes 4 bytes instead of 2; the cache stays 2 GiB")


def _v_byte_offset(answer):
    cache = small_article_cache()
    position, physical, kv_head, dim = 21, 1000, 5, 10
    expected = cache.v_byte_offset(physical, position % cache.BLOCK_SIZE, kv_head, dim)
    got = as_int(answer)
    if got is None:
        return False, "give one integer: a byte offset from the start of the cache buffer"
    if got == expected:
        return True, (f"{expected} = {physical}*BLOCK_BYTES + {position % cache.BLOCK_SIZE}*KV_DIM*2"
                      f" + {kv_head}*{cache.config.head_dim}*2 + {dim}*2 + V_OFFSET")
    if got == expected - cache.V_OFFSET:
        return False, "that is where the K element lives: V starts V_OFFSET bytes later"
    if got == cache.v_byte_offset(physical, position, kv_head, dim):
        return False, "position 21 is token 21 % BLOCK_SIZE inside its logical block"
    return False, ("block start + token_in_block * KV_DIM * 2 + kv_head * head_dim * 2 + "
                   "dim * 2, then + V_OFFSET")


def _smollm2_block32(answer):
    c = CacheConfig(num_layers=30, num_kv_heads=3, head_dim=64, dtype="bfloat16",
                    kv_cache_bytes=2 * 1024 ** 3, max_slots=2, max_seq_len=2048, block_size=32)
    return compare_tuple(answer, (c.KV_DIM, c.V_OFFSET, c.MAX_BLOCKS_PER_SEQ),
                         "KV_DIM, V_OFFSET, MAX_BLOCKS_PER_SEQ",
                         "KV_DIM = KV heads x head_dim; V_OFFSET = BLOCK_SIZE x KV_DIM x 2 B; "
                         "MAX_BLOCKS_PER_SEQ = max_seq_len / BLOCK_SIZE")


CHECKS = {
    "01.float32_constants": _float32_constants,
    "01.v_byte_offset": _v_byte_offset,
    "01.smollm2_block32": _smollm2_block32,
}
