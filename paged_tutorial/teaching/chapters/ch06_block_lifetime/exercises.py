"""Exercises of notebook 06: the lifetime of physical blocks (free_blocks, release, H2D
copies).  Right answers come from the package: the article's Llama-3.2-1B cache configuration,
a real ``PagedKVCache`` and a real ``Engine`` run on a tiny random model."""

from __future__ import annotations

from functools import lru_cache

from paged_tutorial.config import CacheConfig, llama_3_2_1b_config
from paged_tutorial.teaching.exercises.answers import Integer
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import tiny_engine
from paged_tutorial.teaching.language import Text, say

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


PEAK = dict(prompt_len=40, max_tokens=9, num_layers=30)


@lru_cache(maxsize=None)
def peak_blocks(prompt_len: int = PEAK["prompt_len"], max_tokens: int = PEAK["max_tokens"],
                num_layers: int = PEAK["num_layers"]) -> int:
    """Run a real engine on a tiny random model with ``num_layers`` layers and no EOS; return
    the most physical blocks the request owned at once."""
    engine = tiny_engine(num_layers=num_layers, max_slots=1)
    engine.add_request([1] * prompt_len, max_tokens=max_tokens)
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.cache.blocks_owned(0))
    return peak


EXERCISES = (
    Exercise(
        "06.table_bytes_per_decode_step",
        Text(en="Bytes of block table the article's engine copies host -> device in one decode "
                "step.",
             ko="글의 엔진이 디코드 한 스텝에 호스트 -> 디바이스로 복사하는 블록 테이블의 "
                "바이트 수."),
        Integer(), article_table_bytes_per_decode_step,
        explain=lambda e: say(
            en=f"{e:,} B: 4096 int32 entries x 16 layers, about 256 KiB of table per decode "
               "step, almost all of it unchanged",
            ko=f"{e:,} B: int32 항목 4096개 x 레이어 16개, 디코드 스텝마다 약 256 KiB의 테이블을 "
               "보내는데 거의 전부가 바뀌지 않은 값입니다"),
        hint=Text(en="entries in the table x bytes per entry x copies per decode step",
                  ko="테이블의 항목 수 x 항목당 바이트 x 디코드 스텝당 복사 횟수"),
        mistakes=(
            Mistake(lambda: article_table_bytes_per_decode_step() // 16,
                    Text(en="that is one copy; main.cpp:876 sits inside the layer loop",
                         ko="그것은 한 번의 복사입니다; main.cpp:876은 레이어 루프 안에 있습니다")),
            Mistake(lambda: article_table_bytes_per_decode_step() // INT32_BYTES,
                    Text(en="that counts entries; each entry is an int32 of 4 bytes",
                         ko="그것은 항목 개수입니다; 항목 하나는 4바이트 int32입니다")),
        )),
    Exercise(
        "06.next_pop",
        Text(en="A fresh cache of 64 blocks, 2 layers: slot 0 grows to 20 tokens and is "
                "released; then slot 1 takes one token.  Which physical block lands in "
                "block_table[1, 0, 0]?",
             ko="블록 64개, 레이어 2개인 새 캐시: 슬롯 0이 토큰 20개로 자란 뒤 반납되고, 이어서 "
                "슬롯 1이 토큰 하나를 받습니다.  block_table[1, 0, 0]에는 어느 물리 블록이 "
                "들어갈까요?"),
        Integer(), next_pop_block,
        explain=lambda e: say(
            en=f"block {e}: release pushed 63, 62, 61, 60 (layer by layer, logical block by "
               "logical block) and the stack hands back the last one pushed",
            ko=f"블록 {e}: 반납이 63, 62, 61, 60 순서로 (레이어 바깥, 논리 블록 안쪽) 밀어 넣었고, "
               "스택은 마지막에 넣은 것을 먼저 돌려줍니다"),
        hint=Text(en="write the free list's tail after each pop and push (pop_back / push_back)",
                  ko="pop과 push마다 빈 블록 목록의 끝을 적어 보세요 (pop_back / push_back)"),
        mistakes=(
            Mistake(lambda: 63, Text(
                en="63 is the first block slot 0 popped and the first one pushed back; "
                   "pop_back takes from the other end",
                ko="63은 슬롯 0이 처음 꺼내고 처음 돌려준 블록입니다; pop_back은 반대쪽 끝에서 "
                   "꺼냅니다")),
            Mistake(lambda: 0, Text(
                en="free_blocks is used as a stack: pops come from the end (the high ids)",
                ko="free_blocks는 스택으로 쓰입니다: pop은 끝(큰 번호)에서 꺼냅니다")),
            Mistake(lambda: 59, Text(
                en="release gives the blocks back, so the next pop reuses one of them rather "
                   "than a block never used",
                ko="반납이 블록을 돌려주므로, 다음 pop은 한 번도 안 쓴 블록이 아니라 돌려받은 "
                   "블록 하나를 다시 씁니다")),
        )),
    Exercise(
        "06.peak_blocks",
        Text(en="A request with a {prompt_len}-token prompt and max_tokens {max_tokens} "
                "runs alone on a {num_layers}-layer model (no EOS).  The most physical blocks it "
                "owns at once?".format(**PEAK),
             ko="프롬프트 {prompt_len}토큰, max_tokens {max_tokens}인 요청 하나가 "
                "레이어 {num_layers}개 모델에서 혼자 돕니다 (EOS 없음).  한때 가장 많이 가진 물리 "
                "블록 수는?".format(**PEAK)),
        Integer(), peak_blocks,
        explain=lambda e: say(
            en=f"{e}: 40 + 8 = 48 tokens reach the cache (3 blocks x 30 layers); the 9th "
               "generated token ends the request before any step writes its K/V",
            ko=f"{e}: 40 + 8 = 48토큰이 캐시에 들어갑니다 (블록 3개 x 레이어 30개); 9번째로 "
               "생성한 토큰은 어떤 스텝도 그 K/V를 쓰기 전에 요청을 끝냅니다"),
        hint=Text(en="count the tokens whose K/V are written, then blocks per layer x layers",
                  ko="K/V가 실제로 쓰이는 토큰을 센 다음, 레이어당 블록 수 x 레이어 수"),
        mistakes=(
            Mistake(lambda: 4 * PEAK["num_layers"], Text(
                en="49 tokens would need a 4th block, but is the last sampled token ever "
                   "written to the cache?",
                ko="49토큰이면 4번째 블록이 필요하지만, 마지막에 뽑은 토큰이 캐시에 쓰이기는 "
                   "할까요?")),
            Mistake(lambda: 3, Text(
                en="every layer owns its own blocks: multiply by the 30 layers",
                ko="레이어마다 자기 블록을 가집니다: 레이어 30개를 곱하세요")),
        )),
)
