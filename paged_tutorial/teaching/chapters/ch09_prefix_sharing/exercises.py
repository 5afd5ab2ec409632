"""Exercises of notebook 09 (beyond the article): prefix caching.  Right answers come from the
package: a real ``PrefixCachingKVCache`` and a real ``Engine`` with ``prefix_caching=True`` on a
tiny random model."""

from __future__ import annotations

from functools import lru_cache

from paged_tutorial.config import CacheConfig
from paged_tutorial.teaching.exercises.answers import Integer
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import tiny_engine
from paged_tutorial.teaching.language import Text, say

SECOND = dict(prompt_len=64)
SAVED = dict(requests=8, shared=100, own=20, num_layers=30)


@lru_cache(maxsize=None)
def second_prefill_tokens(prompt_len: int = SECOND["prompt_len"]) -> int:
    """The same prompt served twice, one request after the other, on an engine with prefix
    caching: the tokens the second prefill computes."""
    engine = tiny_engine(max_slots=1, prefix_caching=True)
    prompt = [(7 * i) % 60 + 1 for i in range(prompt_len)]
    engine.generate([prompt], max_tokens=2)
    steps = []
    engine.generate([prompt], max_tokens=2, on_step=steps.append)
    return sum(s.num_tokens for s in steps if s.kind == "prefill")


@lru_cache(maxsize=None)
def blocks_saved(requests: int = SAVED["requests"], shared: int = SAVED["shared"],
                 own: int = SAVED["own"], num_layers: int = SAVED["num_layers"]) -> int:
    """Physical blocks in use when ``requests`` prompts that share their first ``shared``
    tokens (then ``own`` tokens each) are all admitted: without prefix caching minus with."""
    from paged_tutorial.cache.paged_cache import PagedKVCache
    from paged_tutorial.cache.prefix_cache import PrefixCachingKVCache
    from paged_tutorial.engine.request import Request
    from paged_tutorial.engine.sampling_params import SamplingParams

    n = shared + own
    config = CacheConfig(num_layers=num_layers, num_kv_heads=1, head_dim=8, dtype="float32",
                         kv_cache_bytes=requests * 8 * num_layers * 2 * 16 * 8 * 4,
                         max_slots=requests, max_seq_len=128)
    prompts = [[5] * shared + [100 + r] * own for r in range(requests)]
    used = []
    for cache in (PagedKVCache(config), PrefixCachingKVCache(config)):
        for slot, prompt in enumerate(prompts):
            cache.allocator.allocate_prompt(slot, Request(slot, prompt, SamplingParams()))
            cache.allocator.commit_step()      # each admitted after the one before ran
        used.append(int((cache.reference_counts() > 0).sum()))
    return used[0] - used[1]


EXERCISES = (
    Exercise(
        "09.second_prefill_tokens",
        Text(en="With prefix caching, the same {prompt_len}-token prompt is served twice, one "
                "request after the other.  How many tokens does the second prefill "
                "compute?".format(**SECOND),
             ko="프리픽스 캐싱을 켜고, 같은 {prompt_len}토큰 프롬프트를 요청 두 개로 차례로 "
                "처리합니다.  두 번째 프리필은 토큰 몇 개를 계산할까요?".format(**SECOND)),
        Integer(), second_prefill_tokens,
        explain=lambda e: say(
            en=f"{e}: the first three blocks come from the cache (they stayed there after the "
               "first request finished), but the fourth would hold the last token, whose logits "
               "give the first new token; only whole blocks are shared, so all of it is "
               "computed again",
            ko=f"{e}: 앞의 세 블록은 캐시에서 옵니다 (첫 요청이 끝난 뒤에도 남아 있었습니다). "
               "하지만 네 번째 블록에는 마지막 토큰이 있고, 그 로짓이 첫 새 토큰을 줍니다; "
               "블록은 통째로만 공유하므로 네 번째 블록 전체를 다시 계산합니다"),
        hint=Text(en="which blocks may be shared, and what must be left to compute?",
                  ko="어느 블록을 공유할 수 있고, 무엇은 계산하도록 남겨야 할까요?"),
        mistakes=(
            Mistake(lambda: 1, Text(
                en="only whole blocks are shared: the last token's block is computed again in "
                   "full",
                ko="블록은 통째로만 공유합니다: 마지막 토큰의 블록은 전부 다시 계산합니다")),
            Mistake(lambda: 0, Text(
                en="the first generated token comes from the logits of the last token "
                   "computed: at least one token must be computed",
                ko="첫 생성 토큰은 마지막으로 계산한 토큰의 로짓에서 나옵니다: 적어도 토큰 "
                   "하나는 계산해야 합니다")),
            Mistake(lambda: SECOND["prompt_len"], Text(
                en="the first request's blocks are not freed when it finishes: they stay "
                   "cached, findable by their hash",
                ko="첫 요청이 끝나도 그 블록은 비워지지 않습니다: 해시로 찾을 수 있게 캐시에 "
                   "남습니다")),
        )),
    Exercise(
        "09.blocks_saved",
        Text(en="{requests} requests whose prompts share their first {shared} tokens (then {own} "
                "tokens of their own) are all running on a {num_layers}-layer model, BLOCK_SIZE "
                "16.  How many physical blocks does prefix caching save?".format(**SAVED),
             ko="프롬프트의 앞 {shared}토큰이 같고 (그 뒤 {own}토큰은 각자의 것인) 요청 "
                "{requests}개가 레이어 {num_layers}개 모델에서 함께 돕니다, BLOCK_SIZE 16.  "
                "프리픽스 캐싱이 아끼는 물리 블록은 몇 개일까요?".format(**SAVED)),
        Integer(), blocks_saved,
        explain=lambda e: say(
            en=f"{e}: the 6 full blocks of the shared 100 tokens are held once instead of 8 "
               "times, in each of the 30 layers: 7 x 6 x 30; the 7th block (tokens 96-111) mixes "
               "shared and own tokens, so each request has its own",
            ko=f"{e}: 공유하는 100토큰의 꽉 찬 블록 6개를 8번이 아니라 한 번만, 30개 레이어 "
               "각각에 둡니다: 7 x 6 x 30; 7번째 블록 (토큰 96-111)은 공유 토큰과 자기 토큰이 "
               "섞여 있어 요청마다 따로 가집니다"),
        hint=Text(en="count the full blocks of the shared part, the copies saved, and the layers",
                  ko="공유 부분의 꽉 찬 블록 수, 아끼는 사본 수, 레이어 수를 세세요"),
        mistakes=(
            Mistake(lambda: 7 * 7 * 30, Text(
                en="the block of tokens 96-111 is not shared: it holds each request's own "
                   "tokens too",
                ko="토큰 96-111의 블록은 공유되지 않습니다: 요청마다 자기 토큰도 담고 있습니다")),
            Mistake(lambda: 8 * 6 * 30, Text(
                en="one copy of the shared blocks is still needed",
                ko="공유 블록도 사본 하나는 여전히 필요합니다")),
            Mistake(lambda: 7 * 6, Text(
                en="every layer has its own blocks: multiply by the layers",
                ko="레이어마다 자기 블록이 있습니다: 레이어 수를 곱하세요")),
        )),
)
