"""Chapter 06 exercises: the lifetime of physical blocks (free_blocks, release, H2D copies).

Every expected answer is computed from the package: the article's Llama-3.2-1B cache
configuration, a real ``PagedKVCache`` and a real ``Engine`` run on a tiny random model.
"""

from __future__ import annotations

from ..config import CacheConfig, llama_3_2_1b_config
from . import as_int, tiny_engine

INT32_BYTES = 4


def article_table_bytes_per_decode_step() -> int:
    """Bytes of block table the article's engine sends host->device in one decode step: the
    whole int32 table once per layer (``src/main.cpp:876``)."""
    model = llama_3_2_1b_config()
    cache = CacheConfig.for_model(model, max_slots=2, max_seq_len=2048)
    return cache.block_table_entries * INT32_BYTES * model.num_hidden_layers


def check_table_bytes(answer):
    want = article_table_bytes_per_decode_step()
    got = as_int(answer)
    if got == want:
        return True, (f"{want:,} B: 4096 int32 entries x 16 layers, about 256 KiB of table per "
                      "decode step, almost all of it unchanged")
    if got == want // 16:
        return False, "that is one copy; main.cpp:876 sits inside the layer loop"
    if got == want // INT32_BYTES:
        return False, "that counts entries; each entry is an int32 of 4 bytes"
    return False, "entries in the table x bytes per entry x copies per decode step"


def next_pop_block() -> int:
    """Fresh cache of 64 blocks, 2 layers; slot 0 grows to 20 tokens and is released; then
    slot 1 takes one token.  Which physical block lands in block_table[1, 0, 0]?"""
    from ..kv_cache import PagedKVCache

    config = CacheConfig(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32",
                         kv_cache_bytes=64 * 2 * 16 * 8 * 4, max_slots=2, max_seq_len=64)
    cache = PagedKVCache(config)
    assert cache.NUM_BLOCKS == 64
    cache.ensure_capacity(0, 20)
    cache.release(0)
    cache.ensure_capacity(1, 1)
    return int(cache.block_table[1, 0, 0])


def check_next_pop(answer):
    want = next_pop_block()
    got = as_int(answer)
    if got == want:
        return True, (f"block {want}: release pushed 63, 62, 61, 60 (layer by layer, logical "
                      "block by logical block) and the stack hands back the last one pushed")
    if got == 63:
        return False, ("63 is the first block slot 0 popped and the first one pushed back; "
                       "pop_back takes from the other end")
    if got in (0, 1):
        return False, "free_blocks is used as a stack: pops come from the end (the high ids)"
    return False, "write the free list's tail after each pop and push (pop_back / push_back)"


def peak_blocks(prompt_len: int = 40, max_new_tokens: int = 9, num_layers: int = 30) -> int:
    """Run a real engine on a tiny random model with ``num_layers`` layers and no EOS; return
    the most physical blocks the request owned at once."""
    engine = tiny_engine(num_layers=num_layers, max_slots=1)
    engine.add_request([1] * prompt_len, max_new_tokens=max_new_tokens)
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.cache.blocks_owned(0))
    return peak


def check_peak_blocks(answer):
    want = peak_blocks()
    got = as_int(answer)
    if got == want:
        return True, (f"{want}: 40 + 8 = 48 tokens reach the cache (3 blocks x 30 layers); the "
                      "9th generated token ends the request before any step writes its K/V")
    if got == 120:
        return False, ("49 tokens would need a 4th block, but is the last sampled token ever "
                       "written to the cache?")
    if got in (3, 4):
        return False, "every layer owns its own blocks: multiply by the 30 layers"
    return False, "count the tokens whose K/V are written, then blocks per layer x layers"


CHECKS = {
    "06.table_bytes_per_decode_step": check_table_bytes,
    "06.next_pop": check_next_pop,
    "06.peak_blocks": check_peak_blocks,
}
