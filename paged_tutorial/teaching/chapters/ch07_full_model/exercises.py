"""Exercises of notebook 07: the whole model through two slots, and what its cache costs.
Right answers come from the package: a real ``Engine`` run on a tiny random model, and
``CacheConfig`` for the article's Llama-3.2-1B configuration and the SmolLM2-135M shapes."""

from __future__ import annotations

from functools import lru_cache

from paged_tutorial.config import CacheConfig, ModelConfig, llama_3_2_1b_config, smollm2_135m_config
from paged_tutorial.teaching.exercises.answers import Integer
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import tiny_engine
from paged_tutorial.teaching.language import Text, say

NEW_TOKENS = (10, 30, 20)


def kv_bytes_per_token(model: ModelConfig, dtype: str) -> int:
    """Bytes of K and V one token occupies in the cache, all layers together."""
    cache = CacheConfig.for_model(model, dtype=dtype)
    return cache.BLOCK_BYTES // cache.BLOCK_SIZE * model.num_hidden_layers


@lru_cache(maxsize=None)
def steps_for_requests(new_tokens=NEW_TOKENS, max_slots: int = 2) -> int:
    """Engine steps a run takes: requests needing ``new_tokens`` tokens each (no EOS), queued
    in order, through ``max_slots`` slots; counted on a real Engine with a tiny random model."""
    engine = tiny_engine(num_layers=2, max_slots=max_slots)
    for n in new_tokens:
        engine.add_request([1, 2, 3], max_tokens=n)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps


def sequences_in_article_cache() -> int:
    model = llama_3_2_1b_config()
    cache = CacheConfig.for_model(model, max_seq_len=2048)      # 2 GiB, bf16: the article's
    return cache.NUM_BLOCKS // (cache.MAX_BLOCKS_PER_SEQ * model.num_hidden_layers)


EXERCISES = (
    Exercise(
        "07.steps_for_three_requests",
        Text(en="Requests needing {} / {} / {} new tokens (no EOS) queue in that order for 2 "
                "slots.  How many engine steps until all are done?".format(*NEW_TOKENS),
             ko="새 토큰이 {} / {} / {}개 필요한 요청들이 (EOS 없음) 그 순서로 슬롯 2개를 "
                "기다립니다.  모두 끝날 때까지 엔진 스텝은 몇 번일까요?".format(*NEW_TOKENS)),
        Integer(), steps_for_requests,
        explain=lambda e: say(
            en=f"{e} steps: 1 prefill (r0, r1) + 9 decodes until r0 is done, 1 prefill for r2 in "
               "which r1 waits, then 20 decodes for r1 (r2 needs 19 of them)",
            ko=f"스텝 {e}번: 프리필 1번 (r0, r1) + r0이 끝날 때까지 디코드 9번, r1이 기다리는 "
               "r2의 프리필 1번, 그리고 r1의 디코드 20번 (r2는 그중 19번이 필요)"),
        hint=Text(en="walk the steps: a prefill gives each admitted request its first token",
                  ko="스텝을 하나씩 따라가 보세요: 프리필은 받아들인 요청마다 첫 토큰을 줍니다"),
        mistakes=(
            Mistake(lambda: steps_for_requests() - 1, Text(
                en="a step that prefills a newly admitted request decodes nobody else: the "
                   "running request waits one step",
                ko="새로 받아들인 요청을 프리필하는 스텝에서는 아무도 디코드하지 않습니다: 돌던 "
                   "요청은 한 스텝 기다립니다")),
            Mistake(lambda: sum(NEW_TOKENS), Text(
                en="that is one request at a time; two slots decode together",
                ko="그것은 한 번에 요청 하나일 때입니다; 슬롯 두 개는 함께 디코드합니다")),
        )),
    Exercise(
        "07.sequences_in_2gib",
        Text(en="How many full 2048-token sequences fit in the article's 2 GiB cache at once?",
             ko="글의 2 GiB 캐시에 2048토큰짜리 꽉 찬 시퀀스가 동시에 몇 개 들어갈까요?"),
        Integer(), sequences_in_article_cache,
        explain=lambda e: say(
            en=f"{e}: 65536 blocks / (128 logical blocks x 16 layers); the article's engine "
               "serves only 2 slots, so most of its 2 GiB waits unused",
            ko=f"{e}: 블록 65536개 / (논리 블록 128개 x 레이어 16개); 글의 엔진은 슬롯 2개만 "
               "쓰므로 2 GiB의 대부분이 쓰이지 않고 기다립니다"),
        hint=Text(en="how many physical blocks does one full sequence take, over all its layers? "
                     "And how many blocks does the cache have?",
                  ko="꽉 찬 시퀀스 하나가 모든 레이어에 걸쳐 물리 블록을 몇 개 차지할까요? 그리고 "
                     "캐시에는 블록이 몇 개 있을까요?"),
        mistakes=(Mistake(lambda: 512, Text(
            en="a full sequence needs 128 blocks in every one of the 16 layers",
            ko="꽉 찬 시퀀스는 16개 레이어 각각에 블록 128개가 필요합니다")),)),
    Exercise(
        "07.smollm2_kv_bytes_per_token",
        Text(en="Bytes of K and V per token, all layers, for SmolLM2-135M stored in float32.",
             ko="SmolLM2-135M을 float32로 저장할 때, 토큰 하나의 K와 V가 모든 레이어에서 "
                "차지하는 바이트 수."),
        Integer(), lambda: kv_bytes_per_token(smollm2_135m_config(), "float32"),
        explain=lambda e: say(
            en=f"{e:,} B = 30 layers x 2 x 192 x 4 B: the small model in float32 costs more "
               "cache per token than Llama-3.2-1B in bf16",
            ko=f"{e:,} B = 레이어 30개 x 2 x 192 x 4 B: float32의 작은 모델이 bf16의 "
               "Llama-3.2-1B보다 토큰당 캐시를 더 씁니다"),
        hint=Text(en="layers x 2 (K and V) x KV_DIM (3 KV heads x 64) x 4 bytes",
                  ko="레이어 수 x 2 (K와 V) x KV_DIM (KV 헤드 3개 x 64) x 4바이트"),
        mistakes=(Mistake(lambda: kv_bytes_per_token(smollm2_135m_config(), "float32") // 2,
                          Text(en="float32 elements are 4 bytes, and both K and V count",
                               ko="float32 원소는 4바이트이고, K와 V를 둘 다 셉니다")),)),
)
