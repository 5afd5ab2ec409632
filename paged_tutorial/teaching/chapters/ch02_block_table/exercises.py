"""Exercises of notebook 02 (the block table's three-term index).  Right answers come from a
``PagedKVCache`` with the article's shapes (2 slots x 16 layers x 128 logical blocks)."""

from __future__ import annotations

import numpy as np

from paged_tutorial.teaching.exercises.answers import Integer, Numbers
from paged_tutorial.teaching.exercises.registry import Exercise, Mistake
from paged_tutorial.teaching.exercises.setups import small_article_cache
from paged_tutorial.teaching.language import Text, particle, say

FLAT = dict(slot=1, layer=5, logical=3)
UNRAVEL_FLAT = 3000
LENGTHS = {0: 100, 1: 20}


def _flat_index():
    return small_article_cache().flat_index(FLAT["slot"], FLAT["layer"], FLAT["logical"])


def _swapped_flat_index():
    c = small_article_cache().config
    return FLAT["layer"] * c.max_slots * c.MAX_BLOCKS_PER_SEQ + FLAT["slot"] * \
        c.MAX_BLOCKS_PER_SEQ + FLAT["logical"]


def _entries_used():
    c = small_article_cache().config
    cache = small_article_cache(
        num_blocks=sum(c.blocks_for_tokens(n) for n in LENGTHS.values()) * c.num_layers)
    for slot, n in LENGTHS.items():
        cache.ensure_capacity(slot, n)
    return int((cache.block_table >= 0).sum())


EXERCISES = (
    Exercise(
        "02.flat_index",
        Text(en="Index into the article's flat block table (2 x 16 x 128 entries) of slot "
                "{slot}, layer {layer}, logical block {logical}.".format(**FLAT),
             ko="글의 평평한 블록 테이블 (2 x 16 x 128 항목)에서 슬롯 {slot}, 레이어 {layer}, "
                "논리 블록 {logical}의 인덱스.".format(**FLAT)),
        Integer(), _flat_index,
        explain=lambda e: (f"{e} = {FLAT['slot']}*16*128 + {FLAT['layer']}*128 + "
                           f"{FLAT['logical']}"),
        hint=Text(en="the table is [slot][layer][logical block], laid out row after row: how "
                     "many entries does one slot span, and one layer of a slot?",
                  ko="테이블은 [슬롯][레이어][논리 블록] 순서로 줄줄이 놓여 있습니다: 슬롯 하나는 "
                     "몇 칸을 차지하고, 슬롯 안의 레이어 하나는 몇 칸을 차지할까요?"),
        mistakes=(
            Mistake(_swapped_flat_index,
                    Text(en="slot and layer swapped: the table is [slot][layer][logical block], "
                            "so the slot's stride is N_LAYERS * MAX_BLOCKS_PER_SEQ",
                         ko="슬롯과 레이어가 바뀌었습니다: 테이블은 [슬롯][레이어][논리 블록] "
                            "이므로 슬롯의 보폭은 N_LAYERS * MAX_BLOCKS_PER_SEQ입니다")),
        )),
    Exercise(
        "02.unravel",
        Text(en=f"Which (slot, layer, logical block) does flat entry {UNRAVEL_FLAT} of the "
                "article's table belong to?",
             ko=f"글의 테이블에서 평평한 항목 {particle(UNRAVEL_FLAT, '은/는')} 어느 (슬롯, 레이어, 논리 블록)의 "
                "것일까요?"),
        Numbers(Integer(), 3, (Text(en="slot", ko="슬롯"), Text(en="layer", ko="레이어"),
                                 Text(en="logical", ko="논리 블록"))),
        lambda: tuple(int(i) for i in np.unravel_index(UNRAVEL_FLAT,
                                                       small_article_cache().block_table.shape)),
        explain=lambda e: f"(slot, layer, logical) = {e}",
        hint=Text(en="divide by N_LAYERS*MAX_BLOCKS_PER_SEQ for the slot, then the rest by "
                     "MAX_BLOCKS_PER_SEQ for the layer; what remains is the logical block",
                  ko="N_LAYERS*MAX_BLOCKS_PER_SEQ로 나누면 슬롯, 나머지를 MAX_BLOCKS_PER_SEQ로 "
                     "나누면 레이어, 남는 것이 논리 블록입니다")),
    Exercise(
        "02.entries_used",
        Text(en="Table entries that hold a physical block when slot 0 caches {0} tokens and "
                "slot 1 caches {1} (article's table).".format(LENGTHS[0], LENGTHS[1]),
             ko="슬롯 0이 토큰 {0}개, 슬롯 1이 토큰 {1}개를 캐시할 때 물리 블록을 가진 테이블 "
                "항목 수 (글의 테이블).".format(LENGTHS[0], LENGTHS[1])),
        Integer(), _entries_used,
        explain=lambda e: say(
            en=f"{e} entries hold a physical block; "
               f"{small_article_cache().config.block_table_entries - e} are -1",
            ko=f"{e}개 항목이 물리 블록을 가집니다; "
               f"{small_article_cache().config.block_table_entries - e}개는 -1입니다"),
        hint=Text(en="per slot: ceil(tokens / BLOCK_SIZE) logical blocks, in each of the 16 "
                     "layers",
                  ko="슬롯마다 ceil(토큰 수 / BLOCK_SIZE)개의 논리 블록, 16개 레이어 각각에"),
        mistakes=(
            Mistake(lambda: sum(small_article_cache().config.blocks_for_tokens(n)
                                for n in LENGTHS.values()),
                    Text(en="every layer owns its own blocks: multiply by N_LAYERS",
                         ko="레이어마다 자기 블록을 가집니다: N_LAYERS를 곱하세요")),
            Mistake(lambda: sum(n // 16 for n in LENGTHS.values()) * 16,
                    Text(en="a partly filled last block is still a block: round the division up",
                         ko="일부만 찬 마지막 블록도 블록입니다: 나눗셈을 올림하세요")),
        )),
)
