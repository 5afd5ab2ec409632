"""Exercises of notebook 00 (why a paged KV cache): bytes per token, per decode step, and the
memory a contiguous per-sequence buffer leaves unused.  Right answers come from
``CacheConfig`` (Llama-3.2-1B in bf16, the article's cache)."""

from __future__ import annotations

from paged_tutorial.teaching.exercises.answers import Integer, Numbers
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import article_cache_config
from paged_tutorial.teaching.language import Text, say


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
        Text(en="Bytes of K and V that one token occupies in the article's cache, all layers "
                "together.",
             ko="글의 캐시에서 토큰 하나의 K와 V가 모든 레이어를 합쳐 차지하는 바이트 수."),
        Integer(), lambda: token_bytes(_c()),
        explain=lambda e: say(
            en=f"{e} B = {_c().num_layers} layers x (K + V) x {_c().KV_DIM} x {_c().ITEMSIZE} B",
            ko=f"{e} B = 레이어 {_c().num_layers}개 x (K + V) x {_c().KV_DIM} x "
               f"{_c().ITEMSIZE} B"),
        hint=Text(en="layers x 2 (K and V) x KV_DIM x bytes per element",
                  ko="레이어 수 x 2 (K와 V) x KV_DIM x 원소당 바이트"),
        mistakes=(
            Mistake(lambda: token_bytes(_c()) // 2,
                    Text(en="count both K and V", ko="K와 V를 둘 다 세세요")),
            Mistake(lambda: 2 * _c().KV_DIM * _c().ITEMSIZE,
                    Text(en="that is one layer: every layer keeps its own K and V",
                         ko="그것은 레이어 하나입니다: 레이어마다 자기 K와 V를 둡니다")),
            Mistake(lambda: token_bytes(_c()) // _c().ITEMSIZE,
                    Text(en="that counts elements: a bf16 element takes 2 bytes",
                         ko="그것은 원소 개수입니다: bf16 원소 하나는 2바이트입니다")),
        )),
    Exercise(
        "00.decode_read_bytes",
        Text(en=f"Bytes one decode step reads from the cache for a sequence of {DECODE_SEQ_LEN} "
                "tokens (the token just written included).",
             ko=f"토큰 {DECODE_SEQ_LEN}개인 시퀀스에서 디코드 한 스텝이 캐시에서 읽는 바이트 수 "
                "(방금 쓴 토큰 포함)."),
        Integer(), lambda: DECODE_SEQ_LEN * token_bytes(_c()),
        explain=lambda e: say(
            en=f"{e} B: every cached token's K and V, in every layer, once per step",
            ko=f"{e} B: 캐시된 모든 토큰의 K와 V를, 모든 레이어에서, 스텝마다 한 번씩"),
        hint=Text(en="seq_len x (bytes of one token's K and V over all layers)",
                  ko="seq_len x (모든 레이어에 걸친 토큰 하나의 K, V 바이트)"),
        mistakes=(
            Mistake(lambda: (DECODE_SEQ_LEN - 1) * token_bytes(_c()),
                    Text(en="seq_len already counts the token just written, and it is read too",
                         ko="seq_len은 방금 쓴 토큰을 이미 세고 있고, 그 토큰도 읽습니다")),
            Mistake(lambda: DECODE_SEQ_LEN * token_bytes(_c()) // 2,
                    Text(en="the step reads both K and V", ko="스텝은 K와 V를 둘 다 읽습니다")),
        )),
    Exercise(
        "00.contiguous_vs_paged_waste",
        Text(en=f"Bytes reserved but unused for a {WASTE_SEQ_LEN}-token sequence: (contiguous "
                "buffer of max_seq_len tokens, paged 16-token blocks).",
             ko=f"토큰 {WASTE_SEQ_LEN}개인 시퀀스에서 잡아 두고 쓰지 않는 바이트: (max_seq_len "
                "토큰짜리 연속 버퍼, 16토큰 블록 페이징)."),
        Numbers(Integer(), 2, (Text(en="contiguous waste", ko="연속 버퍼의 낭비"),
                                 Text(en="paged waste", ko="페이징의 낭비"))),
        lambda: ((_c().max_seq_len - WASTE_SEQ_LEN) * token_bytes(_c()),
                 (_c().blocks_for_tokens(WASTE_SEQ_LEN) * _c().BLOCK_SIZE - WASTE_SEQ_LEN)
                 * token_bytes(_c())),
        explain=lambda e: say(en=f"(contiguous waste, paged waste) = {e}",
                              ko=f"(연속 버퍼의 낭비, 페이징의 낭비) = {e}"),
        hint=Text(en="a contiguous buffer reserves max_seq_len tokens; paged blocks round up to a "
                     "multiple of BLOCK_SIZE tokens (per layer); multiply tokens by a token's "
                     "bytes",
                  ko="연속 버퍼는 max_seq_len 토큰을 잡아 두고, 페이징은 (레이어마다) BLOCK_SIZE의 "
                     "배수로 올림합니다; 토큰 수에 토큰 하나의 바이트를 곱하세요"),
        mistakes=(
            Mistake(lambda: (_c().max_seq_len * token_bytes(_c()),
                             _c().blocks_for_tokens(WASTE_SEQ_LEN) * _c().BLOCK_SIZE
                             * token_bytes(_c())),
                    Text(en="those are the bytes reserved; the question asks for the unused part",
                         ko="그것은 잡아 둔 바이트 전체입니다; 묻는 것은 쓰지 않는 부분입니다")),
        )),
)
