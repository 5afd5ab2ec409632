"""Exercises of notebook 01 (one block's layout: K first, V at V_OFFSET).  Right answers are
computed from ``CacheConfig`` / ``PagedKVCache``; the questions' inputs (model shapes,
positions, block ids) are the only numbers written here."""

from __future__ import annotations

from paged_tutorial.config import CacheConfig
from paged_tutorial.teaching.exercises.answers import Integer, Numbers
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import article_cache_config, small_article_cache

V_QUESTION = dict(position=21, physical=1000, kv_head=5, dim=10)


def _v_offset(position=None):
    q = V_QUESTION
    cache = small_article_cache()
    token = q["position"] % cache.BLOCK_SIZE if position is None else position
    return cache.v_byte_offset(q["physical"], token, q["kv_head"], q["dim"])


def _smollm2_block32() -> CacheConfig:
    return CacheConfig(num_layers=30, num_kv_heads=3, head_dim=64, dtype="bfloat16",
                       kv_cache_bytes=2 * 1024 ** 3, max_slots=2, max_seq_len=2048,
                       block_size=32)


EXERCISES = (
    Exercise(
        "01.float32_constants",
        "The article's cache in float32 instead of bf16 (still 2 GiB): (V_OFFSET, BLOCK_BYTES, "
        "NUM_BLOCKS).",
        Numbers(Integer(), 3, ("V_OFFSET", "BLOCK_BYTES", "NUM_BLOCKS")),
        lambda: tuple(getattr(article_cache_config(dtype="float32"), n)
                      for n in ("V_OFFSET", "BLOCK_BYTES", "NUM_BLOCKS")),
        explain=lambda e: f"(V_OFFSET, BLOCK_BYTES, NUM_BLOCKS) = {e}",
        hint="a float32 element takes 4 bytes instead of 2; the cache stays 2 GiB",
        mistakes=(
            Mistake(lambda: tuple(getattr(article_cache_config(), n)
                                  for n in ("V_OFFSET", "BLOCK_BYTES", "NUM_BLOCKS")),
                    "those are the bf16 numbers: a float32 element takes 4 bytes"),
        )),
    Exercise(
        "01.v_byte_offset",
        "Byte offset, from the start of the cache buffer, of V for position {position} of a "
        "sequence whose logical block lives in physical block {physical}, kv head {kv_head}, "
        "dimension {dim} (the article's bf16 cache).".format(**V_QUESTION),
        Integer(), _v_offset,
        explain=lambda e: (f"{e} = {V_QUESTION['physical']}*BLOCK_BYTES + "
                           f"{V_QUESTION['position'] % 16}*KV_DIM*2 + "
                           f"{V_QUESTION['kv_head']}*64*2 + {V_QUESTION['dim']}*2 + V_OFFSET"),
        hint=("block start + token_in_block * KV_DIM * 2 + kv_head * head_dim * 2 + dim * 2, "
              "then + V_OFFSET"),
        mistakes=(
            Mistake(lambda: _v_offset() - small_article_cache().V_OFFSET,
                    "that is where the K element lives: V starts V_OFFSET bytes later"),
            Mistake(lambda: _v_offset(position=V_QUESTION["position"]),
                    "position 21 is token 21 % BLOCK_SIZE inside its logical block"),
            Mistake(lambda: _v_offset() // 2,
                    "that counts elements: the question asks for bytes (2 per bf16 element)"),
        )),
    Exercise(
        "01.smollm2_block32",
        "SmolLM2-135M (30 layers, 3 KV heads x 64) in bf16 with 32-token blocks: (KV_DIM, "
        "V_OFFSET, MAX_BLOCKS_PER_SEQ) for max_seq_len 2048.",
        Numbers(Integer(), 3, ("KV_DIM", "V_OFFSET", "MAX_BLOCKS_PER_SEQ")),
        lambda: tuple(getattr(_smollm2_block32(), n)
                      for n in ("KV_DIM", "V_OFFSET", "MAX_BLOCKS_PER_SEQ")),
        explain=lambda e: f"(KV_DIM, V_OFFSET, MAX_BLOCKS_PER_SEQ) = {e}",
        hint=("KV_DIM = KV heads x head_dim; V_OFFSET = BLOCK_SIZE x KV_DIM x 2 B; "
              "MAX_BLOCKS_PER_SEQ = max_seq_len / BLOCK_SIZE")),
)
