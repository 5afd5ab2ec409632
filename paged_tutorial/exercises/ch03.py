"""Exercises of notebook 03: logical block -> physical block -> address.

Every expected answer is computed from the package (``PagedKVCache`` and the NumPy replay of
the decode kernel's addressing in ``viz.kernels``) for the article's Llama-3.2-1B cache.
"""

from __future__ import annotations
from . import as_int


def _article_cache():
    """A PagedKVCache with the article's layout (Llama-3.2-1B, bf16, 2 slots, 2048 tokens) but a
    one-block buffer: offsets and table indices do not depend on NUM_BLOCKS."""
    from ..config import CacheConfig, llama_3_2_1b_config
    from ..kv_cache import PagedKVCache

    model = llama_3_2_1b_config()
    one = CacheConfig.for_model(model, dtype="bfloat16", max_slots=2, max_seq_len=2048)
    return PagedKVCache(CacheConfig.for_model(model, dtype="bfloat16", max_slots=2,
                                              max_seq_len=2048, kv_cache_bytes=one.BLOCK_BYTES))


def check_flat_index(answer):
    """Flat block-table index of (slot 1, layer 3, logical block 5) in the article's table."""
    cache = _article_cache()
    expected = cache.flat_index(1, 3, 5)
    c = cache.config
    if as_int(answer) == expected:
        return True, (f"1*{c.num_layers}*{c.MAX_BLOCKS_PER_SEQ} + 3*{c.MAX_BLOCKS_PER_SEQ} + 5 = "
                      f"{expected} (of {c.block_table_entries} entries)")
    return False, ("use slot*N_LAYERS*MAX_BLOCKS_PER_SEQ + layer*MAX_BLOCKS_PER_SEQ + "
                   "logical_block with the article's N_LAYERS and MAX_BLOCKS_PER_SEQ")


def check_v_byte_offset(answer):
    """Byte offset of V for physical block 3, token 5 of the block, kv head 2, dim 10 (bf16)."""
    cache = _article_cache()
    expected = cache.v_byte_offset(3, 5, 2, 10)
    if as_int(answer) == expected:
        return True, (f"3*BLOCK_BYTES + V_OFFSET + 5*KV_DIM*2 + 2*64*2 + 10*2 = {expected} bytes")
    if as_int(answer) == cache.k_byte_offset(3, 5, 2, 10):
        return False, "that is the K address: V lives V_OFFSET bytes further"
    return False, ("block start + V_OFFSET + token row + head slice + element, all in bytes "
                   "(bf16 = 2)")


def check_blocks_for_33(answer):
    """(num_blocks, tokens read from the last block) when the kernel decodes with seq_len 33."""
    from ..viz.kernels import kernel_read_trace

    cache = _article_cache()
    trace = kernel_read_trace(cache, layer=0, slot=0, seq_len=33, q_head=0, q_per_kv=4)
    expected = (int(trace.num_blocks), int(trace.tokens_in_block[-1]))
    try:
        got = tuple(int(x) for x in answer)
    except TypeError:
        got = None
    if got == expected:
        return True, (f"ceil(33/16) = {expected[0]} blocks; the last one holds "
                      f"min(33 - 2*16, 16) = {expected[1]} token")
    return False, "num_blocks = ceil(seq_len / 16); tokens_in_block = min(seq_len - lb*16, 16)"


CHECKS = {
    "03.flat_index": check_flat_index,
    "03.v_byte_offset": check_v_byte_offset,
    "03.blocks_for_33": check_blocks_for_33,
}
