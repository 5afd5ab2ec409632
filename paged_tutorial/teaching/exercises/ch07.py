"""Exercises of notebook 07: the whole model through two slots, and what its cache costs.
Right answers come from the package: a real ``Engine`` run on a tiny random model, and
``CacheConfig`` for the article's Llama-3.2-1B configuration and the SmolLM2-135M shapes."""

from __future__ import annotations

from functools import lru_cache

from paged_tutorial.config import CacheConfig, ModelConfig, llama_3_2_1b_config, smollm2_135m_config
from paged_tutorial.teaching.exercises.answers import Integer
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import tiny_engine

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
        engine.add_request([1, 2, 3], max_new_tokens=n)
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
        "Requests needing {} / {} / {} new tokens (no EOS) queue in that order for 2 slots.  "
        "How many engine steps until all are done?".format(*NEW_TOKENS),
        Integer(), steps_for_requests,
        explain=lambda e: (f"{e} steps: 1 prefill (r0, r1) + 9 decodes until r0 is done, 1 "
                           "prefill for r2 in which r1 waits, then 20 decodes for r1 (r2 needs "
                           "19 of them)"),
        hint="walk the steps: a prefill gives each admitted request its first token",
        mistakes=(
            Mistake(lambda: steps_for_requests() - 1,
                    "a step that prefills a newly admitted request decodes nobody else: the "
                    "running request waits one step"),
            Mistake(lambda: sum(NEW_TOKENS), "that is one request at a time; two slots decode "
                    "together"),
        )),
    Exercise(
        "07.sequences_in_2gib",
        "How many full 2048-token sequences fit in the article's 2 GiB cache at once?",
        Integer(), sequences_in_article_cache,
        explain=lambda e: (f"{e}: 65536 blocks / (128 logical blocks x 16 layers); the article's "
                           "engine serves only 2 slots, so most of its 2 GiB waits unused"),
        hint="NUM_BLOCKS / (MAX_BLOCKS_PER_SEQ x N_LAYERS)",
        mistakes=(Mistake(lambda: 512, "a full sequence needs 128 blocks in every one of the 16 "
                          "layers"),)),
    Exercise(
        "07.smollm2_kv_bytes_per_token",
        "Bytes of K and V per token, all layers, for SmolLM2-135M stored in float32.",
        Integer(), lambda: kv_bytes_per_token(smollm2_135m_config(), "float32"),
        explain=lambda e: (f"{e:,} B = 30 layers x 2 x 192 x 4 B: the small model in float32 "
                           "costs more cache per token than Llama-3.2-1B in bf16"),
        hint="layers x 2 (K and V) x KV_DIM (3 KV heads x 64) x 4 bytes",
        mistakes=(Mistake(lambda: kv_bytes_per_token(smollm2_135m_config(), "float32") // 2,
                          "float32 elements are 4 bytes, and both K and V count"),)),
)
