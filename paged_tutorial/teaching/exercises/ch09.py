"""Exercises of notebook 09 (beyond the article): prefix caching.  Right answers come from the
package: a real ``PrefixCachingKVCache`` and a real ``Engine`` with ``prefix_caching=True`` on a
tiny random model."""

from __future__ import annotations

from functools import lru_cache

from paged_tutorial.config import CacheConfig
from paged_tutorial.teaching.exercises.answers import Integer
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import tiny_engine

SECOND = dict(prompt_len=64)
SAVED = dict(requests=8, shared=100, own=20, num_layers=30)


@lru_cache(maxsize=None)
def second_prefill_tokens(prompt_len: int = SECOND["prompt_len"]) -> int:
    """The same prompt served twice, one request after the other, on an engine with prefix
    caching: the tokens the second prefill computes."""
    engine = tiny_engine(max_slots=1, prefix_caching=True)
    prompt = [(7 * i) % 60 + 1 for i in range(prompt_len)]
    engine.generate([prompt], max_new_tokens=2)
    steps = []
    engine.generate([prompt], max_new_tokens=2, on_step=steps.append)
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
        "With prefix caching, the same {prompt_len}-token prompt is served twice, one request "
        "after the other.  How many tokens does the second prefill compute?".format(**SECOND),
        Integer(), second_prefill_tokens,
        explain=lambda e: (f"{e}: the first three blocks come from the cache (they stayed there "
                           "after the first request finished), but the fourth would hold the "
                           "last token, whose logits give the first new token; only whole "
                           "blocks are shared, so all of it is computed again"),
        hint="which blocks may be shared, and what must be left to compute?",
        mistakes=(
            Mistake(lambda: 1, "only whole blocks are shared: the last token's block is "
                    "computed again in full"),
            Mistake(lambda: 0, "the first generated token comes from the logits of the last "
                    "token computed: at least one token must be computed"),
            Mistake(lambda: SECOND["prompt_len"], "the first request's blocks are not freed "
                    "when it finishes: they stay cached, findable by their hash"),
        )),
    Exercise(
        "09.blocks_saved",
        "{requests} requests whose prompts share their first {shared} tokens (then {own} tokens "
        "of their own) are all running on a {num_layers}-layer model, BLOCK_SIZE 16.  How many "
        "physical blocks does prefix caching save?".format(**SAVED),
        Integer(), blocks_saved,
        explain=lambda e: (f"{e}: the 6 full blocks of the shared 100 tokens are held once "
                           "instead of 8 times, in each of the 30 layers: 7 x 6 x 30; the 7th "
                           "block (tokens 96-111) mixes shared and own tokens, so each request "
                           "has its own"),
        hint="count the full blocks of the shared part, the copies saved, and the layers",
        mistakes=(
            Mistake(lambda: 7 * 7 * 30, "the block of tokens 96-111 is not shared: it holds "
                    "each request's own tokens too"),
            Mistake(lambda: 8 * 6 * 30, "one copy of the shared blocks is still needed"),
            Mistake(lambda: 7 * 6, "every layer has its own blocks: multiply by the layers"),
        )),
)
