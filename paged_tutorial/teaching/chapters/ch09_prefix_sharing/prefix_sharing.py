"""Puzzle ``09.can_share``: the rule that decides whether a request may use a cached block
(beyond the article: prefix caching, ``prefix_cache.py``).

The prefix cache finds a block by a hash key; the reader's function decides whether the
request may point its table entry at what the key found.  The grader runs real engines whose
``PrefixCachingKVCache`` asks the reader's rule (``share_rule``), next to stock engines, on
three scenarios chosen to cross each edge of the rule, their tokens, lengths and BLOCK_SIZE
drawn afresh for every check (``draw_scenarios``, the seed named in the verdict):

- *the hash ignores the chain*: a hash of a block's own tokens only, so "X Y" finds the Y that
  was computed after V, and a prompt that begins with Y finds it for its block 0;
- *every key collides*: a hash under which every block has the same key, so a key finds a block
  that holds other tokens;
- *the same system prompt*: ordinary sharing, and a prompt of exactly its full blocks (its last
  block must be computed: the first generated token comes from the last token's logits).

In that order, a rule that compares the tokens but not the parent fails on the first scenario
and one that compares both but shares the last token's block fails on the third, each with its
own message.

Each call of the reader's rule is compared with the engine's own rule on the same arguments;
the run goes on with the reader's decision (so a wrong share shows up in the tokens) unless it
would leave no token to compute.  At the end the first disagreement is reported, with what it
did to the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from paged_tutorial.cache.prefix_cache import (CachedBlock, PrefixCachingKVCache, chain_hash,
                                               may_share)
from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Wrong, host_call
from paged_tutorial.teaching.harness.engine_harness import tiny_model

PARAMS = ["found", "tokens", "previous", "logical_block", "n_tokens", "BLOCK_SIZE"]
#: the tokens per block a scenario draws from (the first and the third scenario take two
#: different ones); the host probe takes a block size that is not a power of two
BLOCK_SIZE_CHOICES = (8, 12, 16)
MAX_SEQ_LEN = 64
MAX_TOKENS = 4


@dataclass(frozen=True)
class Scenario:
    name: str
    hash_fn: Callable
    prompts: tuple                     # served one after another (one slot), greedy
    block_size: int
    seed: int
    max_tokens: int = MAX_TOKENS

    def label(self) -> str:
        lens = ", ".join(str(len(p)) for p in self.prompts)
        return say(en=f"{SCENARIO_NAMES[self.name]}; BLOCK_SIZE {self.block_size}, prompts of "
                      f"{lens} tokens, seed {self.seed}",
                   ko=f"{SCENARIO_NAMES[self.name]}; BLOCK_SIZE {self.block_size}, 프롬프트 "
                      f"토큰 {lens}개, 시드 {self.seed}")


def _chain_blind(parent, tokens):
    return chain_hash(None, tokens)


def _colliding(parent, tokens):
    return 0


def draw_scenarios() -> tuple[Scenario, ...]:
    """The three scenarios of one check, drawn afresh: their token chains (which blocks follow
    which parents), the prompts' lengths and BLOCK_SIZE (8, 12 or 16; the first and the third
    differ).  In this order:

    - *the hash ignores the chain*: a hash of a block's own tokens only; a block Y is computed
      after one to three blocks V, then asked for after a block X (the first time X is
      computed, the second X is shared and Y's key finds the Y computed after V), then after V
      again, and, at a drawn place after the first prompt, as the first block of a prompt (its
      key finds the Y computed after V: the tokens match, the parent is not None, and the
      request shares nothing before it);
    - *every key collides*: a hash under which every block has the same key, so a key finds
      a block that holds other tokens;
    - *the same system prompt*: ordinary sharing behind a system prompt of two or three full
      blocks, and that system prompt alone (its last block must be computed: the first
      generated token comes from the last token's logits)."""
    rng, seed = shapes.fresh_rng()
    # the first and the third scenario share blocks after the first: each at another size
    first, third = (int(x) for x in shapes.distinct(rng, BLOCK_SIZE_CHOICES, 2))
    sizes = [first, shapes.pick(rng, BLOCK_SIZE_CHOICES), third]

    def ids(n):
        return [int(t) for t in rng.integers(0, 64, n)]

    def tail(bs, used):                 # a few tokens past the full blocks, within the slot
        return ids(int(rng.integers(1, min(bs, MAX_SEQ_LEN - MAX_TOKENS - used))))

    bs = sizes[0]
    n_pre = int(rng.integers(1, 3 if bs == 16 else 4))     # blocks before the shared one
    v, x, y = (ids(n_pre * bs) for _ in range(3))
    y = ids(bs)
    used = (n_pre + 1) * bs
    # Y computed after V; X computed; X Y: Y found under V (refused: another parent); V Y:
    # Y found under V again (shared)
    blind = [v + y + tail(bs, used), x + y + tail(bs, used), x + y + tail(bs, used),
             v + y + tail(bs, used)]
    # Y as a prompt's block 0: what its key finds sits deeper, after V
    blind.insert(int(rng.integers(1, len(blind) + 1)), y + tail(bs, bs))
    blind = tuple(blind)

    bs = sizes[1]
    x, y, v = ids(bs), ids(bs), ids(bs)
    collide = (x + y + tail(bs, 2 * bs), v + ids(int(rng.integers(bs + 1, 2 * bs))),
               x + y + tail(bs, 2 * bs))

    bs = sizes[2]
    system = ids(bs * (2 if bs == 16 else int(rng.integers(2, 4))))
    used = len(system)
    share = (system + tail(bs, used), system + tail(bs, used), system,
             system[:bs] + ids(int(rng.integers(bs + 1, MAX_SEQ_LEN - MAX_TOKENS - bs))))
    return (Scenario("the hash ignores the chain", _chain_blind, blind, sizes[0], seed),
            Scenario("every key collides", _colliding, collide, sizes[1], seed),
            Scenario("the same system prompt", chain_hash, share, sizes[2], seed))


#: the scenarios' names as the verdicts say them
SCENARIO_NAMES = {"the hash ignores the chain": Text(en="the hash ignores the chain",
                                                     ko="체인을 무시하는 해시"),
                  "every key collides": Text(en="every key collides", ko="모든 키가 충돌"),
                  "the same system prompt": Text(en="the same system prompt",
                                                 ko="같은 시스템 프롬프트")}


NUM_BLOCKS = 64                      # room for every scenario's blocks: nothing is evicted


def _engine(scenario: Scenario, share_rule):
    from paged_tutorial.config import CacheConfig
    from paged_tutorial.engine.llm_engine import Engine

    def factory(config, device):
        return PrefixCachingKVCache(config, device, hash_fn=scenario.hash_fn,
                                    share_rule=share_rule)

    model = tiny_model(dtype="float32")
    block_bytes = CacheConfig.for_model(model.config, dtype=model.dtype,
                                        block_size=scenario.block_size).BLOCK_BYTES
    return Engine(model, backend="torch", device="cpu", max_slots=1, max_seq_len=MAX_SEQ_LEN,
                  block_size=scenario.block_size, kv_cache_bytes=NUM_BLOCKS * block_bytes,
                  cache_factory=factory)


def _serve(engine, scenario: Scenario, rule=None) -> list[tuple[int, list[int]]]:
    """(num_cached_tokens, generated ids) of each prompt, served one after another."""
    out = []
    for r, prompt in enumerate(scenario.prompts):
        if rule is not None:
            rule.request = r
        res = engine.generate([list(prompt)], max_tokens=scenario.max_tokens,
                              temperature=0.0, seed=0)[0]
        out.append((res.num_cached_tokens, res.token_ids))
    return out


def stock_results(scenario: Scenario) -> tuple:
    return tuple(_serve(_engine(scenario, may_share), scenario))


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
        mine = _leaves_records_alone(self.fn, args, PARAMS)
        if not isinstance(mine, (bool, np.bool_)):
            raise Wrong(say(en=f"can_share returned {mine!r}; it must return True or False",
                            ko=f"can_share가 {particle(repr(mine), '을/를')} 돌려줬습니다; True나 False를 돌려줘야 "
                               "합니다"))
        mine = bool(mine)
        engine = may_share(*args)
        if mine != engine and self.first_disagreement is None:
            self.first_disagreement = Call(self.request, args, mine, engine)
        if mine and (logical_block + 1) * BLOCK_SIZE >= n_tokens:
            name, r = self.scenario.label(), self.request
            first, last = logical_block * BLOCK_SIZE, (logical_block + 1) * BLOCK_SIZE - 1
            raise Wrong(say(
                en=f"[{name}] request r{r} has {n_tokens} tokens and your rule shares its "
                   f"logical block {logical_block} (tokens {first}..{last}): every token would "
                   "come from the cache and none would be left to compute, but the first "
                   "generated token comes from the logits of the last token computed.",
                ko=f"[{name}] 요청 r{particle(r, '은/는')} 토큰이 {n_tokens}개인데 규칙이 논리 블록 "
                   f"{particle(f'{logical_block} (토큰 {first}..{last})', '을/를')} 공유합니다: 모든 토큰이 캐시에서 "
                   "와서 계산할 토큰이 하나도 남지 않지만, 첫 생성 토큰은 마지막으로 계산한 "
                   "토큰의 로짓에서 나옵니다."))
        return mine


def _leaves_records_alone(fn, args, names):
    """``host_call(fn, args, names)``, refused if it changed a field of ``found`` or
    ``previous``: the cache's records (their reference counts, whether a step still writes
    them) are the engine's bookkeeping, and the rule only answers whether one may be shared."""
    records = [(name, record, dict(vars(record))) for name, record in zip(names, args)
               if isinstance(record, CachedBlock)]
    got = host_call(fn, args, names)
    for name, record, before in records:
        for field, value in before.items():
            now = vars(record).get(field)
            if now is not value and now != value:
                raise Wrong(say(
                    en=f"can_share changed {name}.{field} from {value!r} to {now!r}: the "
                       "cache's records are the engine's bookkeeping (it counts a block's "
                       "sharers and marks what a step still writes); the rule only answers "
                       "whether the block may be shared",
                    ko=f"can_share가 {name}.{particle(field, '을/를')} {value!r}에서 "
                       f"{particle(repr(now), '으로/로')} 바꿨습니다: 캐시의 기록은 엔진의 장부입니다 (블록을 "
                       "함께 쓰는 수와 아직 쓰는 중인 블록을 표시합니다); 규칙은 블록을 "
                       "공유해도 되는지만 답합니다"))
    return got


def _compares_tokens(fn, args) -> bool:
    """Whether ``fn`` refuses the block it was asked about once the block's tokens differ from
    the request's (everything else the same): a probe of the rule, on the host."""
    import dataclasses

    found, tokens, previous, lb, n_tokens, bs = args
    other = tuple(t + 1 for t in found.tokens)
    try:
        probe = dataclasses.replace(found, tokens=other) if dataclasses.is_dataclass(found) \
            else None
        if probe is None:
            return True
        return not fn(probe, tokens, previous, lb, n_tokens, bs)
    except Exception:               # a rule that cannot be asked so: say what the run showed
        return True


def _describe(call: Call, scenario: Scenario, fn) -> str:
    found, tokens, previous, lb, n_tokens, bs = call.args
    name = scenario.label()
    where = say(en=f"[{name}] request r{call.request}, logical block {lb}",
                ko=f"[{name}] 요청 r{call.request}, 논리 블록 {lb}")
    if call.mine:
        if found.tokens != tokens:
            theirs, own = list(found.tokens[:4]), list(tokens[:4])
            return say(en=f"{where}: your rule shared a cached block that holds other tokens "
                          f"({theirs}... where the request has {own}...). Equal keys do not "
                          "prove equal contents: a key is a hash",
                       ko=f"{where}: 규칙이 다른 토큰을 담은 캐시 블록을 공유했습니다 "
                          f"(요청의 토큰은 {own}..., 블록의 토큰은 {theirs}...). 키가 같다고 내용이 같은 "
                          "것은 아닙니다: 키는 해시입니다")
        if not _compares_tokens(fn, call.args):
            return say(en=f"{where}: your rule compared neither the tokens nor the parent: it "
                          "shared a cached block computed after a different block (found.parent "
                          "is not previous), and asked about a block that holds other tokens it "
                          "answers True as well.  A key is a hash: only the block's tokens and "
                          "its parent say whether its K/V are the request's",
                       ko=f"{where}: 규칙이 토큰도 부모도 비교하지 않았습니다: 다른 블록 뒤에서 "
                          "계산된 캐시 블록을 공유했고 (found.parent가 previous가 아님), 다른 "
                          "토큰을 담은 블록을 물어도 True를 돌려줍니다.  키는 해시일 뿐입니다: "
                          "블록의 K/V가 요청의 것인지는 블록의 토큰과 부모만이 말해 줍니다")
        if previous is None and found.parent is not None:
            depth = found.logical_block
            return say(en=f"{where}: your rule compared the tokens but not the parent: the "
                          "request shares nothing before this block (previous is None), yet "
                          "it shared a cached block with its tokens that sits at logical block "
                          f"{depth} of another prompt, computed after that prompt's block "
                          f"{depth - 1} (found.parent is not None).  K/V depend on every "
                          "earlier token, so these are K/V of the same tokens after other ones",
                       ko=f"{where}: 규칙이 토큰만 비교하고 부모는 비교하지 않았습니다: 요청은 이 "
                          "블록 앞에서 공유하는 것이 없는데 (previous가 None), 같은 토큰을 담고 "
                          f"다른 프롬프트의 논리 블록 {depth}에 있는 캐시 블록, 즉 그 프롬프트의 "
                          f"{depth - 1}번 블록 뒤에서 계산된 블록을 공유했습니다 (found.parent가 "
                          "None이 아님).  K/V는 앞의 모든 토큰에 달려 있으므로 이것은 다른 토큰 "
                          "뒤에 온 같은 토큰의 K/V입니다")
        return say(en=f"{where}: your rule compared the tokens but not the parent: it shared a "
                      "cached block with the request's own tokens, computed after a different "
                      "block (found.parent is not previous).  K/V depend on every earlier token, "
                      "so these are another prompt's K/V",
                   ko=f"{where}: 규칙이 토큰만 비교하고 부모는 비교하지 않았습니다: 요청과 같은 "
                      "토큰이지만 다른 블록 뒤에서 계산된 캐시 블록을 공유했습니다 (found.parent가 "
                      "previous가 아님).  K/V는 앞의 모든 토큰에 달려 있으므로 이것은 다른 "
                      "프롬프트의 K/V입니다")
    return say(en=f"{where}: your rule refused a cached block with the same tokens, computed "
                  "after the same block (found.parent is previous), leaving one token or more to "
                  "compute; the request computed tokens it could have shared",
               ko=f"{where}: 계산할 토큰이 하나 이상 남는데도, 규칙이 같은 토큰을 같은 블록 뒤에서 "
                  "계산한 캐시 블록(found.parent가 previous)을 거절했습니다; 요청은 공유할 수 "
                  "있던 토큰을 다시 계산했습니다")


def probe_cases(rng) -> list:
    """(what, arguments) of the host probe: records a share rule must tell apart whatever the
    engine's streams happen to ask, drawn afresh (tokens, a BLOCK_SIZE that is not a power of
    two, the block's place).  Every record is one the cache could hold: a record past block 0
    has a parent one block before it, and two records that hold the same tokens all the way
    from the start have one key (a key names the contents), so they are never two records."""

    bs = shapes.pick(rng, shapes.UNEVEN_BLOCK_SIZES)
    lb = int(rng.integers(2, 5))
    n_tokens = (lb + 2) * bs + int(rng.integers(0, bs))

    def ids():
        return tuple(int(t) for t in rng.integers(0, 500, bs))

    def other(tokens):
        return tuple(t + 500 for t in tokens)

    tokens = tuple(int(t) for t in rng.choice(500, bs, replace=False))
    chain: list = []                       # the request's cached blocks 0 .. lb-1
    for j in range(lb):
        chain.append(CachedBlock(10 + j, ids(), chain[-1] if chain else None, j, (j,)))
    parent = chain[-1]
    # the same tokens as the block before, computed after another block (whose own tokens
    # differ from the request's block there)
    grand = chain[-2]
    twin = CachedBlock(40, parent.tokens, CachedBlock(41, other(grand.tokens), grand.parent,
                                                      lb - 2, (41,)), lb - 1, (40,))
    # another record under the parent's very key (a hash collision), holding other tokens
    collider = CachedBlock(parent.key, other(parent.tokens), grand, lb - 1, (42,))
    shuffled = tuple(tokens[i] for i in np.roll(np.arange(bs), int(rng.integers(1, bs))))
    middle = list(tokens)
    middle[int(rng.integers(1, bs - 1))] += 1000
    record = lambda toks, par, at=lb: CachedBlock(13, tuple(toks), par, at, (3,))  # noqa: E731
    # another prompt's chain, as deep as drawn: its last block holds the request's block 0
    depth = int(rng.integers(1, 4))
    elsewhere = None
    for j in range(depth):
        elsewhere = CachedBlock(60 + j, ids(), elsewhere, j, (60 + j,))
    return [
        (say(en="the same tokens after the same block", ko="같은 블록 뒤의 같은 토큰"),
         (record(tokens, parent), tokens, parent, lb, n_tokens, bs)),
        (say(en="block 0 with the same tokens (no parent on either side)",
             ko="같은 토큰의 0번 블록 (양쪽 모두 부모 없음)"),
         (record(tokens, None, 0), tokens, None, 0, n_tokens, bs)),
        (say(en=f"block 0 with the same tokens as a block at logical block {depth} of another "
                "prompt (found there: its parent is not None, the request has none)",
             ko=f"다른 프롬프트의 논리 블록 {depth}에 있는 블록과 토큰이 같은 0번 블록 (거기서 "
                "찾은 블록이라 부모가 None이 아니고, 요청에는 부모가 없음)"),
         (record(tokens, elsewhere, depth), tokens, None, 0, n_tokens, bs)),
        (say(en="the same tokens in another order", ko="순서만 다른 같은 토큰"),
         (record(shuffled, parent), tokens, parent, lb, n_tokens, bs)),
        (say(en="the same first and last token, another one in between",
             ko="첫 토큰과 끝 토큰은 같고 가운데 토큰 하나가 다름"),
         (record(middle, parent), tokens, parent, lb, n_tokens, bs)),
        (say(en="a parent holding the same tokens as the block before, but computed after "
                "other tokens than the request's (another cached block than the one this "
                "request shares)",
             ko="앞 블록과 같은 토큰을 담았지만 요청과 다른 토큰 뒤에서 계산된 부모 (이 요청이 "
                "공유하는 것과는 다른 캐시 블록)"),
         (record(tokens, twin), tokens, parent, lb, n_tokens, bs)),
        (say(en="a parent with the same key as the block before (a hash collision) but other "
                "tokens",
             ko="앞 블록과 키는 같지만 (해시 충돌) 토큰이 다른 부모"),
         (record(tokens, collider), tokens, parent, lb, n_tokens, bs)),
        (say(en=f"a block with no parent found for logical block {lb} (past the first)",
             ko=f"논리 블록 {lb} (첫 블록이 아님)에서 찾은 부모 없는 블록"),
         (record(tokens, None), tokens, parent, lb, n_tokens, bs)),
        (say(en="the block of the prompt's last token", ko="프롬프트 마지막 토큰의 블록"),
         (record(tokens, parent), tokens, parent, lb, (lb + 1) * bs, bs)),
        (say(en="the block just before the prompt's last token, which is alone in the next "
                "block (one token left to compute)",
             ko="프롬프트 마지막 토큰 바로 앞의 블록, 마지막 토큰은 다음 블록에 혼자 있음 (계산할 "
                "토큰 하나가 남음)"),
         (record(tokens, parent), tokens, parent, lb, (lb + 1) * bs + 1, bs)),
    ]


PROBE_NAMES = ["found", "tokens", "previous", "logical_block", "n_tokens", "BLOCK_SIZE"]


def probe(fn) -> None:
    """The rule on records built to tell each shortcut apart (``probe_cases``): a token
    compare that ignores order or looks at some tokens only, a parent compared by its tokens
    rather than as the very block shared, a parentless record taken anywhere, a record from
    deeper in another prompt taken for block 0, and both sides of the last token's block (no
    token left to compute; exactly one)."""
    rng, _ = shapes.fresh_rng()
    for what, args in probe_cases(rng):
        want = may_share(*args)
        got = _leaves_records_alone(fn, args, PROBE_NAMES)
        if isinstance(got, (bool, np.bool_)) and bool(got) == want:
            continue
        found, tokens, previous, lb, n_tokens, bs = args
        raise Wrong(say(
            en=f"{what} (logical block {lb}, BLOCK_SIZE {bs}, n_tokens {n_tokens}; "
               f"found.tokens {found.tokens}, tokens {tokens}): your rule says {got!r}, the "
               f"answer is {want}",
            ko=f"{what} (논리 블록 {lb}, BLOCK_SIZE {bs}, n_tokens {n_tokens}; found.tokens "
               f"{found.tokens}, tokens {tokens}): 규칙은 {got!r}, 답은 {want}"))


def grade(fn) -> str:
    drawn = draw_scenarios()
    for scenario in drawn:
        stock = stock_results(scenario)
        rule = ReaderRule(fn, scenario)
        mine = _serve(_engine(scenario, rule), scenario, rule)
        if rule.first_disagreement is not None:
            call = rule.first_disagreement
            r = call.request
            effect = say(en=f"  Result: r{r} found {mine[r][0]} prompt tokens in the cache (the "
                            f"engine: {stock[r][0]})",
                         ko=f"  결과: r{particle(r, '이/가')} 캐시에서 프롬프트 토큰 {mine[r][0]}개를 찾았습니다 "
                            f"(엔진: {stock[r][0]})")
            if mine[r][1] != stock[r][1]:
                effect += say(en=f" and generated {mine[r][1]} instead of {stock[r][1]}",
                              ko=f", 그리고 {stock[r][1]} 대신 {particle(mine[r][1], '을/를')} 생성했습니다")
            raise Wrong(_describe(call, scenario, fn) + "." + effect + ".")
        if mine != list(stock):                 # cannot happen without a disagreement
            raise Wrong(say(en=f"[{scenario.label()}] the run differs from the "
                               f"engine's: {mine} vs {list(stock)}",
                            ko=f"[{scenario.label()}] 실행이 엔진과 다릅니다: "
                               f"{mine} 대 {list(stock)}"))
    probe(fn)
    run_ = " | ".join(s.label() for s in drawn)
    return say(en=f"3 scenarios drawn for this check ({run_}): every decision equals the "
                  "engine's, and so do every request's cached tokens and generated tokens",
               ko=f"이번 채점에서 뽑은 시나리오 3개 ({run_}): 모든 결정이 엔진과 같고, 모든 요청의 "
                  "캐시된 토큰과 생성 토큰도 같습니다")


PUZZLES = (
    Puzzle(
        "09.can_share", Text(en="may a request use the cached block its hash key found?",
                             ko="요청이 해시 키로 찾은 캐시 블록을 써도 되는지"),
        "def can_share(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):",
        Text(en="The prefix cache found `found` under the hash key of the request's logical\n"
                "block `logical_block`, a full block of its prompt.  found.tokens: the token ids\n"
                "(a tuple) whose K/V the cached block holds; found.parent: the cached block it\n"
                "was computed after (None for a first block).  tokens: the request's own ids in\n"
                "this block (a tuple); previous: the cached block the request already shares for\n"
                "the block before (None for block 0); n_tokens: how many tokens the request has.\n"
                "Return True if the request may point its table entries at found's blocks\n"
                "instead of computing them.",
             ko="프리픽스 캐시가 요청의 논리 블록 `logical_block` (프롬프트의 꽉 찬 블록)의\n"
                "해시 키로 `found`를 찾았습니다.  found.tokens: 캐시 블록이 K/V를 담은 토큰\n"
                "번호들 (튜플); found.parent: 그 블록이 뒤따라 계산된 캐시 블록 (첫 블록이면\n"
                "None).  tokens: 이 블록에 있는 요청 자신의 토큰 번호들 (튜플); previous: 요청이\n"
                "바로 앞 블록으로 이미 공유하는 캐시 블록 (블록 0이면 None); n_tokens: 요청의\n"
                "토큰 수.  요청이 계산하는 대신 테이블의 항목을 found의 블록으로 가리켜도 되면\n"
                "True를 돌려줍니다."),
        Text(en="A key is a hash of the block's tokens and of the key before it: which contents "
                "could share it?  K/V depend on every earlier token.  And the first generated "
                "token comes from the logits of the last token computed: can every token come "
                "from the cache?",
             ko="키는 블록의 토큰과 앞 키의 해시입니다: 어떤 내용이 같은 키를 가질 수 있을까요?  "
                "K/V는 앞의 모든 토큰에 달려 있습니다.  그리고 첫 생성 토큰은 마지막으로 계산한 "
                "토큰의 로짓에서 나옵니다: 모든 토큰이 캐시에서 올 수 있을까요?"),
        Text(en="real Engines (torch backend, one slot, 2 layers) whose PrefixCachingKVCache "
                "asks your rule, next to stock engines, under three hash functions; the token "
                "chains, the prompts' lengths and BLOCK_SIZE (8, 12 or 16) are drawn afresh for "
                "every check, then records built to tell each shortcut apart",
             ko="PrefixCachingKVCache가 직접 쓴 규칙에 묻는 실제 Engine들 (torch 백엔드, 슬롯 "
                "1개, 레이어 2개), 표준 엔진과 나란히, 해시 함수 세 가지로; 토큰 체인, 프롬프트 "
                "길이, BLOCK_SIZE (8, 12, 16)는 채점할 때마다 새로 뽑고, 그다음 지름길마다 "
                "가려내도록 만든 레코드"),
        "PrefixCachingKVCache.share_rule", grade, on_host=True),
)
