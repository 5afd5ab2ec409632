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
from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong, host_call, need_int
from paged_tutorial.teaching.puzzles.engine_harness import engine_with_cache, run, tiny_model

REQUESTS = (((tuple(range(3, 23))), 4),)        # 20 prompt tokens: two blocks, then 3 decodes
NAMES = ["token_in_block", "kv_head", "dim", "is_value", "BLOCK_SIZE", "KV_DIM", "HEAD_DIM",
         "ITEMSIZE"]


def article_offset(c, token, head, dim, is_value) -> int:
    return (token * c.KV_DIM + head * c.head_dim + dim) * c.ITEMSIZE + (c.V_OFFSET if is_value
                                                                          else 0)


def element_label(which: int, token: int, head: int, dim: int) -> str:
    return f"{'KV'[which]} of token {token}, kv head {head}, dim {dim}"


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
                    off = need_int(host_call(fn, args, NAMES), "the offset",
                                   f"kv_byte_offset({call})")
                    if not 0 <= off <= c.BLOCK_BYTES - c.ITEMSIZE:
                        raise Wrong(f"{element_label(which, t, h, d)} lands at byte {off}, outside "
                                    f"its {c.BLOCK_BYTES}-byte block (BLOCK_BYTES): it would "
                                    "overwrite another block", figure=None)
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
                other = owner[b]
                return (f"{element_label(which, t, h, d)} (byte {off}) and "
                        f"{element_label(*other)} overlap: each element takes "
                        f"{c.ITEMSIZE} bytes, so one of them is lost")
            owner[b] = (which, t, h, d)
    for which, t, h, d in np.ndindex(offsets.shape):
        want = article_offset(c, t, h, d, which)
        if offsets[which, t, h, d] != want:
            return (f"{element_label(which, t, h, d)} is written at byte "
                    f"{int(offsets[which, t, h, d])} of its block, but the decode kernel reads it "
                    f"at byte {want}")
    return "the offsets match the article's layout"


ENGINE = dict(device="cpu", max_slots=1, max_seq_len=32)


@lru_cache(maxsize=1)
def stock_run():
    """(cache config, steps) of a stock engine serving REQUESTS."""
    engine = engine_with_cache(tiny_model(), backend="torch", **ENGINE)
    return engine.cache_config, run(engine, REQUESTS)


def grade(fn) -> str:
    config, stock = stock_run()
    offsets = offsets_of(fn, config)
    engine = engine_with_cache(tiny_model(), backend=OffsetWriterBackend(offsets), **ENGINE)
    mine, diff = run(engine, REQUESTS, poison=True, against=stock)

    if diff is not None:
        step = mine[diff[0]]

        def draw():
            from paged_tutorial.teaching.viz.layout import plot_block_layout

            expected = np.zeros_like(offsets)
            for which, t, h, d in np.ndindex(offsets.shape):
                expected[which, t, h, d] = article_offset(config, t, h, d, which)
            return plot_block_layout(config, offsets, expected)
        raise Wrong(f"the engine's {step.kind} step {step.index} differs from a stock engine's "
                    f"(its logits read NaN or misplaced values): {explain(offsets, config)}",
                    figure=draw)
    return (f"a 20-token prompt and 3 decode steps through your layout (bf16, "
            f"{config.num_kv_heads} KV heads x {config.head_dim}): logits bit-identical to a "
            "stock engine's")


PUZZLES = (
    Puzzle(
        "01.kv_offset", "a K/V element's byte offset inside its block",
        "def kv_byte_offset(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM, "
        "ITEMSIZE):",
        "Return the byte offset, from the start of its physical block, of one element: dimension\n"
        "`dim` of kv head `kv_head`'s K vector (is_value False) or V vector (is_value True) for\n"
        "row `token_in_block` of the block.  A block holds BLOCK_SIZE rows of K, then the same\n"
        "rows of V; a row holds the KV_DIM = n_kv_heads x HEAD_DIM elements of one token, head\n"
        "after head; an element takes ITEMSIZE bytes (2 for bf16).",
        "Where does V start?  Count the bytes of all the K rows before it (that is the "
        "article's V_OFFSET).",
        "a real Engine (torch backend, bf16, 2 KV heads): your offsets place K and V, the "
        "decode attention reads them", "main.cpp:866-872 (and kernels.cu:484-485)", grade),
)
