"""Exercises of notebook 00 (why a paged KV cache): bytes per token, per decode step, and the
memory a contiguous per-sequence buffer leaves unused.  Right answers come from
``CacheConfig`` (Llama-3.2-1B in bf16, the article's cache)."""

from __future__ import annotations

from paged_tutorial.teaching.exercises.answers import Integer, Numbers
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import article_cache_config


def token_bytes(c) -> int:
    """K and V of one token, all layers."""
    return c.num_layers * 2 * c.KV_DIM * c.ITEMSIZE


def _c():
    return article_cache_config()


DECODE_SEQ_LEN = 1000
WASTE_SEQ_LEN = 100

EXERCISES = (
    Exercise(
        "00.kv_bytes_per_token",
        "Bytes of K and V that one token occupies in the article's cache, all layers together.",
        Integer(), lambda: token_bytes(_c()),
        explain=lambda e: (f"{e} B = {_c().num_layers} layers x (K + V) x {_c().KV_DIM} x "
                           f"{_c().ITEMSIZE} B"),
        hint="layers x 2 (K and V) x KV_DIM x bytes per element",
        mistakes=(
            Mistake(lambda: token_bytes(_c()) // 2, "count both K and V"),
            Mistake(lambda: 2 * _c().KV_DIM * _c().ITEMSIZE,
                    "that is one layer: every layer keeps its own K and V"),
            Mistake(lambda: token_bytes(_c()) // _c().ITEMSIZE,
                    "that counts elements: a bf16 element takes 2 bytes"),
        )),
    Exercise(
        "00.decode_read_bytes",
        f"Bytes one decode step reads from the cache for a sequence of {DECODE_SEQ_LEN} tokens "
        "(the token just written included).",
        Integer(), lambda: DECODE_SEQ_LEN * token_bytes(_c()),
        explain=lambda e: (f"{e} B: every cached token's K and V, in every layer, once per "
                           "step"),
        hint="seq_len x (bytes of one token's K and V over all layers)",
        mistakes=(
            Mistake(lambda: (DECODE_SEQ_LEN - 1) * token_bytes(_c()),
                    "seq_len already counts the token just written, and it is read too"),
            Mistake(lambda: DECODE_SEQ_LEN * token_bytes(_c()) // 2,
                    "the step reads both K and V"),
        )),
    Exercise(
        "00.contiguous_vs_paged_waste",
        f"Bytes reserved but unused for a {WASTE_SEQ_LEN}-token sequence: (contiguous buffer of "
        "max_seq_len tokens, paged 16-token blocks).",
        Numbers(Integer(), 2, ("contiguous waste", "paged waste")),
        lambda: ((_c().max_seq_len - WASTE_SEQ_LEN) * token_bytes(_c()),
                 (_c().blocks_for_tokens(WASTE_SEQ_LEN) * _c().BLOCK_SIZE - WASTE_SEQ_LEN)
                 * token_bytes(_c())),
        explain=lambda e: f"(contiguous waste, paged waste) = {e}",
        hint=("a contiguous buffer reserves max_seq_len tokens; paged blocks round up to a "
              "multiple of BLOCK_SIZE tokens (per layer); multiply tokens by a token's bytes"),
        mistakes=(
            Mistake(lambda: (_c().max_seq_len * token_bytes(_c()),
                             _c().blocks_for_tokens(WASTE_SEQ_LEN) * _c().BLOCK_SIZE
                             * token_bytes(_c())),
                    "those are the bytes reserved; the question asks for the unused part"),
        )),
)
