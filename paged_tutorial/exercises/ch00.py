"""Exercises of notebook 00 (why a paged KV cache): bytes per token, per decode step, and the
memory a contiguous per-sequence buffer leaves unused.  Expected answers come from
``CacheConfig`` (Llama-3.2-1B in bf16, the article's cache)."""

from __future__ import annotations

from .ch01 import article_cache_config, as_int, compare_tuple


def _token_bytes(c) -> int:
    """K and V of one token, all layers."""
    return c.num_layers * 2 * c.KV_DIM * c.ITEMSIZE


def _kv_bytes_per_token(answer):
    c = article_cache_config()
    expected = _token_bytes(c)
    got = as_int(answer)
    if got is None:
        return False, "give one integer (bytes)"
    if got == expected:
        return True, f"{expected} B = {c.num_layers} layers x (K + V) x {c.KV_DIM} x {c.ITEMSIZE} B"
    if got == expected // 2:
        return False, "count both K and V"
    if got == 2 * c.KV_DIM * c.ITEMSIZE:
        return False, "that is one layer: every layer keeps its own K and V"
    return False, "layers x 2 (K and V) x KV_DIM x bytes per element"


def _decode_read_bytes(answer):
    c = article_cache_config()
    seq_len = 1000
    expected = seq_len * _token_bytes(c)
    got = as_int(answer)
    if got is None:
        return False, "give one integer (bytes)"
    if got == expected:
        return True, f"{expected} B: every cached token's K and V, in every layer, once per step"
    if got == (seq_len - 1) * _token_bytes(c):
        return False, "seq_len already counts the token just written, and it is read too"
    return False, "seq_len x (bytes of one token's K and V over all layers)"


def _contiguous_vs_paged_waste(answer):
    c = article_cache_config()
    n = 100
    per_token = _token_bytes(c)
    contiguous = (c.max_seq_len - n) * per_token
    paged = (c.blocks_for_tokens(n) * c.BLOCK_SIZE - n) * per_token
    return compare_tuple(answer, (contiguous, paged), "contiguous waste, paged waste",
                         "a contiguous buffer reserves max_seq_len tokens; paged blocks round "
                         "up to a multiple of BLOCK_SIZE tokens (per layer)")


CHECKS = {
    "00.kv_bytes_per_token": _kv_bytes_per_token,
    "00.decode_read_bytes": _decode_read_bytes,
    "00.contiguous_vs_paged_waste": _contiguous_vs_paged_waste,
}
