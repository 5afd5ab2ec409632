"""Puzzle ``02.locate``: logical -> physical through the block table, on the cache's writer
side (the article's prefill and decode scatters, ``main.cpp:265`` and ``858``).

The reader's function says where a token of (slot, layer, position) goes: which physical block
and which row of it.  The grader runs a real engine with two slots and three layers, from a
shuffled free list (so physical blocks are not the logical ones), whose backend writes every
token's K and V where the reader's function says (``LocatingWriterBackend``) into a cache
filled with NaN; the decode attention reads them through the table.  The logits must equal a
stock engine's, bit for bit.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from paged_tutorial.backends.paged_reads import cache_view
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.teaching.language import Text, particle, say, term
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Wrong, host_call, need_int
from paged_tutorial.teaching.harness.engine_harness import engine_with_cache, run, tiny_model

REQUESTS = ((tuple(range(3, 23)), 3), (tuple(range(30, 37)), 3))   # 20 and 7 prompt tokens
ENGINE = dict(device="cpu", max_slots=2, max_seq_len=32)
NAMES = ["block_table", "slot", "layer", "position", "BLOCK_SIZE"]


class LocatingWriterBackend(TorchBackend):
    """The torch backend, except that ``write_kv`` asks ``locate`` where each token goes and
    records every (layer, slot, position, physical block, row) it wrote."""

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
            self.writes.append((layer, slot, pos, phys, row))
            view[phys, 0, row] = k[i].reshape(-1).to(view.dtype)
            view[phys, 1, row] = v[i].reshape(-1).to(view.dtype)


def draw_run() -> tuple[int, int, int]:
    """(layers, free-list shuffle seed, BLOCK_SIZE) of one check, drawn afresh: the table's
    layout, the blocks each token gets and the tokens per block (5 or 6: never the engine's
    16 and never a power of two, so the 20-token prompt spans four blocks, the last one partly
    filled at 6, and no shift or mask stands in for the division) change from check to check,
    so no remembered block and no constant stands in for the table lookup."""
    rng, _ = shapes.fresh_rng()
    return (shapes.pick(rng, (2, 3, 4)), int(rng.integers(1, 2 ** 31)),
            shapes.pick(rng, BLOCK_SIZES))


#: tokens per block 02.locate draws from (the engine's 16 never: the prompts would fit in two;
#: no power of two: a shift and a mask would pass for divmod)
BLOCK_SIZES = (5, 6)


@lru_cache(maxsize=4)
def stock_run(num_layers: int, shuffle: int, block_size: int = 16):
    engine = engine_with_cache(tiny_model(num_layers), backend="torch", block_size=block_size,
                               **ENGINE)
    return engine.cache_config, run(engine, REQUESTS, shuffle_seed=shuffle)


def explain(backend: LocatingWriterBackend, table: np.ndarray, bs: int) -> tuple[str, list]:
    """The first write that went elsewhere than the decode kernel looks, and every write
    classified for the figure."""
    message, rows = "", []
    for layer, slot, pos, phys, row in backend.writes:
        want = (int(table[slot, layer, pos // bs]), pos % bs)
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
    num_layers, shuffle, block_size = draw_run()
    config, stock = stock_run(num_layers, shuffle, block_size)
    backend = LocatingWriterBackend(fn)
    engine = engine_with_cache(tiny_model(num_layers), backend=backend, block_size=block_size,
                               **ENGINE)
    mine, diff = run(engine, REQUESTS, shuffle_seed=shuffle, poison=True, against=stock)

    if diff is not None:
        step = mine[diff[0]]
        message, rows = explain(backend, step.block_table, config.BLOCK_SIZE)

        def draw():
            from paged_tutorial.teaching.chapters.ch01_block_layout.layout import plot_placements

            return plot_placements(config, rows)
        raise Wrong(say(en=f"[{num_layers} layers, BLOCK_SIZE {block_size}, free list shuffled "
                           f"with seed {shuffle}] the "
                           f"engine's {step.kind} step {step.index} differs from a stock "
                           f"engine's: {message}",
                        ko=f"[레이어 {num_layers}개, BLOCK_SIZE {block_size}, 시드 "
                           f"{particle(shuffle, '으로/로')} 섞은 빈 블록 목록] 엔진의 "
                           f"{term(step.kind)} 스텝 {particle(step.index, '이/가')} 표준 엔진과 다릅니다: "
                           f"{message}"), figure=draw)
    return say(en=f"2 slots x {num_layers} layers, BLOCK_SIZE {block_size}, from a free list "
                  "shuffled afresh: every token "
                  "written where the decode kernel reads it; logits bit-identical to a stock "
                  "engine's",
               ko=f"슬롯 2개 x 레이어 {num_layers}개, BLOCK_SIZE {block_size}, 새로 섞은 빈 블록 "
                  "목록에서: 모든 토큰을 디코드 "
                  "커널이 읽는 자리에 썼고, 로짓이 표준 엔진과 비트 단위로 같습니다")


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
        Text(en="a real Engine (torch backend, 2 slots x 2-4 layers, BLOCK_SIZE 4 or 8, a free "
                "list shuffled afresh): your function places every token, the decode attention "
                "reads through the table",
             ko="실제 Engine (torch 백엔드, 슬롯 2개 x 레이어 2-4개, BLOCK_SIZE 4 또는 8, 새로 섞은 빈 "
                "블록 목록): 직접 "
                "쓴 함수가 모든 토큰을 놓고, 디코드 어텐션이 테이블을 거쳐 읽습니다"),
        "main.cpp:265, 858", grade),
)
