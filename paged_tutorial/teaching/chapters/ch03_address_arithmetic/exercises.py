"""Exercises of notebook 03: logical block -> physical block -> address.  Right answers are
computed from the package (``PagedKVCache``, and ``oracles.kernel_read_trace``, the NumPy
replay of the decode kernel's addressing) for the article's Llama-3.2-1B cache."""

from __future__ import annotations

from paged_tutorial.teaching.exercises.answers import Integer, Numbers
from paged_tutorial.teaching.language import Text, say
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import small_article_cache


def _llama():
    from paged_tutorial.config import llama_3_2_1b_config

    return llama_3_2_1b_config()

FLAT = (1, 3, 5)                  # slot, layer, logical block
V_AT = (3, 5, 2, 10)              # physical block, token in block, kv head, dim


def block_loop(seq_len: int) -> tuple[int, int]:
    """(blocks the kernel reads, tokens it reads from the last one) for ``seq_len``, from the
    NumPy replay of the kernel's loop."""
    from paged_tutorial.teaching.oracles import kernel_read_trace

    cache = small_article_cache()
    trace = kernel_read_trace(cache, layer=0, slot=0, seq_len=seq_len, q_head=0, q_per_kv=4)
    return int(trace.num_blocks), int(trace.tokens_in_block[-1])


def _loop_exercise(seq_len: int, extra: tuple = ()) -> Exercise:
    return Exercise(
        f"03.blocks_for_{seq_len}",
        Text(en=f"The decode kernel runs for a sequence of seq_len = {seq_len}: (how many "
                "logical blocks it reads, how many tokens it reads from the last one).",
             ko=f"디코드 커널이 seq_len = {seq_len}인 시퀀스에 대해 돕니다: (읽는 논리 블록 수, "
                "마지막 블록에서 읽는 토큰 수)."),
        Numbers(Integer(), 2, ("num_blocks", Text(en="tokens in the last block",
                                               ko="마지막 블록의 토큰 수"))),
        lambda: block_loop(seq_len),
        explain=lambda e: say(
            en=f"ceil({seq_len}/16) = {e[0]} blocks; the last one holds "
               f"min({seq_len} - {e[0] - 1}*16, 16) = {e[1]} " + ("token" if e[1] == 1
                                                                  else "tokens"),
            ko=f"ceil({seq_len}/16) = 블록 {e[0]}개; 마지막 블록은 "
               f"min({seq_len} - {e[0] - 1}*16, 16) = {e[1]}개 토큰을 담습니다"),
        hint=Text(en="a block holds 16 tokens and a partly filled one is still read; the last "
                     "block holds what the earlier ones left over, never more than 16",
                  ko="블록 하나는 토큰 16개를 담고, 덜 찬 블록도 읽습니다; 마지막 블록은 앞 "
                     "블록들이 남긴 만큼을 담고, 16개를 넘지 않습니다"),
        mistakes=(
            Mistake(lambda: (seq_len // 16, block_loop(seq_len)[1]),
                    Text(en="seq_len // 16 rounds down: a partly filled block must be read too",
                         ko="seq_len // 16은 내림입니다: 덜 찬 블록도 읽어야 합니다")),
            Mistake(lambda: (seq_len // 16 + 1, block_loop(seq_len)[1]),
                    Text(en="seq_len // 16 + 1 is one too many when seq_len is a multiple of 16",
                         ko="seq_len이 16의 배수이면 seq_len // 16 + 1은 하나가 많습니다")),
            *extra,
        ))


EXERCISES = (
    Exercise(
        "03.flat_index",
        Text(en="Flat block-table index of (slot {}, layer {}, logical block {}) in the "
                "article's table.".format(*FLAT),
             ko="글의 블록 테이블에서 (슬롯 {}, 레이어 {}, 논리 블록 {})의 평평한 "
                "인덱스.".format(*FLAT)),
        Integer(), lambda: small_article_cache().flat_index(*FLAT),
        explain=lambda e: say(
            en=f"{FLAT[0]}*16*128 + {FLAT[1]}*128 + {FLAT[2]} = {e} (of "
               f"{small_article_cache().config.block_table_entries} entries)",
            ko=f"{FLAT[0]}*16*128 + {FLAT[1]}*128 + {FLAT[2]} = {e} (전체 "
               f"{small_article_cache().config.block_table_entries}개 항목 중)"),
        hint=Text(en="three terms: skip the whole slots before this one, then the whole layers "
                     "before this one inside the slot, then the logical block (the article's "
                     "N_LAYERS = 16, MAX_BLOCKS_PER_SEQ = 128)",
                  ko="세 항: 앞선 슬롯 전체를 건너뛰고, 슬롯 안에서 앞선 레이어 전체를 건너뛴 "
                     "다음 논리 블록을 더합니다 (글의 N_LAYERS = 16, "
                     "MAX_BLOCKS_PER_SEQ = 128)")),
    Exercise(
        "03.v_byte_offset",
        Text(en="Byte offset of V for physical block {}, token {} of the block, kv head {}, "
                "dim {} (bf16).".format(*V_AT),
             ko="물리 블록 {}, 블록 안 토큰 {}, KV 헤드 {}, 차원 {}의 V 바이트 오프셋 "
                "(bf16).".format(*V_AT)),
        Integer(), lambda: small_article_cache().v_byte_offset(*V_AT),
        explain=lambda e: say(
            en=f"3*BLOCK_BYTES + V_OFFSET + 5*KV_DIM*2 + 2*64*2 + 10*2 = {e} bytes",
            ko=f"3*BLOCK_BYTES + V_OFFSET + 5*KV_DIM*2 + 2*64*2 + 10*2 = {e}바이트"),
        hint=Text(en="block start + V_OFFSET + token row + head slice + element, all in bytes "
                     "(bf16 = 2)",
                  ko="블록 시작 + V_OFFSET + 토큰 행 + 헤드 구간 + 원소, 모두 바이트 단위 "
                     "(bf16 = 2)"),
        mistakes=(
            Mistake(lambda: small_article_cache().k_byte_offset(*V_AT),
                    Text(en="that is the K address: V lives V_OFFSET bytes further",
                         ko="그것은 K 주소입니다: V는 V_OFFSET 바이트 뒤에 있습니다")),
            Mistake(lambda: small_article_cache().v_byte_offset(*V_AT) // 2,
                    Text(en="that counts elements: the question asks for bytes",
                         ko="그것은 원소 개수입니다: 질문은 바이트를 묻습니다")),
        )),
    _loop_exercise(33),
    _loop_exercise(48, extra=(
        Mistake(lambda: (block_loop(48)[0], 48 % 16),
                Text(en="48 % 16 = 0, but the last block is full: it holds 16 tokens",
                     ko="48 % 16 = 0이지만 마지막 블록은 꽉 차 있습니다: 토큰 16개를 담습니다")),)),
    Exercise(
        "03.gqa_reads",
        Text(en="Llama-3.2-1B has 32 query heads and 8 KV heads.  In one decode step of one "
                "layer, how many thread blocks of the article's kernel read each K element of a "
                "sequence's cache?",
             ko="Llama-3.2-1B는 q 헤드 32개, KV 헤드 8개입니다.  한 레이어의 디코드 한 "
                "스텝에서, 글 커널의 스레드 블록 몇 개가 시퀀스 캐시의 K 원소 하나를 "
                "읽을까요?"),
        Integer(), lambda: _llama().q_per_kv,
        explain=lambda e: say(
            en=f"one block per query head, and 32 / 8 = {e} query heads share each KV head: "
               "every K and V element is read that many times",
            ko=f"q 헤드마다 블록 하나, 그리고 KV 헤드 하나를 q 헤드 32 / 8 = {e}개가 "
               "공유합니다: K·V 원소마다 그만큼 읽힙니다"),
        hint=Text(en="the grid has one thread block per (batch row, query head); which query "
                     "heads read KV head kv_head = q_head // 4?",
                  ko="그리드는 (배치 행, q 헤드)마다 스레드 블록 하나입니다; 어떤 q "
                     "헤드들이 KV 헤드 kv_head = q_head // 4를 읽나요?"),
        mistakes=(
            Mistake(lambda: 1, Text(
                en="one read per element is the fast kernel's grid (one block per KV head), not "
                   "the article's (one block per query head)",
                ko="원소당 한 번 읽기는 패키지의 빠른 커널(fast)의 그리드(KV 헤드마다 블록 하나)입니다. 글의 "
                   "그리드는 q 헤드마다 블록 하나입니다")),
            Mistake(lambda: _llama().num_key_value_heads, Text(
                en="8 is the number of KV heads: count the query heads that share one of them",
                ko="8은 KV 헤드 수입니다: 그중 하나를 공유하는 q 헤드를 세어 보세요")),
            Mistake(lambda: _llama().num_attention_heads, Text(
                en="not every query head reads every KV head: kv_head = q_head // 4",
                ko="모든 q 헤드가 모든 KV 헤드를 읽지는 않습니다: kv_head = q_head // 4")),
        )),
)
