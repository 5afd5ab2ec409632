"""Puzzles ``06.prefill_pops``, ``06.decode_pops``, ``06.release_order``: the free-list rules of
the article's engine (its section on the lifetime of physical blocks): prefill pops a block
for every logical block the prompt needs (``main.cpp:266-272``), decode pops when the token
it writes starts a new block (``main.cpp:859-865``), a finished slot pushes its blocks back
layer by layer, logical block by logical block (``main.cpp:1018-1029``).

The grader runs a real engine whose cache allocates with ``RuleAllocator`` (the article's
``FreeListAllocator`` with its rules replaced), which follows the
reader's rule for one of the three and the article's for the other two, next to a stock
engine, on requests chosen to cross the rules' edges: a 16-token prompt (exactly one block), a
5-token prompt that decodes past position 16, and a third request that waits for a slot and
then takes the blocks the first one gave back.  After every step the two engines' tokens,
block tables and free lists must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Callable

import numpy as np

from paged_tutorial.cache.block_allocator import CacheFullError, FreeListAllocator
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong, host_call, need_int
from paged_tutorial.teaching.puzzles.engine_harness import engine_with_cache, run, tiny_model

REQUESTS = ((tuple(range(3, 19)), 3),        # 16 tokens: exactly one block; decodes 16, 17
            (tuple(range(20, 25)), 14),      # 5 tokens; decodes 5..17, crossing 16
            (tuple(range(30, 50)), 2))       # 20 tokens; waits, then reuses r0's blocks
ENGINE = dict(device="cpu", max_slots=2, max_seq_len=48)
NUM_BLOCKS = 12


def article_prefill_pops(prompt_len, BLOCK_SIZE):
    """The article's prefill (main.cpp:266-272): one block per logical block the prompt
    touches."""
    return (prompt_len + BLOCK_SIZE - 1) // BLOCK_SIZE


def article_decode_pops(position, BLOCK_SIZE):
    """The article's decode (main.cpp:859-865): a new block when the token written is the
    first row of one."""
    return position % BLOCK_SIZE == 0


def article_release_order(block_table, slot):
    """The article's release (main.cpp:1018-1029): layer by layer, logical block by logical
    block, skipping -1."""
    order = []
    for layer in range(block_table.shape[1]):
        for logical in range(block_table.shape[2]):
            if block_table[slot, layer, logical] != -1:
                order.append(int(block_table[slot, layer, logical]))
    return order


@dataclass(frozen=True)
class Rules:
    prefill_pops: Callable
    decode_pops: Callable
    release_order: Callable


ARTICLE_RULES = Rules(article_prefill_pops, article_decode_pops, article_release_order)


class RuleAllocator(FreeListAllocator):
    """The article's allocator with its pops and pushes decided by ``rules``: a slot that owns
    nothing is being prefilled, one that owns blocks is decoding the token at new_len - 1."""

    def __init__(self, config, table, events, rules: Rules):
        super().__init__(config, table, events)
        self.rules = rules

    def ensure_capacity(self, slot: int, new_len: int) -> None:
        c = self.config
        if new_len > c.max_seq_len:
            raise ValueError(f"slot {slot}: {new_len} tokens exceed max_seq_len {c.max_seq_len}")
        prefill = self.blocks_owned(slot) == 0
        if prefill:
            call = f"prefill_pops(prompt_len={new_len}, BLOCK_SIZE={c.BLOCK_SIZE})"
            n = need_int(host_call(self.rules.prefill_pops, (new_len, c.BLOCK_SIZE),
                                   ["prompt_len", "BLOCK_SIZE"]), "the number of blocks", call)
            if not 0 <= n <= c.MAX_BLOCKS_PER_SEQ:
                raise Wrong(f"{call} = {n}: a slot's row of the table has "
                            f"{c.MAX_BLOCKS_PER_SEQ} logical blocks")
            plan = [(layer, logical) for layer in range(c.num_layers) for logical in range(n)]
        else:
            position = new_len - 1
            call = f"decode_pops(position={position}, BLOCK_SIZE={c.BLOCK_SIZE})"
            pops = host_call(self.rules.decode_pops, (position, c.BLOCK_SIZE),
                             ["position", "BLOCK_SIZE"])
            if not isinstance(pops, (bool, np.bool_)):
                raise Wrong(f"{call} returned {pops!r}; it must return True or False")
            logical = position // c.BLOCK_SIZE
            plan = [(layer, logical) for layer in range(c.num_layers)] if pops else []
            for layer, lb in plan:
                if self.table.entries[slot, layer, lb] != -1:
                    raise Wrong(f"{call} is True, but position {position} lies in logical block "
                                f"{lb}, which already holds physical block "
                                f"{int(self.table.entries[slot, layer, lb])}: a second pop would "
                                "overwrite the entry and lose that block")
        if len(plan) > len(self.free_blocks):
            raise CacheFullError(f"slot {slot} needs {len(plan)} blocks, "
                                 f"{len(self.free_blocks)} free")
        for layer, logical in plan:
            self.table.assign(slot, layer, logical, self.free_blocks.pop())
        missing = [lb for lb in range(c.blocks_for_tokens(new_len))
                   if self.table.entries[slot, 0, lb] == -1]
        if missing:
            what = f"the prefill of {new_len} tokens" if prefill else \
                f"the decode step that writes position {new_len - 1}"
            raise Wrong(f"after {what}, logical block {missing[0]} of slot {slot} still has no "
                        f"physical block (-1), yet positions up to {new_len - 1} must be "
                        "written: your rule popped too few blocks")

    def release(self, slot: int) -> list[int]:
        c = self.config
        owned = sorted(int(b) for b in self.table.entries[slot].ravel() if b >= 0)
        order = host_call(self.rules.release_order, (self.table.entries.copy(), slot),
                          ["block_table", "slot"])
        if not isinstance(order, (list, tuple, np.ndarray)):
            raise Wrong(f"release_order returned a {type(order).__name__}; it must return a list "
                        "of physical block ids")
        order = [need_int(b, "a pushed block", f"release_order(block_table, slot={slot})")
                 for b in order]
        if -1 in order:
            raise Wrong("release_order pushes -1: that entry is unassigned, not a block")
        if sorted(order) != owned:
            lost = sorted(set(owned) - set(order))
            extra = sorted(set(order) - set(owned))
            twice = sorted({b for b in order if order.count(b) > 1})
            raise Wrong(f"slot {slot} owns {len(owned)} blocks; release_order gives back "
                        f"{len(order)}" + (f"; never pushed: {lost[:6]} (they leak)" if lost else "")
                        + (f"; not the slot's: {extra[:6]}" if extra else "")
                        + (f"; pushed twice: {twice[:6]}" if twice else ""))
        self.free_blocks.extend(order)
        self.table.entries[slot] = -1
        self.table.mark_changed()
        return order


@lru_cache(maxsize=1)
def stock_run():
    engine = engine_with_cache(tiny_model(), backend="torch", **_engine_kwargs())
    return run(engine, REQUESTS)


def _engine_kwargs() -> dict:
    from paged_tutorial.config import CacheConfig

    model = tiny_model()
    block_bytes = CacheConfig.for_model(model.config, dtype=model.dtype).BLOCK_BYTES
    return {**ENGINE, "kv_cache_bytes": NUM_BLOCKS * block_bytes}


def _describe_step(states, i) -> str:
    s = states[i]
    return f"step {s.index} ({s.kind})"


def grade_rules(rules: Rules, which: str) -> str:
    stock = stock_run()
    def rule_cache(config, device):
        return PagedKVCache(config, device, allocator=partial(RuleAllocator, rules=rules))

    engine = engine_with_cache(tiny_model(), rule_cache, backend="torch", **_engine_kwargs())
    try:
        mine, diff = run(engine, REQUESTS, against=stock, compare_blocks=True)
    except ValueError as exc:      # the engine's own check of a -1 entry before a write
        raise Wrong(f"the engine stopped: {str(exc).splitlines()[0]}") from None
    if diff is None:
        return ("3 requests through 2 slots (a 16-token prompt, a decode across position 16, "
                "a request that reuses released blocks): every step's table and free list equal "
                "the article's engine's")
    i, what = diff
    if what == "length":
        raise Wrong(f"the run took {len(mine)} steps or more; the article's engine took "
                    f"{len(stock)}.  ({which})")
    m, s = mine[i], stock[i]

    def draw():
        from paged_tutorial.teaching.viz.lifetime import plot_table_and_free_list

        return plot_table_and_free_list(m.block_table, m.free_blocks, s.block_table,
                                        s.free_blocks, title=f"after {_describe_step(mine, i)}")
    if what == "table":
        diff_at = np.argwhere(m.block_table != s.block_table)[0]
        slot, layer, lb = (int(x) for x in diff_at)
        message = (f"after {_describe_step(mine, i)}, block_table[{slot}, {layer}, {lb}] is "
                   f"{int(m.block_table[slot, layer, lb])}; in the article's engine it is "
                   f"{int(s.block_table[slot, layer, lb])}")
    elif what == "free":
        message = (f"after {_describe_step(mine, i)}, the free list ends with "
                   f"{m.free_blocks[-6:]} (the next pops take from the right); in the article's "
                   f"engine it ends with {s.free_blocks[-6:]}")
    else:
        message = f"{_describe_step(mine, i)} differs from the article's engine ({what})"
    raise Wrong(f"{message}.  ({which})", figure=draw)


def grade_prefill(fn) -> str:
    return grade_rules(Rules(fn, article_decode_pops, article_release_order),
                       "decode and release follow the article here; only prefill is yours")


def grade_decode(fn) -> str:
    return grade_rules(Rules(article_prefill_pops, fn, article_release_order),
                       "prefill and release follow the article here; only decode is yours")


def grade_release(fn) -> str:
    return grade_rules(Rules(article_prefill_pops, article_decode_pops, fn),
                       "prefill and decode follow the article here; only release is yours")


RUNS_IN = ("a real Engine (torch backend, 2 slots, 2 layers, 12 blocks) whose PagedKVCache "
           "follows your rule, next to a stock engine")

PUZZLES = (
    Puzzle(
        "06.prefill_pops", "how many blocks a prefill pops",
        "def prefill_pops(prompt_len, BLOCK_SIZE):",
        "Return how many physical blocks, per layer, the prefill of a prompt of prompt_len\n"
        "tokens pops from free_blocks (the slot owns none before).",
        "The article pops while scattering the prompt, whenever a token's logical block has no "
        "block yet.  How many logical blocks do 16 tokens touch?  And 17?",
        RUNS_IN, "main.cpp:266-272", grade_prefill),
    Puzzle(
        "06.decode_pops", "when a decode step pops",
        "def decode_pops(position, BLOCK_SIZE):",
        "Return True if writing the K/V of the token at `position` (0-based) needs a new\n"
        "physical block, False if its logical block already has one.  Positions before it are\n"
        "all cached.",
        "Which positions are the first row of a block?",
        RUNS_IN, "main.cpp:859-865", grade_decode),
    Puzzle(
        "06.release_order", "what a finished slot pushes back, in which order",
        "def release_order(block_table, slot):",
        "Return the physical blocks that slot `slot` gives back when its sequence finishes, in\n"
        "the order they are pushed onto free_blocks.  block_table is a NumPy array\n"
        "[slot, layer, logical block] of physical block ids, -1 where none is assigned.",
        "The article walks the slot's table layer by layer, and in each layer logical block by "
        "logical block; free_blocks is a stack, so the order decides which block the next "
        "request gets.",
        RUNS_IN, "main.cpp:1018-1029", grade_release),
)
