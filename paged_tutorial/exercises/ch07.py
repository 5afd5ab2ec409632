"""Chapter 07 exercises: the whole model through two slots, and what its cache costs.

Expected answers come from the package: a real ``Engine`` run on a tiny random model, and
``CacheConfig`` for the article's Llama-3.2-1B configuration and the SmolLM2-135M shapes.
"""

from __future__ import annotations

from ..config import CacheConfig, ModelConfig, llama_3_2_1b_config, smollm2_135m_config
from . import as_int, tiny_engine


def kv_bytes_per_token(model: ModelConfig, dtype: str) -> int:
    """Bytes of K and V one token occupies in the cache, all layers together."""
    cache = CacheConfig.for_model(model, dtype=dtype)
    return cache.BLOCK_BYTES // cache.BLOCK_SIZE * model.num_hidden_layers


def steps_for_requests(new_tokens=(10, 30, 20), max_slots: int = 2) -> int:
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


def check_steps(answer):
    want = steps_for_requests()
    got = as_int(answer)
    if got == want:
        return True, (f"{want} steps: 1 prefill (r0, r1) + 9 decodes until r0 is done, 1 prefill "
                      "for r2 in which r1 waits, then 20 decodes for r1 (r2 needs 19 of them)")
    if got == want - 1:
        return False, ("a step that prefills a newly admitted request decodes nobody else: "
                       "the running request waits one step")
    if got == 60:
        return False, "that is one request at a time; two slots decode together"
    return False, "walk the steps: a prefill gives each admitted request its first token"


def sequences_in_article_cache() -> int:
    model = llama_3_2_1b_config()
    cache = CacheConfig.for_model(model, max_seq_len=2048)      # 2 GiB, bf16: the article's
    return cache.NUM_BLOCKS // (cache.MAX_BLOCKS_PER_SEQ * model.num_hidden_layers)


def check_sequences(answer):
    want = sequences_in_article_cache()
    got = as_int(answer)
    if got == want:
        return True, (f"{want}: 65536 blocks / (128 logical blocks x 16 layers); the article's "
                      "engine serves only 2 slots, so most of its 2 GiB waits unused")
    if got == 512:
        return False, "a full sequence needs 128 blocks in every one of the 16 layers"
    return False, "NUM_BLOCKS / (MAX_BLOCKS_PER_SEQ x N_LAYERS)"


def check_smollm2_bytes_per_token(answer):
    want = kv_bytes_per_token(smollm2_135m_config(), "float32")
    got = as_int(answer)
    if got == want:
        return True, (f"{want:,} B = 30 layers x 2 x 192 x 4 B: the small model in float32 "
                      "costs more cache per token than Llama-3.2-1B in bf16")
    if got == want // 2:
        return False, "float32 elements are 4 bytes, and both K and V count"
    return False, "layers x 2 (K and V) x KV_DIM (3 KV heads x 64) x 4 bytes"


CHECKS = {
    "07.steps_for_three_requests": check_steps,
    "07.sequences_in_2gib": check_sequences,
    "07.smollm2_kv_bytes_per_token": check_smollm2_bytes_per_token,
}
