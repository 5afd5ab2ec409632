"""Puzzle ``02.locate``: logical -> physical through the block table, on the cache's writer
side (the article's prefill and decode scatters, ``main.cpp:265`` and ``858``).

The reader's function says where a token of (slot, layer, position) goes: which physical block
and which row of it.  The grader runs a real engine of a drawn table layout (``draw_run``), from a
shuffled free list (so physical blocks are not the logical ones), with more requests than slots
(a finished request's slot is reused with other blocks), whose backend writes every
token's K and V where the reader's function says (``LocatingWriterBackend``) into a cache
filled with NaN; the decode attention reads them through the table.  The logits must equal a
stock engine's, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from paged_tutorial.backends.paged_reads import cache_view
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.teaching.language import Text, particle, say, term
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Wrong, host_call, need_int
from paged_tutorial.teaching.harness.engine_harness import TINY, engine_with_cache, run, tiny_model

#: the longest sequence a drawn request makes (at most 20 prompt tokens and 4 new ones)
MAX_SEQ_LEN = 32
NAMES = ["block_table", "slot", "layer", "position", "BLOCK_SIZE"]


class LocatingWriterBackend(TorchBackend):
    """The torch backend, except that ``write_kv`` asks ``locate`` where each token goes and
    records every (layer, slot, position, physical block, row) it wrote, with the physical
    block the table held for that position at the time."""

    def __init__(self, locate):
        super().__init__("cpu")
        self.locate = locate
        self.writes: list[tuple] = []

    def write_kv(self, cache, k, v, block_table, layer, slots, positions):
        c = cache.config
        view = cache_view(cache)                       # [NUM_BLOCKS, K/V, BLOCK_SIZE, KV_DIM]
        table = block_table.cpu().numpy().copy()       # the reader's function gets a copy
        for i, (slot, pos) in enumerate(zip(slots.tolist(), positions.tolist())):
            args = (table, slot, layer, pos, c.BLOCK_SIZE)
            call = f"locate(block_table, slot={slot}, layer={layer}, position={pos}, " \
                   f"BLOCK_SIZE={c.BLOCK_SIZE})"
            got = host_call(self.locate, args, NAMES)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Wrong(say(en=f"{call} returned {got!r}; it must return two integers: "
                                   "(physical_block, row)",
                                ko=f"{particle(call, '이/가')} {particle(repr(got), '을/를')} 돌려줬습니다; 정수 두 개 "
                                   "(physical_block, row)를 돌려줘야 합니다"))
            phys = need_int(got[0], say(en="the physical block", ko="물리 블록"), call)
            row = need_int(got[1], say(en="the row", ko="행"), call)
            if not 0 <= phys < c.NUM_BLOCKS or not 0 <= row < c.BLOCK_SIZE:
                raise Wrong(say(en=f"{call} = ({phys}, {row}): outside the cache "
                                   f"({c.NUM_BLOCKS} physical blocks of {c.BLOCK_SIZE} rows); the "
                                   "write would land in someone else's memory or past the buffer",
                                ko=f"{call} = ({phys}, {row}): 캐시 밖입니다 (물리 블록 "
                                   f"{c.NUM_BLOCKS}개, 블록당 {c.BLOCK_SIZE}행); 다른 요청의 "
                                   "메모리나 버퍼 너머에 쓰게 됩니다"))
            self.writes.append((layer, slot, pos, phys, row,
                                int(table[slot, layer, pos // c.BLOCK_SIZE])))
            view[phys, 0, row] = k[i].reshape(-1).to(view.dtype)
            view[phys, 1, row] = v[i].reshape(-1).to(view.dtype)


@dataclass(frozen=True)
class Run:
    """One check's engine run, drawn afresh: its table layout (slots, layers, tokens per block),
    the free list's shuffle and the request stream."""

    slots: int
    layers: int
    shuffle: int
    block_size: int
    requests: tuple                    # ((prompt ids, max_tokens), ...) in arrival order

    def describe(self) -> str:
        lens = ", ".join(f"{len(p)}+{m}" for p, m in self.requests)
        return say(en=f"{self.slots} slots x {self.layers} layers, BLOCK_SIZE {self.block_size}, "
                      f"{len(self.requests)} requests (prompt + new tokens: {lens}), free list "
                      f"shuffled with seed {self.shuffle}",
                   ko=f"슬롯 {self.slots}개 x 레이어 {self.layers}개, BLOCK_SIZE {self.block_size}, "
                      f"요청 {len(self.requests)}개 (프롬프트 + 새 토큰: {lens}), 시드 "
                      f"{particle(self.shuffle, '으로/로')} 섞은 빈 블록 목록")


def draw_run() -> Run:
    """The table layout, the free list and the requests of one check, drawn afresh: 3-5 slots
    and 5-7 layers (so a slot or layer taken modulo a smaller count lands in another's blocks),
    tokens per block 5 or 6 (never the engine's 16 and never a power of two, so a prompt spans
    several blocks, the last one partly filled, and no shift or mask stands in for the
    division), a free list shuffled afresh (physical blocks are not the logical ones), and two
    or three requests more than slots, of drawn lengths, that wait for a slot: a finished
    request's slot is reused by another request with other blocks, so no remembered block and
    no constant stands in for the table lookup."""
    rng, _ = shapes.fresh_rng()
    slots = shapes.pick(rng, SLOT_COUNTS)
    requests = tuple((tuple(int(t) for t in rng.integers(3, TINY["vocab_size"],
                                                           int(rng.integers(2, 21)))),
                      int(rng.integers(1, 5)))
                     for _ in range(slots + int(rng.integers(2, 4))))
    return Run(slots, shapes.pick(rng, LAYER_COUNTS), int(rng.integers(1, 2 ** 31)),
               shapes.pick(rng, BLOCK_SIZES), requests)


#: tokens per block 02.locate draws from (the engine's 16 never: the prompts would fit in two;
#: no power of two: a shift and a mask would pass for divmod)
BLOCK_SIZES = (5, 6)
#: slots and layers 02.locate draws from: more than 2 slots and 4 layers
SLOT_COUNTS = (3, 4, 5)
LAYER_COUNTS = (5, 6, 7)


def engine_kwargs(drawn: Run) -> dict:
    return dict(device="cpu", max_slots=drawn.slots, max_seq_len=MAX_SEQ_LEN,
                block_size=drawn.block_size)


@lru_cache(maxsize=4)
def stock_run(drawn: Run):
    engine = engine_with_cache(tiny_model(drawn.layers), backend="torch", **engine_kwargs(drawn))
    return engine.cache_config, run(engine, drawn.requests, shuffle_seed=drawn.shuffle)


def explain(backend: LocatingWriterBackend, bs: int) -> tuple[str, list]:
    """The first write that went elsewhere than the decode kernel looks (through the table as
    it was at that write), and every write classified for the figure."""
    message, rows = "", []
    for layer, slot, pos, phys, row, entry_value in backend.writes:
        want = (entry_value, pos % bs)
        rows.append((layer, slot, pos, (phys, row), want))
        if not message and (phys, row) != want:
            entry = f"block_table[{slot}, {layer}, {pos // bs}] = {want[0]}"
            message = say(en=f"layer {layer}, slot {slot}, position {pos} was written to "
                             f"physical block {phys}, row {row}; the decode kernel looks for it "
                             f"in {entry}, row {want[1]}",
                          ko=f"레이어 {layer}, 슬롯 {slot}, 위치 {particle(pos, '을/를')} 물리 블록 {phys}의 "
                             f"행 {row}에 썼는데, 디코드 커널은 {entry}의 행 {want[1]}에서 "
                             "찾습니다")
    return message or say(en="every write went where the kernel reads",
                          ko="모든 쓰기가 커널이 읽는 자리로 갔습니다"), rows


def grade(fn) -> str:
    drawn = draw_run()
    config, stock = stock_run(drawn)
    backend = LocatingWriterBackend(fn)
    engine = engine_with_cache(tiny_model(drawn.layers), backend=backend, **engine_kwargs(drawn))
    try:
        mine, diff = run(engine, drawn.requests, shuffle_seed=drawn.shuffle, poison=True,
                         against=stock)
    except Wrong as wrong:                 # refused during a step: name the drawn run too
        raise Wrong(f"[{drawn.describe()}] {wrong.message}", wrong.figure) from None

    if diff is not None:
        step = mine[diff[0]]
        message, rows = explain(backend, config.BLOCK_SIZE)

        def draw():
            from paged_tutorial.teaching.chapters.ch01_block_layout.layout import plot_placements

            return plot_placements(config, rows)
        raise Wrong(say(en=f"[{drawn.describe()}] the engine's {step.kind} step {step.index} "
                           f"differs from a stock engine's: {message}",
                        ko=f"[{drawn.describe()}] 엔진의 {term(step.kind)} 스텝 "
                           f"{particle(step.index, '이/가')} 표준 엔진과 다릅니다: {message}"),
                    figure=draw)
    return say(en=f"{drawn.describe()}: every token written where the decode kernel reads it, "
                  "also in slots reused by a waiting request; logits bit-identical to a stock "
                  "engine's",
               ko=f"{drawn.describe()}: 모든 토큰을 디코드 커널이 읽는 자리에 썼고, 기다리던 요청이 "
                  "다시 쓰는 슬롯에서도 그렇습니다; 로짓이 표준 엔진과 비트 단위로 같습니다")


PUZZLES = (
    Puzzle(
        "02.locate", Text(en="logical -> physical block through the table",
                          ko="테이블을 거쳐 논리 블록 -> 물리 블록"),
        "def locate(block_table, slot, layer, position, BLOCK_SIZE):",
        Text(en="Return (physical_block, row): where the K and V of the token at `position` of\n"
                "the sequence in cache slot `slot` go, in layer `layer`.  block_table is the\n"
                "engine's table, a NumPy array indexed [slot, layer, logical block] that holds\n"
                "physical block ids (-1 where none is assigned yet).",
             ko="(physical_block, row)를 돌려줍니다: 캐시 슬롯 `slot`의 시퀀스에서 위치\n"
                "`position` 토큰의 K와 V가 레이어 `layer`에서 들어갈 자리.  block_table은\n"
                "엔진의 테이블로, [슬롯, 레이어, 논리 블록]으로 인덱싱하는 NumPy 배열이며 물리\n"
                "블록 번호를 담습니다 (아직 없으면 -1)."),
        Text(en="A position belongs to one logical block and to one row of it; the table turns "
                "the logical block into a physical one.",
             ko="위치 하나는 논리 블록 하나와 그 안의 행 하나에 속합니다; 테이블이 논리 블록을 물리 "
                "블록으로 바꿉니다."),
        Text(en="a real Engine (torch backend, 3-5 slots x 5-7 layers, BLOCK_SIZE 5 or 6, a free "
                "list shuffled afresh, more requests than slots so that slots are reused): your "
                "function places every token, the decode attention reads through the table",
             ko="실제 Engine (torch 백엔드, 슬롯 3-5개 x 레이어 5-7개, BLOCK_SIZE 5 또는 6, 새로 "
                "섞은 빈 블록 목록, 슬롯보다 많은 요청이라 슬롯을 다시 씀): 직접 "
                "쓴 함수가 모든 토큰을 놓고, 디코드 어텐션이 테이블을 거쳐 읽습니다"),
        "main.cpp:265, 858", grade, on_host=True),
)
