"""Exercises of notebook 06: the lifetime of physical blocks (free_blocks, release, H2D
copies).  Right answers come from the package: the article's Llama-3.2-1B cache configuration,
a real ``PagedKVCache`` and a real ``Engine`` run on a tiny random model."""

from __future__ import annotations

from functools import lru_cache

from paged_tutorial.config import CacheConfig, llama_3_2_1b_config
from paged_tutorial.teaching.exercises.answers import Integer
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import tiny_engine

INT32_BYTES = 4


def article_table_bytes_per_decode_step() -> int:
    """Bytes of block table the article's engine sends host->device in one decode step: the
    whole int32 table once per layer (``src/main.cpp:876``)."""
    model = llama_3_2_1b_config()
    cache = CacheConfig.for_model(model, max_slots=2, max_seq_len=2048)
    return cache.block_table_entries * INT32_BYTES * model.num_hidden_layers


@lru_cache(maxsize=None)
def next_pop_block() -> int:
    """Fresh cache of 64 blocks, 2 layers; slot 0 grows to 20 tokens and is released; then
    slot 1 takes one token.  Which physical block lands in block_table[1, 0, 0]?"""
    from paged_tutorial.cache.paged_cache import PagedKVCache

    config = CacheConfig(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32",
                         kv_cache_bytes=64 * 2 * 16 * 8 * 4, max_slots=2, max_seq_len=64)
    cache = PagedKVCache(config)
    cache.ensure_capacity(0, 20)
    cache.release(0)
    cache.ensure_capacity(1, 1)
    return int(cache.block_table[1, 0, 0])


PEAK = dict(prompt_len=40, max_new_tokens=9, num_layers=30)


@lru_cache(maxsize=None)
def peak_blocks(prompt_len: int = PEAK["prompt_len"], max_new_tokens: int = PEAK["max_new_tokens"],
                num_layers: int = PEAK["num_layers"]) -> int:
    """Run a real engine on a tiny random model with ``num_layers`` layers and no EOS; return
    the most physical blocks the request owned at once."""
    engine = tiny_engine(num_layers=num_layers, max_slots=1)
    engine.add_request([1] * prompt_len, max_new_tokens=max_new_tokens)
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.cache.blocks_owned(0))
    return peak


EXERCISES = (
    Exercise(
        "06.table_bytes_per_decode_step",
        "Bytes of block table the article's engine copies host -> device in one decode step.",
        Integer(), article_table_bytes_per_decode_step,
        explain=lambda e: (f"{e:,} B: 4096 int32 entries x 16 layers, about 256 KiB of table per "
                           "decode step, almost all of it unchanged"),
        hint="entries in the table x bytes per entry x copies per decode step",
        mistakes=(
            Mistake(lambda: article_table_bytes_per_decode_step() // 16,
                    "that is one copy; main.cpp:876 sits inside the layer loop"),
            Mistake(lambda: article_table_bytes_per_decode_step() // INT32_BYTES,
                    "that counts entries; each entry is an int32 of 4 bytes"),
        )),
    Exercise(
        "06.next_pop",
        "A fresh cache of 64 blocks, 2 layers: slot 0 grows to 20 tokens and is released; then "
        "slot 1 takes one token.  Which physical block lands in block_table[1, 0, 0]?",
        Integer(), next_pop_block,
        explain=lambda e: (f"block {e}: release pushed 63, 62, 61, 60 (layer by layer, logical "
                           "block by logical block) and the stack hands back the last one pushed"),
        hint="write the free list's tail after each pop and push (pop_back / push_back)",
        mistakes=(
            Mistake(lambda: 63, "63 is the first block slot 0 popped and the first one pushed "
                    "back; pop_back takes from the other end"),
            Mistake(lambda: 0, "free_blocks is used as a stack: pops come from the end (the "
                    "high ids)"),
            Mistake(lambda: 59, "release gives the blocks back, so the next pop reuses one of "
                    "them rather than a block never used"),
        )),
    Exercise(
        "06.peak_blocks",
        "A request with a {prompt_len}-token prompt and max_new_tokens {max_new_tokens} runs "
        "alone on a {num_layers}-layer model (no EOS).  The most physical blocks it owns at "
        "once?".format(**PEAK),
        Integer(), peak_blocks,
        explain=lambda e: (f"{e}: 40 + 8 = 48 tokens reach the cache (3 blocks x 30 layers); "
                           "the 9th generated token ends the request before any step writes "
                           "its K/V"),
        hint="count the tokens whose K/V are written, then blocks per layer x layers",
        mistakes=(
            Mistake(lambda: 4 * PEAK["num_layers"],
                    "49 tokens would need a 4th block, but is the last sampled token ever "
                    "written to the cache?"),
            Mistake(lambda: 3, "every layer owns its own blocks: multiply by the 30 layers"),
        )),
)
