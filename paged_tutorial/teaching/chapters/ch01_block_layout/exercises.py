"""Exercises of notebook 01 (one block's layout: K first, V at V_OFFSET).  Right answers are
computed from ``CacheConfig`` / ``PagedKVCache``; the questions' inputs (model shapes,
positions, block ids) are the only numbers written here."""

from __future__ import annotations

from paged_tutorial.config import CacheConfig
from paged_tutorial.teaching.exercises.answers import Integer, Numbers
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import article_cache_config, small_article_cache
from paged_tutorial.teaching.language import Text, say

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
        Text(en="The article's cache in float32 instead of bf16 (still 2 GiB): (V_OFFSET, "
                "BLOCK_BYTES, NUM_BLOCKS).",
             ko="글의 캐시를 bf16 대신 float32로 (여전히 2 GiB): (V_OFFSET, BLOCK_BYTES, "
                "NUM_BLOCKS)."),
        Numbers(Integer(), 3, ("V_OFFSET", "BLOCK_BYTES", "NUM_BLOCKS")),
        lambda: tuple(getattr(article_cache_config(dtype="float32"), n)
                      for n in ("V_OFFSET", "BLOCK_BYTES", "NUM_BLOCKS")),
        explain=lambda e: f"(V_OFFSET, BLOCK_BYTES, NUM_BLOCKS) = {e}",
        hint=Text(en="a float32 element takes 4 bytes instead of 2; the cache stays 2 GiB",
                  ko="float32 원소는 2바이트가 아니라 4바이트입니다; 캐시는 그대로 2 GiB"),
        mistakes=(
            Mistake(lambda: tuple(getattr(article_cache_config(), n)
                                  for n in ("V_OFFSET", "BLOCK_BYTES", "NUM_BLOCKS")),
                    Text(en="those are the bf16 numbers: a float32 element takes 4 bytes",
                         ko="그것은 bf16의 값입니다: float32 원소는 4바이트입니다")),
        )),
    Exercise(
        "01.v_byte_offset",
        Text(en="Byte offset, from the start of the cache buffer, of V for position {position} "
                "of a sequence whose logical block lives in physical block {physical}, kv head "
                "{kv_head}, dimension {dim} (the article's bf16 cache).".format(**V_QUESTION),
             ko="캐시 버퍼 시작에서 센 V의 바이트 오프셋: 시퀀스의 위치 {position}, 그 논리 "
                "블록은 물리 블록 {physical}에 있고, KV 헤드 {kv_head}, 차원 {dim} (글의 bf16 "
                "캐시).".format(**V_QUESTION)),
        Integer(), _v_offset,
        explain=lambda e: (f"{e} = {V_QUESTION['physical']}*BLOCK_BYTES + "
                           f"{V_QUESTION['position'] % 16}*KV_DIM*2 + "
                           f"{V_QUESTION['kv_head']}*64*2 + {V_QUESTION['dim']}*2 + V_OFFSET"),
        hint=Text(en="block start + token_in_block * KV_DIM * 2 + kv_head * head_dim * 2 + "
                     "dim * 2, then + V_OFFSET",
                  ko="블록 시작 + token_in_block * KV_DIM * 2 + kv_head * head_dim * 2 + "
                     "dim * 2, 그리고 + V_OFFSET"),
        mistakes=(
            Mistake(lambda: _v_offset() - small_article_cache().V_OFFSET,
                    Text(en="that is where the K element lives: V starts V_OFFSET bytes later",
                         ko="그것은 K 원소의 자리입니다: V는 V_OFFSET 바이트 뒤에서 시작합니다")),
            Mistake(lambda: _v_offset(position=V_QUESTION["position"]),
                    Text(en="position 21 is token 21 % BLOCK_SIZE inside its logical block",
                         ko="위치 21은 자기 논리 블록 안에서 21 % BLOCK_SIZE번째 토큰입니다")),
            Mistake(lambda: _v_offset() // 2,
                    Text(en="that counts elements: the question asks for bytes (2 per bf16 "
                            "element)",
                         ko="그것은 원소 개수입니다: 묻는 것은 바이트입니다 (bf16 원소당 2)")),
        )),
    Exercise(
        "01.smollm2_block32",
        Text(en="SmolLM2-135M (30 layers, 3 KV heads x 64) in bf16 with 32-token blocks: "
                "(KV_DIM, V_OFFSET, MAX_BLOCKS_PER_SEQ) for max_seq_len 2048.",
             ko="SmolLM2-135M (레이어 30개, KV 헤드 3개 x 64)을 bf16, 32토큰 블록으로: "
                "max_seq_len 2048일 때 (KV_DIM, V_OFFSET, MAX_BLOCKS_PER_SEQ)."),
        Numbers(Integer(), 3, ("KV_DIM", "V_OFFSET", "MAX_BLOCKS_PER_SEQ")),
        lambda: tuple(getattr(_smollm2_block32(), n)
                      for n in ("KV_DIM", "V_OFFSET", "MAX_BLOCKS_PER_SEQ")),
        explain=lambda e: f"(KV_DIM, V_OFFSET, MAX_BLOCKS_PER_SEQ) = {e}",
        hint=Text(en="KV_DIM = KV heads x head_dim; V_OFFSET = BLOCK_SIZE x KV_DIM x 2 B; "
                     "MAX_BLOCKS_PER_SEQ = max_seq_len / BLOCK_SIZE",
                  ko="KV_DIM = KV 헤드 수 x head_dim; V_OFFSET = BLOCK_SIZE x KV_DIM x 2 B; "
                     "MAX_BLOCKS_PER_SEQ = max_seq_len / BLOCK_SIZE")),
)
