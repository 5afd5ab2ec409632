"""Puzzle ``01.kv_offset``: where one K or V element lives inside a block (the article's section
on what one block holds: K first, V at V_OFFSET; the writer side, ``main.cpp:866-872``).

The reader's function decides, for every element, its byte offset inside the block.  The grader
runs a real engine whose backend *writes* each token's K and V to those bytes
(``OffsetWriterBackend``), into a cache filled with NaN, while the decode attention *reads*
them where the article's layout says they are.  The engine's logits must equal a stock
engine's, bit for bit.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.teaching.language import Text, particle, say, term
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Wrong, host_call, need_int
from paged_tutorial.teaching.harness.engine_harness import engine_with_cache, run

REQUESTS = (((tuple(range(3, 23))), 4),)        # 20 prompt tokens: two blocks, then 3 decodes
NAMES = ["token_in_block", "kv_head", "dim", "is_value", "BLOCK_SIZE", "KV_DIM", "HEAD_DIM",
         "ITEMSIZE"]


def article_offset(c, token, head, dim, is_value) -> int:
    return (token * c.KV_DIM + head * c.head_dim + dim) * c.ITEMSIZE + (c.V_OFFSET if is_value
                                                                          else 0)


def element_label(which: int, token: int, head: int, dim: int) -> str:
    return say(en=f"{'KV'[which]} of token {token}, kv head {head}, dim {dim}",
               ko=f"토큰 {token}, KV 헤드 {head}, 차원 {dim}의 {'KV'[which]}")


def offsets_of(fn, c) -> np.ndarray:
    """The reader's byte offsets [K/V, token, kv head, dim] for cache config ``c``; refuses a
    non-integer or an offset outside the block."""
    out = np.zeros((2, c.BLOCK_SIZE, c.num_kv_heads, c.head_dim), dtype=np.int64)
    for which in (0, 1):
        for t in range(c.BLOCK_SIZE):
            for h in range(c.num_kv_heads):
                for d in range(c.head_dim):
                    args = (t, h, d, bool(which), c.BLOCK_SIZE, c.KV_DIM, c.head_dim, c.ITEMSIZE)
                    call = ", ".join(f"{n}={a}" for n, a in zip(NAMES, args))
                    off = need_int(host_call(fn, args, NAMES),
                                   say(en="the offset", ko="오프셋"), f"kv_byte_offset({call})")
                    if not 0 <= off <= c.BLOCK_BYTES - c.ITEMSIZE:
                        label = element_label(which, t, h, d)
                        raise Wrong(say(
                            en=f"{label} lands at byte {off}, outside its {c.BLOCK_BYTES}-byte "
                               "block (BLOCK_BYTES): it would overwrite another block",
                            ko=f"{particle(label, '이/가')} 바이트 {off}에 놓여 {c.BLOCK_BYTES}바이트짜리 "
                               "블록(BLOCK_BYTES) 밖으로 나갑니다: 다른 블록을 덮어씁니다"),
                            figure=None)
                    out[which, t, h, d] = off
    return out


class OffsetWriterBackend(TorchBackend):
    """The torch backend, except that ``write_kv`` puts every element at
    ``physical_block * BLOCK_BYTES + offsets[K/V, row, kv head, dim]`` (bytes)."""

    def __init__(self, offsets: np.ndarray):
        super().__init__("cpu")
        self.offsets = torch.from_numpy(offsets)

    def write_kv(self, cache, k, v, block_table, layer, slots, positions):
        c = cache.config
        raw = cache.buffer.view(torch.uint8)
        pos = positions.long()
        phys = block_table[slots.long(), layer, pos // c.BLOCK_SIZE].long()
        row = pos % c.BLOCK_SIZE
        n = k.shape[0]
        item = torch.arange(c.ITEMSIZE)
        for which, x in ((0, k), (1, v)):
            src = x.reshape(n, c.KV_DIM).contiguous().view(torch.uint8)       # [n, KV_DIM*item]
            start = phys[:, None] * c.BLOCK_BYTES + self.offsets[which][row].reshape(n, c.KV_DIM)
            raw[(start[..., None] + item).reshape(-1)] = src.reshape(-1)


def explain(offsets: np.ndarray, c) -> str:
    owner = {}
    for which, t, h, d in np.ndindex(offsets.shape):
        off = int(offsets[which, t, h, d])
        for b in range(off, off + c.ITEMSIZE):
            if b in owner:
                here, other = element_label(which, t, h, d), element_label(*owner[b])
                return say(en=f"{here} (byte {off}) and {other} overlap: each element takes "
                              f"{c.ITEMSIZE} bytes, so one of them is lost",
                           ko=f"{particle(f'{here} (바이트 {off})', '과/와')} "
                              f"{particle(other, '이/가')} 겹칩니다: 원소마다 "
                              f"{c.ITEMSIZE}바이트를 차지하므로 하나를 잃습니다")
            owner[b] = (which, t, h, d)
    for which, t, h, d in np.ndindex(offsets.shape):
        want = article_offset(c, t, h, d, which)
        if offsets[which, t, h, d] != want:
            label, got = element_label(which, t, h, d), int(offsets[which, t, h, d])
            return say(en=f"{label} is written at byte {got} of its block, but the decode kernel "
                          f"reads it at byte {want}",
                       ko=f"{particle(label, '을/를')} 블록의 바이트 {got}에 썼는데, 디코드 커널은 바이트 {want}에서 "
                          "읽습니다")
    return say(en="the offsets match the article's layout",
               ko="오프셋이 글의 배치와 같습니다")


ENGINE = dict(device="cpu", max_slots=1, max_seq_len=32)


#: the chapter's engine shape: (dtype, KV heads, head_dim)
CHAPTER_SHAPE = ("bfloat16", 2, 8)


def shapes_to_run() -> list[tuple]:
    """The engine shapes one check runs: the chapter's, then one drawn afresh in float32
    (4-byte elements) with another KV-head count, head_dim and BLOCK_SIZE (6, 12 or 24 tokens
    per block), so that no constant of the first can stand in for BLOCK_SIZE, KV_DIM, HEAD_DIM
    or ITEMSIZE, and no shift can stand in for a product with BLOCK_SIZE."""
    rng, _ = shapes.fresh_rng()
    return [CHAPTER_SHAPE, ("float32", shapes.pick(rng, (1, 3)), shapes.pick(rng, (4, 12, 16)),
                            shapes.pick(rng, DRAWN_BLOCK_SIZES))]


#: tokens per block the drawn shape takes: never the chapter's 16, and never a power of two
#: (the engine takes any block size, so a shift by log2(BLOCK_SIZE) is a wrong answer)
DRAWN_BLOCK_SIZES = (6, 12, 24)


@lru_cache(maxsize=8)
def shaped_model(dtype: str, kv_heads: int, head_dim: int):
    from paged_tutorial.config import ModelConfig
    from paged_tutorial.loading.models import random_model

    config = ModelConfig(num_hidden_layers=2, vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_attention_heads=2 * kv_heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim)
    return random_model(config, dtype=dtype, seed=0)


@lru_cache(maxsize=8)
def stock_run(shape=CHAPTER_SHAPE):
    """(cache config, steps) of a stock engine of ``shape`` serving REQUESTS."""
    engine = engine_with_cache(shaped_model(*shape[:3]), backend="torch",
                               block_size=_block_size(shape), **ENGINE)
    return engine.cache_config, run(engine, REQUESTS)


def grade(fn) -> str:
    for shape in shapes_to_run():
        grade_shape(fn, shape)
    return say(en="a 20-token prompt and 3 decode steps through your layout at two engine shapes "
                  "(bf16 with 2 KV heads x 8, and one drawn afresh in float32): logits "
                  "bit-identical to a stock engine's",
               ko="20토큰 프롬프트와 디코드 스텝 3번을 여러분의 배치로 엔진 모양 두 가지에서 "
                  "돌렸습니다 (bf16에 KV 헤드 2개 x 8, 그리고 float32로 새로 뽑은 모양): 로짓이 "
                  "표준 엔진과 비트 단위로 같습니다")


def _block_size(shape) -> int:
    """A shape's tokens per block: its fourth entry, the engine's default when it has none."""
    from paged_tutorial.config import BLOCK_SIZE_DEFAULT

    return shape[3] if len(shape) > 3 else BLOCK_SIZE_DEFAULT


def grade_shape(fn, shape) -> None:
    config, stock = stock_run(shape)
    bs = _block_size(shape)
    where = say(en=f"[{shape[0]}, {shape[1]} KV head(s) x {shape[2]}, BLOCK_SIZE {bs}] ",
                ko=f"[{shape[0]}, KV 헤드 {shape[1]}개 x {shape[2]}, BLOCK_SIZE {bs}] ")
    try:
        offsets = offsets_of(fn, config)
    except Wrong as wrong:
        raise Wrong(where + wrong.message, figure=wrong.figure) from None
    engine = engine_with_cache(shaped_model(*shape[:3]), backend=OffsetWriterBackend(offsets),
                               block_size=bs, **ENGINE)
    mine, diff = run(engine, REQUESTS, poison=True, against=stock)

    if diff is not None:
        step = mine[diff[0]]

        def draw():
            from paged_tutorial.teaching.chapters.ch01_block_layout.layout import plot_block_layout

            expected = np.zeros_like(offsets)
            for which, t, h, d in np.ndindex(offsets.shape):
                expected[which, t, h, d] = article_offset(config, t, h, d, which)
            return plot_block_layout(config, offsets, expected)
        why = explain(offsets, config)
        raise Wrong(where + say(
            en=f"the engine's {step.kind} step {step.index} differs from a stock engine's (its "
               f"logits read NaN or misplaced values): {why}",
            ko=f"엔진의 {term(step.kind)} 스텝 {particle(step.index, '이/가')} 표준 엔진과 다릅니다 "
               f"(로짓이 NaN이나 엉뚱한 자리의 값을 읽었습니다): {why}"),
            figure=draw)


PUZZLES = (
    Puzzle(
        "01.kv_offset", Text(en="a K/V element's byte offset inside its block",
                             ko="블록 안에서 K/V 원소 하나의 바이트 오프셋"),
        "def kv_byte_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM, "
        "ITEMSIZE):",
        Text(en="Return the byte offset, from the start of its physical block, of one element:\n"
                "dimension `dim` of kv head `kv_head`'s K vector (is_value False) or V vector\n"
                "(is_value True) for row `token_in_block` of the block.  A block holds\n"
                "BLOCK_SIZE rows of K, then the same rows of V; a row holds the KV_DIM =\n"
                "n_kv_heads x HEAD_DIM elements of one token, head after head; an element takes\n"
                "ITEMSIZE bytes (2 for bf16).",
             ko="물리 블록 시작에서 센, 원소 하나의 바이트 오프셋을 돌려줍니다: 블록의 행\n"
                "`token_in_block`에서 KV 헤드 `kv_head`의 K 벡터 (is_value False) 또는 V 벡터\n"
                "(is_value True)의 차원 `dim`.  블록에는 K의 BLOCK_SIZE 행이 먼저, 그 뒤에 같은\n"
                "수의 V 행이 있습니다; 한 행은 토큰 하나의 KV_DIM = n_kv_heads x HEAD_DIM 원소를\n"
                "헤드 순서로 담고, 원소 하나는 ITEMSIZE 바이트입니다 (bf16은 2)."),
        Text(en="Where does V start?  Count the bytes of all the K rows before it (that is the "
                "article's V_OFFSET).",
             ko="V는 어디서 시작할까요?  그 앞에 있는 K 행 전부의 바이트를 세세요 (그것이 글의 "
                "V_OFFSET입니다)."),
        Text(en="a real Engine (torch backend, bf16, 2 KV heads, then a float32 shape drawn "
                "afresh with its own BLOCK_SIZE): your offsets place K and V, the decode "
                "attention reads them",
             ko="실제 Engine (torch 백엔드, bf16, KV 헤드 2개, 이어서 float32로 BLOCK_SIZE와 함께 "
                "새로 뽑은 모양): 직접 쓴 오프셋으로 K와 V를 놓고, 디코드 어텐션이 읽습니다"),
        "main.cpp:866-872, kernels.cu:484-485", grade),
)
