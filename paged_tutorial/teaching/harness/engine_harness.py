"""Run a real ``Engine`` with one piece replaced by the reader's code, next to a stock engine.

Both engines serve the same requests on the same tiny random Llama (torch backend on the CPU:
these puzzles are about host-side bookkeeping and memory layout, which the torch backend reads
exactly as the kernels do).  The replaced piece enters through public extension points:

- a ``Backend`` subclass (``Engine(model, backend=...)``): the cache's *writer* side, where the
  article's engine computes where a token's K/V go (``main.cpp:265`` prefill, ``858-872``
  decode), while the stock reader (the decode attention) finds them through the table;
- a ``PagedKVCache`` whose allocator (a ``BlockAllocator``) follows the reader's free-list
  rules, given to ``Engine(..., cache_factory=...)``.

``run`` steps an engine to the end and keeps, after every step, the step's kind, its logits,
its new tokens, a copy of the block table and of the free list: ``first_difference`` compares
two runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from paged_tutorial.config import ModelConfig
from paged_tutorial.teaching.language import particle, say, term
from paged_tutorial.teaching.time_limit import TimeLimitExceeded, time_limit

#: one step of the tiny engine takes milliseconds; a step still running after this long is
#: stuck in the reader's code (a loop that never ends)
STEP_LIMIT_S = 60.0

#: the tiny Llama of the engine puzzles: 2 KV heads, so a head's slice of a K row matters
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8)


@lru_cache(maxsize=4)
def tiny_model(num_layers: int = 2, dtype: str = "bfloat16"):
    from paged_tutorial.loading.models import random_model

    return random_model(ModelConfig(num_hidden_layers=num_layers, **TINY), dtype=dtype, seed=0)


def engine_with_cache(model, cache_factory=None, **engine_kwargs):
    """An ``Engine`` whose cache is ``cache_factory(cache_config, device)`` (a
    ``PagedKVCache`` with its own allocator), or a stock one when ``cache_factory`` is None."""
    from paged_tutorial.engine.llm_engine import Engine

    return Engine(model, cache_factory=cache_factory, **engine_kwargs)


@dataclass
class StepState:
    index: int
    kind: str
    new_tokens: dict
    finished: list
    logits: torch.Tensor | None
    block_table: np.ndarray
    free_blocks: list


def run(engine, requests, shuffle_seed: int | None = None, poison: bool = False,
        against: list | None = None, compare_blocks: bool = False, max_steps: int = 200,
        after_step=None):
    """Serve ``requests`` [(prompt ids, max_tokens)] greedily to the end; returns one
    ``StepState`` per step.  ``shuffle_seed`` permutes the free list first (so physical blocks
    differ from logical ones); ``poison`` fills the cache with NaN first (a read of anything
    never written shows).

    With ``against`` (a stock run's states) the run stops at the first step that differs and
    returns ``(states, (position, what))`` (``what``: kind, logits, table, free, length), or
    ``(states, None)``; a ``Wrong`` raised by the reader's code during a step is re-raised with
    the step named.  ``after_step(state)`` is called after every step (e.g. to check the
    cache's invariants)."""
    from paged_tutorial.teaching.harness.base import Wrong

    cache = engine.cache
    if shuffle_seed is not None:
        rng = np.random.default_rng(shuffle_seed)
        cache.free_blocks[:] = [int(b) for b in rng.permutation(cache.free_blocks)]
    if poison:
        cache.buffer.fill_(float("nan"))
    engine.record_logits = True
    for prompt, max_new in requests:
        engine.add_request(list(prompt), max_tokens=max_new, temperature=0.0, seed=0)
    states = []
    while engine.has_unfinished() and len(states) < max_steps:
        i = len(states)
        try:
            with time_limit(STEP_LIMIT_S):
                report = engine.step()
        except TimeLimitExceeded:
            raise Wrong(say(en=f"step {i} of the engine was still running after {STEP_LIMIT_S:g} "
                               "s and was stopped: your code in it never finishes (a loop that "
                               "does not end?)",
                            ko=f"엔진의 스텝 {particle(str(i), '이/가')} {STEP_LIMIT_S:g}초가 지나도 끝나지 않아 "
                               "멈췄습니다: 그 안의 여러분의 코드가 끝나지 않습니다 (끝나지 않는 "
                               "루프?)")) from None
        except Wrong as wrong:
            if against is None or i >= len(against):
                raise
            step, kind = against[i].index, against[i].kind
            raise Wrong(say(en=f"during step {step} ({kind}): {wrong.message}",
                            ko=f"스텝 {step} ({term(kind)}) 중: "
                               f"{wrong.message}"), wrong.figure) from None
        states.append(StepState(report.index, report.kind, dict(report.new_tokens),
                                list(report.finished), report.logits,
                                engine.cache.block_table.copy(), list(engine.cache.free_blocks)))
        if after_step is not None:
            after_step(states[-1])
        if against is not None:
            diff = first_difference(states[i:], against[i:i + 1], compare_blocks)
            if diff is not None:
                return states, (i, diff[1])
    if against is None:
        return states
    return states, (None if len(states) == len(against) else (len(states), "length"))


def same_logits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and torch.equal(torch.nan_to_num(a, nan=1e30),
                                              torch.nan_to_num(b, nan=1e30)) and \
        bool(torch.isfinite(a).all())


def first_difference(mine: list[StepState], stock: list[StepState], compare_blocks: bool):
    """(step position, what differs) of the first step where the runs part, or None."""
    for i, (m, s) in enumerate(zip(mine, stock)):
        if m.kind != s.kind:
            return i, "kind"
        if not same_logits(m.logits, s.logits) or m.new_tokens != s.new_tokens:
            return i, "logits"
        if compare_blocks and not np.array_equal(m.block_table, s.block_table):
            return i, "table"
        if compare_blocks and m.free_blocks != s.free_blocks:
            return i, "free"
    if len(mine) > len(stock):
        return len(stock), "length"
    return None
