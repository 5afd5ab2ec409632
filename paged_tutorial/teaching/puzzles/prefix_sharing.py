"""Puzzle ``09.can_share``: the rule that decides whether a request may use a cached block
(beyond the article: prefix caching, ``prefix_cache.py``).

The prefix cache finds a block by a hash key; the reader's function decides whether the
request may point its table entry at what the key found.  The grader runs real engines whose
``PrefixCachingKVCache`` asks the reader's rule (``share_rule``), next to stock engines, on
scenarios chosen to cross each edge of the rule:

- *the same system prompt*: ordinary sharing, and a prompt of exactly two blocks (its last
  block must be computed: the first generated token comes from the last token's logits);
- *every key collides*: a hash under which every block has the same key, so a key finds a block
  that holds other tokens;
- *the hash ignores the chain*: a hash of a block's own tokens only, so "X Y" finds the Y that
  was computed after V.

Each call of the reader's rule is compared with the engine's own rule on the same arguments;
the run goes on with the reader's decision (so a wrong share shows up in the tokens) unless it
would leave no token to compute.  At the end the first disagreement is reported, with what it
did to the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from paged_tutorial.cache.prefix_cache import PrefixCachingKVCache, chain_hash, may_share
from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong, host_call
from paged_tutorial.teaching.puzzles.engine_harness import tiny_model

BLOCK = 16
PARAMS = ["found", "tokens", "previous", "logical_block", "n_tokens", "BLOCK_SIZE"]


def _ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 64, n).tolist()


SYSTEM = _ids(1, 2 * BLOCK)                  # a two-block "system prompt"
V, X, Y = _ids(2, BLOCK), _ids(3, BLOCK), _ids(4, BLOCK)


@dataclass(frozen=True)
class Scenario:
    name: str
    hash_fn: Callable
    prompts: tuple                     # served one after another (one slot), greedy
    max_new_tokens: int = 4


SCENARIOS = (
    Scenario("the same system prompt", chain_hash,
             (SYSTEM + _ids(5, 5), SYSTEM + _ids(6, 9), SYSTEM, SYSTEM[:BLOCK] + _ids(7, 20))),
    Scenario("every key collides", lambda parent, tokens: 0,
             (X + Y + [1, 2, 3], V + _ids(8, 20), X + Y + [4, 5])),
    Scenario("the hash ignores the chain", lambda parent, tokens: chain_hash(None, tokens),
             (V + Y + [1], X + Y + [2], X + Y + [3])),
)


NUM_BLOCKS = 64                      # room for every scenario's blocks: nothing is evicted


def _engine(hash_fn, share_rule):
    from paged_tutorial.config import CacheConfig
    from paged_tutorial.engine.llm_engine import Engine

    def factory(config, device):
        return PrefixCachingKVCache(config, device, hash_fn=hash_fn, share_rule=share_rule)

    model = tiny_model(dtype="float32")
    block_bytes = CacheConfig.for_model(model.config, dtype=model.dtype).BLOCK_BYTES
    return Engine(model, backend="torch", device="cpu", max_slots=1, max_seq_len=64,
                  kv_cache_bytes=NUM_BLOCKS * block_bytes, cache_factory=factory)


def _serve(engine, scenario: Scenario, rule=None) -> list[tuple[int, list[int]]]:
    """(num_cached_tokens, generated ids) of each prompt, served one after another."""
    out = []
    for r, prompt in enumerate(scenario.prompts):
        if rule is not None:
            rule.request = r
        res = engine.generate([list(prompt)], max_new_tokens=scenario.max_new_tokens,
                              temperature=0.0, seed=0)[0]
        out.append((res.num_cached_tokens, res.token_ids))
    return out


@lru_cache(maxsize=None)
def stock_results(i: int) -> tuple:
    scenario = SCENARIOS[i]
    return tuple(_serve(_engine(scenario.hash_fn, may_share), scenario))


@dataclass
class Call:
    """One call of the reader's rule that the engine's rule decides otherwise."""
    request: int
    args: tuple
    mine: bool
    engine: bool


class ReaderRule:
    """The reader's function as a ``share_rule``: typed, compared with ``may_share``."""

    def __init__(self, fn, scenario: Scenario):
        self.fn, self.scenario = fn, scenario
        self.request = 0
        self.first_disagreement: Call | None = None

    def __call__(self, found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
        args = (found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE)
        mine = host_call(self.fn, args, PARAMS)
        if not isinstance(mine, (bool, np.bool_)):
            raise Wrong(f"can_share returned {mine!r}; it must return True or False")
        mine = bool(mine)
        engine = may_share(*args)
        if mine != engine and self.first_disagreement is None:
            self.first_disagreement = Call(self.request, args, mine, engine)
        if mine and (logical_block + 1) * BLOCK_SIZE >= n_tokens:
            raise Wrong(
                f"[{self.scenario.name}] request r{self.request} has {n_tokens} tokens and your "
                f"rule shares its logical block {logical_block} (tokens {logical_block * BLOCK_SIZE}"
                f"..{(logical_block + 1) * BLOCK_SIZE - 1}): every token would come from the "
                "cache and none would be left to compute, but the first generated token comes "
                "from the logits of the last token computed.")
        return mine


def _describe(call: Call, scenario: Scenario) -> str:
    found, tokens, previous, lb, n_tokens, bs = call.args
    where = f"[{scenario.name}] request r{call.request}, logical block {lb}"
    if call.mine:
        if found.tokens != tokens:
            return (f"{where}: your rule shared a cached block that holds other tokens "
                    f"({list(found.tokens[:4])}... where the request has {list(tokens[:4])}...). "
                    "Equal keys do not prove equal contents: a key is a hash")
        return (f"{where}: your rule shared a cached block with the request's own tokens, but "
                "computed after a different block (found.parent is not previous): K/V depend on "
                "every earlier token, so these are another prompt's K/V")
    return (f"{where}: your rule refused a cached block with the same tokens, computed after "
            "the same block (found.parent is previous), leaving one token or more to compute; "
            "the request computed tokens it could have shared")


def grade(fn) -> str:
    for i, scenario in enumerate(SCENARIOS):
        stock = stock_results(i)
        rule = ReaderRule(fn, scenario)
        mine = _serve(_engine(scenario.hash_fn, rule), scenario, rule)
        if rule.first_disagreement is not None:
            call = rule.first_disagreement
            r = call.request
            effect = (f"  Result: r{r} found {mine[r][0]} prompt tokens in the cache (the "
                      f"engine: {stock[r][0]})")
            if mine[r][1] != stock[r][1]:
                effect += (f" and generated {mine[r][1]} instead of {stock[r][1]}")
            raise Wrong(_describe(call, scenario) + "." + effect + ".")
        if mine != list(stock):                 # cannot happen without a disagreement
            raise Wrong(f"[{scenario.name}] the run differs from the engine's: {mine} vs "
                        f"{list(stock)}")
    return ("3 scenarios (a shared system prompt with a prompt of exactly two blocks, colliding "
            "keys, a hash that ignores the chain): every decision equals the engine's, and so "
            "do every request's cached tokens and generated tokens")


PUZZLES = (
    Puzzle(
        "09.can_share", "may a request use the cached block its hash key found?",
        "def can_share(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):",
        "The prefix cache found `found` under the hash key of the request's logical block\n"
        "`logical_block`, a full block of its prompt.  found.tokens: the token ids (a tuple)\n"
        "whose K/V the cached block holds; found.parent: the cached block it was computed\n"
        "after (None for a first block).  tokens: the request's own ids in this block (a\n"
        "tuple); previous: the cached block the request already shares for the block before\n"
        "(None for block 0); n_tokens: how many tokens the request has.  Return True if the\n"
        "request may point its table entries at found's blocks instead of computing them.",
        "A key is a hash of the block's tokens and of the key before it: which contents could "
        "share it?  K/V depend on every earlier token.  And the first generated token comes "
        "from the logits of the last token computed: can every token come from the cache?",
        "real Engines (torch backend, one slot, 2 layers) whose PrefixCachingKVCache asks your "
        "rule, next to stock engines, under three hash functions",
        "prefix_cache.may_share, beyond the article", grade),
)
