"""Puzzle ``06.allocator``: the reader writes the article's block manager -- the core of a
``BlockAllocator`` (``cache/block_allocator.py``) -- and a real scheduler serves a request
stream through a cache too small for it with her allocator.

She subclasses ``AllocatorBase`` (the article's accounting: ``free_blocks`` starts as
0..NUM_BLOCKS-1, the invariants, what the scheduler may ask before it allocates) and writes its
two methods that move blocks: ``ensure_capacity`` (pop from the end of ``free_blocks`` for every
entry a prefill or a decode step needs, ``main.cpp:266-272`` and ``859-865``; raise
``CacheFullError`` and change nothing when too few are free, which the scheduler turns into a
preemption) and ``release`` (push a finished slot's blocks back layer by layer, logical block
by logical block, ``main.cpp:1018-1029``).

The grader builds the engine's cache with a subclass of her class that checks every call as
it returns (``Checked``), draws a scenario (``draw_scenario``: layers, BLOCK_SIZE, slots, a too
small NUM_BLOCKS and a request stream under which the article's engine meets 0 < free <
needed), runs its requests next to a stock engine (the article's
``FreeListAllocator``), compares tokens, block table and free list after every step, checks the
invariants after every step, and finally compares every request's tokens with its solo run.
"""

from __future__ import annotations

import contextlib

from dataclasses import dataclass

import numpy as np

from paged_tutorial.cache.block_allocator import (BlockAllocator, CacheFullError,
                                                  FreeListAllocator)
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.teaching.error_text import error_text, exception_text
from paged_tutorial.teaching.language import Text, particle, say, term
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import (STUB_COMMENT, Puzzle, Unsolved, Wrong, is_stub,
                                                  short)
from paged_tutorial.teaching.harness.engine_harness import engine_with_cache, run, tiny_model
from paged_tutorial.teaching.harness.faults import is_checker_fault
from paged_tutorial.teaching.verdict import Verdict, unsolved

#: what an engine run draws from: layers, tokens per block, slots
LAYER_CHOICES = (2, 3)
BLOCK_SIZE_CHOICES = (8, 12, 16)
#: the block size among them that is not a power of two: the probe or the engine run takes it,
#: so a block count by shift or mask fails
UNEVEN_BLOCK_SIZE = 12
SLOT_CHOICES = (2, 3)
#: how many streams are drawn, at most, before one meets 0 < free < needed
DRAW_ATTEMPTS = 40
DTYPE = "float32"                              # recomputing a preempted request is exact


class AllocatorBase(BlockAllocator):
    """The article's accounting with the two methods that move blocks left to write:
    ``ensure_capacity(slot, new_len)`` and ``release(slot)`` (until written they raise, saying
    so).  What it gives them: ``self.free_blocks`` (the stack, a list), ``self.table``
    (``assign(slot, layer, logical, block)``, ``unassign(slot, layer, logical)`` -> the block it
    held, ``entries``: the NumPy table [slot, layer, logical block], -1 = none),
    ``self.config`` (``num_layers``, ``BLOCK_SIZE``, ``MAX_BLOCKS_PER_SEQ``,
    ``blocks_for_tokens(n)``).  The scheduler asks ``can_grow`` / ``can_allocate_prompt``
    before admitting, and a prompt's blocks come from her ``ensure_capacity``."""

    # what the scheduler asks besides growth and release: the article's free-list answers
    evictable_blocks = FreeListAllocator.evictable_blocks
    blocks_available = FreeListAllocator.blocks_available
    prefix_in_flight = FreeListAllocator.prefix_in_flight
    can_allocate_prompt = FreeListAllocator.can_allocate_prompt
    allocate_prompt = FreeListAllocator.allocate_prompt
    commit_step = FreeListAllocator.commit_step
    discard_uncommitted = FreeListAllocator.discard_uncommitted
    check_invariants = FreeListAllocator.check_invariants

    def ensure_capacity(self, slot: int, new_len: int) -> None:
        raise NotImplementedError("write ensure_capacity(self, slot, new_len) in your subclass "
                                  "of AllocatorBase")

    def release(self, slot: int) -> list[int]:
        raise NotImplementedError("write release(self, slot) in your subclass of AllocatorBase")


#: the package's allocators: an answer may not call or inherit their methods (nor the worked
#: solution's, ``exercises.solutions``)
BORROWED = (FreeListAllocator,)
#: the package's modules' names begin so
PACKAGE_PREFIX = "paged_tutorial."
#: the worked solutions' module, named rather than imported (it imports this module)
SOLUTIONS_MODULE = "paged_tutorial.teaching.exercises.solutions"


def borrowed_code(cls) -> str | None:
    """The name of a package allocator or of the worked solution that ``cls`` inherits from or
    that its methods name, else None: such an answer hands the work to code it did not write.
    (The worked solution itself, passed as it is, is what ``reveal`` gives: not refused.)"""
    def borrowed(value) -> bool:
        if isinstance(value, type) and issubclass(value, BORROWED) and \
                value.__module__.startswith(PACKAGE_PREFIX):    # hers may derive from one
            return True
        return getattr(value, "__module__", None) == SOLUTIONS_MODULE and value is not cls

    for base in cls.__mro__:
        if base in (AllocatorBase, BlockAllocator, object):
            continue
        if base is not cls and borrowed(base):        # named as the base it borrows from
            return f"{base.__module__}.{base.__qualname__}"
        for value in vars(base).values():
            fn = getattr(value, "__func__", value)
            code = getattr(fn, "__code__", None)
            if code is None:
                continue
            names = _names(code)
            for name in names:
                imported = name in ("solutions", SOLUTIONS_MODULE) or \
                    name in {b.__name__ for b in BORROWED}        # imported inside the method
                if imported or borrowed(fn.__globals__.get(name)):
                    return say(en=f"{name} (in {fn.__name__})", ko=f"{fn.__name__} 안의 {name}")
    return None


def _names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _wrong_rule(slot, new_len, before, after, c) -> str | None:
    """What an ``ensure_capacity`` that returned did wrong to the table, or None."""
    n_logical = c.blocks_for_tokens(new_len)
    overwritten = np.argwhere((before[slot] >= 0) & (after[slot] != before[slot]))
    if overwritten.size:
        layer, lb = (int(x) for x in overwritten[0])
        return say(en=f"ensure_capacity(slot={slot}, new_len={new_len}) overwrote "
                      f"block_table[{slot}, {layer}, {lb}] = {int(before[slot, layer, lb])} "
                      f"with {int(after[slot, layer, lb])}: that block is lost (pop only "
                      "where the entry is -1)",
                   ko=f"ensure_capacity(slot={slot}, new_len={new_len})가 "
                      f"block_table[{slot}, {layer}, {lb}] = {particle(int(before[slot, layer, lb]), '을/를')} "
                      f"{particle(int(after[slot, layer, lb]), '으로/로')} 덮어썼습니다: 그 블록은 잃어버립니다 "
                      "(항목이 -1일 때만 꺼내세요)")
    beyond = np.argwhere(after[slot, :, n_logical:] >= 0)
    if beyond.size:
        layer, lb = int(beyond[0][0]), int(beyond[0][1]) + n_logical
        return say(en=f"ensure_capacity(slot={slot}, new_len={new_len}) gave logical block {lb} "
                      f"(layer {layer}) a block, but positions < {new_len} need only "
                      f"{n_logical} logical blocks: a decode step pops only when its token is "
                      "the first row of a new block (rule 2)",
                   ko=f"ensure_capacity(slot={slot}, new_len={new_len})가 논리 블록 {lb} "
                      f"(레이어 {layer})에 블록을 줬지만, {new_len}보다 작은 위치에는 논리 블록 "
                      f"{n_logical}개면 충분합니다: 디코드는 쓰는 토큰이 새 블록의 첫 행일 때만 "
                      "꺼냅니다 (규칙 2)")
    missing = np.argwhere(after[slot, :, :n_logical] < 0)
    if missing.size:
        layer, lb = (int(x) for x in missing[0])
        return say(en=f"after ensure_capacity(slot={slot}, new_len={new_len}), "
                      f"block_table[{slot}, {layer}, {lb}] is still -1, yet positions up to "
                      f"{new_len - 1} are written: every layer's logical blocks below "
                      f"blocks_for_tokens({new_len}) = {n_logical} need a block (a prefill pops "
                      "for each -1 entry, rule 1; a decode step for a token that starts a "
                      "block, rule 2)",
                   ko=f"ensure_capacity(slot={slot}, new_len={new_len}) 뒤에도 "
                      f"{particle(f'block_table[{slot}, {layer}, {lb}]', '이/가')} -1인데, 위치 {new_len - 1}까지 "
                      f"씁니다: 모든 레이어의 논리 블록 0..{n_logical - 1}에 블록이 있어야 "
                      "합니다 (프리필은 -1 항목마다 꺼내고(규칙 1), 디코드는 토큰이 블록을 "
                      "시작할 때 꺼냅니다(규칙 2))")
    return None


def checked(cls):
    """``cls`` with every ``ensure_capacity`` and ``release`` checked as it returns (or
    raises); a wrong one raises ``Wrong`` naming the call.  ``events`` keeps (kind, block)."""

    class Checked(cls):
        life: list = []                         # (kind, block) of every pop and push

        def ensure_capacity(self, slot, new_len):
            c = self.config
            before, free = self.table.entries.copy(), list(self.free_blocks)
            state = _state(self)
            need = int(((before[slot, :, :c.blocks_for_tokens(new_len)]) < 0).sum())
            call = f"ensure_capacity(slot={slot}, new_len={new_len})"
            try:
                with through_the_api(self.table):
                    super().ensure_capacity(slot, new_len)
            except CacheFullError:
                if not np.array_equal(self.table.entries, before) or self.free_blocks != free \
                        or not _same_state(state, _state(self)):
                    raise Wrong(say(
                        en=f"{call} raised CacheFullError after changing the table or "
                           "free_blocks: the scheduler preempts and retries, so the failed call "
                           "must change nothing (count first, then pop)",
                        ko=f"{particle(call, '이/가')} 테이블이나 free_blocks를 바꾼 뒤 CacheFullError를 "
                           "냈습니다: 스케줄러는 선점하고 다시 부르므로, 실패한 호출은 아무것도 "
                           "바꾸지 않아야 합니다 (먼저 세고 나서 꺼내세요)")) from None
                if need <= len(free):
                    raise Wrong(say(
                        en=f"{call} raised CacheFullError with {len(free)} blocks free and "
                           f"{need} needed",
                        ko=f"{particle(call, '이/가')} 블록 {len(free)}개가 남아 있고 {need}개만 필요한데 "
                           "CacheFullError를 냈습니다")) from None
                raise
            except (Wrong, Unsolved):
                raise
            except NotImplementedError:
                raise Unsolved(say(en="write ensure_capacity and release",
                                   ko="ensure_capacity와 release를 작성하세요")) from None
            except BehindTheApi:
                raise Wrong(behind_the_api_message(cls, "ensure_capacity")) from None
            except IndexError as exc:
                if is_checker_fault(exc):
                    raise
                if len(free) < need:
                    raise Wrong(say(
                        en=f"{call} needs {need} blocks with {len(free)} free and popped from an "
                           f"empty free_blocks ({exc}): your allocator never preempts.  When "
                           "too few blocks are free, raise CacheFullError before popping; the "
                           "scheduler then preempts a request and frees its blocks",
                        ko=f"{particle(call, '은/는')} 블록 {need}개가 필요한데 {len(free)}개만 남았고, 빈 "
                           f"free_blocks에서 꺼냈습니다 ({error_text('IndexError', str(exc))}): 이 할당기는 선점을 일으키지 "
                           "못합니다.  블록이 모자라면 꺼내기 전에 CacheFullError를 내세요; "
                           "그러면 스케줄러가 요청 하나를 선점해 블록을 돌려받습니다")) from None
                raise Wrong(say(en=f"{call} raised IndexError: {exc}",
                                ko=f"{call}에서 예외 발생: {exception_text(exc)}")) from None
            except Exception as exc:
                if is_checker_fault(exc):
                    raise
                raise Wrong(say(en=f"{call} raised {type(exc).__name__}: {exc}",
                                ko=f"{call}에서 예외 발생: {exception_text(exc)}")) from None
            after = self.table.entries
            problem = _wrong_rule(slot, new_len, before, after, c)
            if problem is None:
                self.life.extend(("pop", int(b)) for b in after[(before < 0) & (after >= 0)])
                return
            if need > len(free):
                problem = say(
                    en=f"{call} needs {need} blocks, only {len(free)} are free, and it returned "
                       "without them: your allocator never preempts.  Raise CacheFullError "
                       "(changing nothing); the scheduler then preempts a request",
                    ko=f"{particle(call, '은/는')} 블록 {need}개가 필요한데 {len(free)}개만 남았고, 블록 없이 "
                       "그냥 돌아왔습니다: 이 할당기는 선점을 일으키지 못합니다.  (아무것도 "
                       "바꾸지 말고) CacheFullError를 내세요; 그러면 스케줄러가 요청 하나를 "
                       "선점합니다")
            raise Wrong(problem)

        def release(self, slot):
            before, free = self.table.entries.copy(), list(self.free_blocks)
            call = f"release(slot={slot})"
            try:
                with through_the_api(self.table):
                    returned = super().release(slot)
            except (Wrong, Unsolved):
                raise
            except NotImplementedError:
                raise Unsolved(say(en="write ensure_capacity and release",
                                   ko="ensure_capacity와 release를 작성하세요")) from None
            except BehindTheApi:
                raise Wrong(behind_the_api_message(cls, "release")) from None
            except Exception as exc:
                if is_checker_fault(exc):
                    raise
                raise Wrong(say(en=f"{call} raised {type(exc).__name__}: {exc}",
                                ko=f"{call}에서 예외 발생: {exception_text(exc)}")) from None
            walk = [int(b) for b in before[slot].ravel() if b >= 0]     # main.cpp:1018-1029
            if self.free_blocks[:len(free)] != free:
                raise Wrong(say(en=f"{call} changed the free blocks already there: release only "
                                   "pushes onto the end of free_blocks",
                                ko=f"{particle(call, '이/가')} 이미 있던 free_blocks를 바꿨습니다: 반납은 "
                                   "free_blocks 끝에 밀어 넣기만 합니다"))
            pushed = [int(b) for b in self.free_blocks[len(free):]]
            twice = sorted({b for b in pushed if pushed.count(b) > 1 or b in free})
            if twice:
                raise Wrong(say(en=f"{call} pushed block(s) {twice[:6]} that are already free "
                                   "(a double free): the next two pops would hand the same block "
                                   "to two owners",
                                ko=f"{particle(call, '이/가')} 빈 블록 목록에 이미 있는 블록 {particle(twice[:6], '을/를')} 또 밀어 "
                                   "넣었습니다 (이중 반납): 다음 두 번의 pop이 같은 블록을 두 "
                                   "주인에게 줍니다"))
            if -1 in pushed:
                raise Wrong(say(en=f"{call} pushed -1: that entry is unassigned, not a block",
                                ko=f"{particle(call, '이/가')} -1을 밀어 넣었습니다: -1은 블록이 아니라 빈 "
                                   "항목입니다"))
            lost = sorted(set(walk) - set(pushed))
            if lost or (self.table.entries[slot] >= 0).any():
                raise Wrong(say(en=f"{call}: slot {slot} owned {len(walk)} blocks, "
                                   f"{len(pushed)} were pushed back" +
                                   (f"; never pushed: {lost[:6]} (they leak)" if lost else "") +
                                   ("; entries of the slot are still set (reset them to -1: "
                                    "use table.unassign)" if (self.table.entries[slot] >= 0).any()
                                    else ""),
                                ko=f"{call}: 슬롯 {particle(slot, '은/는')} 블록 {len(walk)}개를 가졌는데 "
                                   f"{len(pushed)}개만 돌려줬습니다" +
                                   (f"; 돌려주지 않은 블록 {lost[:6]} (새어 나갑니다)" if lost else
                                    "") +
                                   ("; 슬롯의 항목이 아직 남아 있습니다 (table.unassign으로 -1로 "
                                    "되돌리세요)" if (self.table.entries[slot] >= 0).any()
                                    else "")))
            if pushed != walk:
                first = next(i for i, (a, b) in enumerate(zip(pushed, walk)) if a != b)
                raise Wrong(say(en=f"{call} pushed {short(pushed)}; the article's loop (layer "
                                   f"by layer, logical block by logical block) pushes "
                                   f"{short(walk)}: they part at push {first}, so the next "
                                   "request pops other blocks than in the article's engine",
                                ko=f"{particle(call, '이/가')} {short(pushed)} 순서로 밀어 넣었습니다; 글의 "
                                   f"루프(레이어 바깥, 논리 블록 안쪽)는 {short(walk)}입니다: "
                                   f"{first}번째 push부터 달라서, 다음 요청이 글의 엔진과 다른 "
                                   "블록을 꺼냅니다"))
            if returned is None or [int(b) for b in returned] != pushed:
                raise Wrong(say(en=f"{call} returned {short(returned)}; it must return the list "
                                   "of blocks it pushed, in order (the contract of release)",
                                ko=f"{particle(call, '이/가')} {particle(short(returned), '을/를')} 돌려줬습니다; 밀어 넣은 블록의 "
                                   "리스트를 그 순서대로 돌려줘야 합니다 (release의 약속)"))
            self.life.extend(("push", b) for b in pushed)
            return returned

    return Checked


#: the table's methods that edit entries: the only way an allocator may write the table (they
#: record what changed, so the device copy hears of it)
TABLE_EDITS = ("assign", "assign_entries", "assign_columns", "unassign", "unassign_column",
               "unassign_slot")


class BehindTheApi(Exception):
    """The answer wrote ``table.entries`` itself instead of through the table's methods."""


@contextlib.contextmanager
def through_the_api(table):
    """While the answer runs, ``table.entries`` can be written only by the table's own edit
    methods (``TABLE_EDITS``); a direct write raises ``BehindTheApi``."""
    entries = table.entries
    was = entries.flags.writeable

    def editing(method):
        def edit(*args, **kwargs):
            entries.flags.writeable = True
            try:
                return method(*args, **kwargs)
            finally:
                entries.flags.writeable = False
        return edit

    for name in TABLE_EDITS:
        if hasattr(table, name):
            setattr(table, name, editing(getattr(table, name)))
    entries.flags.writeable = False
    try:
        yield
    except ValueError as exc:
        if "read-only" in str(exc):
            raise BehindTheApi() from None
        raise
    finally:
        entries.flags.writeable = was
        for name in TABLE_EDITS:
            vars(table).pop(name, None)


def behind_the_api_message(cls, method: str) -> str:
    where = f"{getattr(cls, '__name__', 'your class')}.{method}"
    return say(en=f"{where} wrote self.table.entries directly: the table records each edit made "
                  "with self.table.assign / unassign so that the device copy the kernels read "
                  "is updated; an entry written behind them never reaches the GPU.  Edit the "
                  "table only through its methods",
               ko=f"{particle(where, '이/가')} self.table.entries에 직접 썼습니다: 테이블은 "
                  "self.table.assign / unassign으로 한 수정만 기록해 커널이 읽는 디바이스 "
                  "사본에 보냅니다; 그 밖에서 쓴 항목은 GPU에 닿지 않습니다.  테이블은 그 "
                  "메서드로만 고치세요")


def _state(allocator) -> dict:
    """Everything the allocator holds besides the table, config and listeners, copied."""
    import copy

    skip = {"table", "config", "events", "life"}
    out = {}
    for key, value in vars(allocator).items():
        if key not in skip:
            try:
                out[key] = copy.deepcopy(value)
            except Exception:          # something that cannot be copied is compared by identity
                out[key] = value
    return out


def _same_state(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(np.asarray(x), np.asarray(y)):
                return False
        else:
            try:
                if x != y:
                    return False
            except Exception:
                if x is not y:
                    return False
    return True


def probe_full(cls, bs: int = 16) -> str:
    """Two calls where 0 < free blocks < needed, at a table layout drawn afresh with ``bs``
    tokens per block: a prompt that needs more blocks than are free, and a decode step that
    starts a new block in every layer with one block fewer free than layers.  Each must raise
    CacheFullError and change nothing.  Then the same decode step with exactly as many blocks
    free as layers, a slot that owns blocks grown by two or three blocks in one call (the
    contract backs every position below new_len, not only a decode step's), and, with no block
    free at all, a slot that grows within the blocks it owns, which must succeed.  Returns the
    layouts probed."""
    from paged_tutorial.config import CacheConfig
    from paged_tutorial.teaching.harness import shapes

    rng, seed = shapes.fresh_rng()
    num_layers = int(rng.integers(4, 6))              # the engine run has 2 or 3 layers
    first = int(rng.integers(1, 3 * bs))              # slot 0's tokens
    owned = -(-first // bs) * num_layers
    grow_to = -(-first // bs) * bs + 1                # slot 0's next token starts a block
    prompt = int(rng.integers(bs + 1, 3 * bs))         # slot 1's prompt
    prompt_need = -(-prompt // bs) * num_layers
    # a slot that owns blocks grows by two or three logical blocks in one call, ending inside
    # a block (the contract: positions < new_len backed, however far they reach)
    jump_to = -(-first // bs) * bs + int(rng.integers(1, 3)) * bs + int(rng.integers(2, bs))
    jump_need = (-(-jump_to // bs) - -(-first // bs)) * num_layers
    # to the end of slot 0's last block: no block needed
    within = -(-first // bs) * bs
    probed = []
    for call in ("prompt", "decode", "exact", "jump", "within"):
        # 0 < free < needed; a decode step is one short of a block per layer, then has exactly
        # one per layer; the long growth has a block to spare; growth within owned blocks with
        # none free
        free = {"prompt": int(rng.integers(1, num_layers)), "decode": num_layers - 1,
                "exact": num_layers, "jump": jump_need + 1, "within": 0}[call]
        config = CacheConfig(num_layers=num_layers, num_kv_heads=1, head_dim=8,
                             dtype="float32", kv_cache_bytes=(owned + free) * 2 * bs * 8 * 4,
                             max_slots=2, max_seq_len=6 * bs, block_size=bs)
        Checked = checked(cls)
        cache = PagedKVCache(config, "cpu", allocator=lambda c, t, e: Checked(c, t, e))
        allocator = cache.allocator
        allocator.life = []
        try:
            allocator.ensure_capacity(0, first)
        except Wrong as wrong:
            raise Wrong(f"[{num_layers} layers, BLOCK_SIZE {bs}, NUM_BLOCKS {config.NUM_BLOCKS}, "
                        f"seed {seed}] {wrong.message}") from None
        slot, new_len = {"prompt": (1, prompt), "jump": (0, jump_to),
                         "within": (0, within)}.get(call, (0, grow_to))
        if call == "within":
            try:
                allocator.ensure_capacity(slot, new_len)
            except Wrong as wrong:
                raise Wrong(say(
                    en=f"[{num_layers} layers, BLOCK_SIZE {bs}, no block free, slot 0 holding "
                       f"{first} tokens grows to {new_len} within the blocks it owns, seed "
                       f"{seed}] {wrong.message}",
                    ko=f"[레이어 {num_layers}개, BLOCK_SIZE {bs}, 빈 블록 없음, 토큰 {first}개를 "
                       f"가진 슬롯 0이 가진 블록 안에서 {new_len}개로 자람, 시드 {seed}] "
                       f"{wrong.message}")) from None
            continue
        if call == "exact":
            try:
                allocator.ensure_capacity(slot, new_len)
            except Wrong as wrong:
                raise Wrong(f"[{num_layers} layers, BLOCK_SIZE {bs}, exactly {free} blocks free "
                            f"for a decode step that starts a block in each of them, seed "
                            f"{seed}] {wrong.message}") from None
            continue
        if call == "jump":
            try:
                allocator.ensure_capacity(slot, new_len)
            except (Wrong, CacheFullError) as wrong:
                message = getattr(wrong, "message", None) or say(
                    en=f"it raised CacheFullError with {free} blocks free and {jump_need} "
                       "needed",
                    ko=f"블록 {free}개가 남아 있고 {jump_need}개만 필요한데 CacheFullError를 "
                       "냈습니다")
                raise Wrong(say(
                    en=f"[{num_layers} layers, BLOCK_SIZE {bs}, slot 0 holding {first} tokens "
                       f"grows to {new_len} in one call, {free} blocks free, seed {seed}] "
                       f"{message}",
                    ko=f"[레이어 {num_layers}개, BLOCK_SIZE {bs}, 토큰 {first}개를 가진 슬롯 "
                       f"0이 한 번의 호출로 {new_len}개로 자람, 빈 블록 {free}개, 시드 {seed}] "
                       f"{message}")) from None
            continue
        need = int((allocator.table.entries[slot, :, :config.blocks_for_tokens(new_len)]
                    < 0).sum())
        where = say(en=f"{num_layers} layers, BLOCK_SIZE {bs}, NUM_BLOCKS {config.NUM_BLOCKS}, "
                       f"slot 0 holding {first} tokens; ensure_capacity(slot={slot}, "
                       f"new_len={new_len}) needs {need} blocks with "
                       f"{len(allocator.free_blocks)} free (seed {seed})",
                    ko=f"레이어 {num_layers}개, BLOCK_SIZE {bs}, NUM_BLOCKS {config.NUM_BLOCKS}, "
                       f"슬롯 0에 토큰 {first}개; ensure_capacity(slot={slot}, new_len={new_len})에 "
                       f"블록 {need}개가 필요하고 {len(allocator.free_blocks)}개가 남음 (시드 {seed})")
        try:
            allocator.ensure_capacity(slot, new_len)
        except CacheFullError:
            probed.append(where)
            continue
        except Wrong as wrong:
            raise Wrong(f"[{where}] {wrong.message}") from None
        raise Wrong(say(en=f"[{where}] it returned without raising CacheFullError",
                        ko=f"[{where}] CacheFullError를 내지 않고 돌아왔습니다"))
    return "; ".join(probed)


@dataclass(frozen=True)
class Scenario:
    """One engine run of the grader, drawn afresh for every check: the table layout (layers,
    BLOCK_SIZE, slots), a cache of ``num_blocks`` blocks too small for the request stream, and
    the stream itself (prompt and new tokens of each request, in arrival order), such that the
    article's engine meets a decode step that needs more blocks than are free while some are
    (0 < free < needed): that call must raise CacheFullError and change nothing."""

    requests: tuple                     # ((prompt ids, max_tokens), ...) in arrival order
    num_layers: int
    block_size: int
    max_slots: int
    max_seq_len: int
    num_blocks: int
    seed: int

    def describe(self) -> str:
        lens = ", ".join(f"{len(p)}+{m}" for p, m in self.requests)
        return say(en=f"{self.num_layers} layers, BLOCK_SIZE {self.block_size}, "
                      f"{self.max_slots} slots, NUM_BLOCKS {self.num_blocks}, "
                      f"{len(self.requests)} requests in this order (prompt + new tokens: "
                      f"{lens}), seed {self.seed}",
                   ko=f"레이어 {self.num_layers}개, BLOCK_SIZE {self.block_size}, 슬롯 "
                      f"{self.max_slots}개, NUM_BLOCKS {self.num_blocks}, 이 순서로 온 요청 "
                      f"{len(self.requests)}개 (프롬프트 + 새 토큰: {lens}), 시드 {self.seed}")


class _FindsShortfall(FreeListAllocator):
    """The article's allocator, noting every refused call made while blocks were free."""

    shortfalls = 0

    def ensure_capacity(self, slot, new_len):
        try:
            super().ensure_capacity(slot, new_len)
        except CacheFullError:
            if self.free_blocks:
                type(self).shortfalls += 1
            raise


def _draw_candidate(rng, seed: int, block_size: int | None) -> Scenario:
    layers = shapes.pick(rng, LAYER_CHOICES)
    bs = block_size or shapes.pick(rng, BLOCK_SIZE_CHOICES)
    slots = shapes.pick(rng, SLOT_CHOICES)
    per_seq = int(rng.integers(3, 5))                   # logical blocks one request may reach
    max_seq_len = per_seq * bs
    requests = []
    for _ in range(slots + int(rng.integers(0, 2))):
        prompt = int(rng.integers(1, max_seq_len - bs))
        total = int(rng.integers(prompt + 2, max_seq_len + 1))
        ids = tuple(int(t) for t in rng.integers(3, 64, prompt))
        requests.append((ids, total - prompt))
    largest = max(-(-(len(p) + m) // bs) for p, m in requests) * layers
    # room for the largest request alone (and one more block), short of all of them at once
    num_blocks = largest + int(rng.integers(1, layers + 1))
    return Scenario(tuple(requests), layers, bs, slots, max_seq_len, num_blocks, seed)


def draw_scenario(block_size: int | None = None) -> Scenario:
    """A scenario no earlier check ran (with ``block_size`` tokens per block, if given), in
    which the article's engine meets 0 < free < needed at least once."""
    rng, seed = shapes.fresh_rng()
    for _ in range(DRAW_ATTEMPTS):
        scenario = _draw_candidate(rng, seed, block_size)
        _FindsShortfall.shortfalls = 0
        engine = _engine(scenario, lambda c, t, e: _FindsShortfall(c, t, e))
        run(engine, scenario.requests)
        if _FindsShortfall.shortfalls:
            return scenario
    raise RuntimeError(f"no request stream drawn from seed {seed} made the article's engine "
                       f"run short of blocks in {DRAW_ATTEMPTS} tries")


def _engine(scenario: Scenario, allocator_class=None, max_slots: int | None = None):
    from paged_tutorial.config import CacheConfig

    model = tiny_model(scenario.num_layers, dtype=DTYPE)
    block_bytes = CacheConfig.for_model(model.config, dtype=model.dtype,
                                        block_size=scenario.block_size).BLOCK_BYTES
    factory = None
    if allocator_class is not None:
        def factory(config, device):
            return PagedKVCache(config, device, allocator=allocator_class)
    return engine_with_cache(model, factory, backend="torch", device="cpu",
                             max_slots=max_slots or scenario.max_slots,
                             max_seq_len=scenario.max_seq_len, block_size=scenario.block_size,
                             kv_cache_bytes=scenario.num_blocks * block_bytes)


def stock_run(scenario: Scenario):
    engine = _engine(scenario)
    states = run(engine, scenario.requests)
    return states, [engine.result(i).token_ids for i in range(len(scenario.requests))]


def solo_tokens(scenario: Scenario) -> tuple:
    """Each request served alone, in a cache of the same layout: the tokens every run must
    give."""
    out = []
    for prompt, max_new in scenario.requests:
        engine = _engine(scenario, max_slots=1)
        out.append(engine.generate([list(prompt)], max_tokens=max_new, temperature=0.0,
                                   seed=0)[0].token_ids)
    return tuple(out)


def grade(cls) -> str:
    borrowed = borrowed_code(cls)
    if borrowed is not None:
        raise Wrong(say(
            en=f"your allocator hands its work to the package's own allocator ({borrowed}): "
               "write ensure_capacity and release yourself, with self.free_blocks and "
               "self.table",
            ko=f"여러분의 할당기가 패키지의 할당기({borrowed})에 일을 넘깁니다: ensure_capacity와 "
               "release를 self.free_blocks와 self.table로 직접 작성하세요"))
    # the probe and the engine run use different block sizes: BLOCK_SIZE is not a constant
    rng, _ = shapes.fresh_rng()
    probe_bs, run_bs = shapes.distinct(rng, BLOCK_SIZE_CHOICES, 2)
    if UNEVEN_BLOCK_SIZE not in (probe_bs, run_bs):        # one of them not a power of two
        probe_bs, run_bs = ((UNEVEN_BLOCK_SIZE, run_bs) if rng.integers(0, 2)
                            else (probe_bs, UNEVEN_BLOCK_SIZE))
    probed = probe_full(cls, probe_bs)
    scenario = draw_scenario(run_bs)
    try:
        return _run_engine(cls, scenario, probed)
    except Wrong as wrong:
        raise Wrong(f"[{scenario.describe()}] {wrong.message}", wrong.figure) from None


def _run_engine(cls, scenario: Scenario, probed: str) -> str:
    requests = scenario.requests
    stock, stock_tokens = stock_run(scenario)
    solo = solo_tokens(scenario)
    Checked = checked(cls)
    engine = _engine(scenario, lambda config, table, events: Checked(config, table, events))
    life = engine.cache.allocator.life = []

    def after_step(state):
        engine.cache.check_invariants()
    try:
        mine, diff = run(engine, requests, against=stock, compare_blocks=True,
                         after_step=after_step)
    except AssertionError as exc:
        if is_checker_fault(exc):
            raise
        raise Wrong(say(en=f"the cache's invariants broke: {exc}",
                        ko=f"캐시의 불변식이 깨졌습니다: "
                           f"{error_text('AssertionError', str(exc))}")) from None
    except ValueError as exc:          # the engine's check of a -1 entry before a write
        if is_checker_fault(exc):
            raise
        raise Wrong(say(en=f"the engine stopped: {str(exc).splitlines()[0]}",
                        ko=f"엔진이 멈췄습니다: "
                           f"{error_text('ValueError', str(exc).splitlines()[0])}")) from None
    if diff is not None:
        i, what = diff
        raise Wrong(_describe_difference(mine, stock, i, what))
    tokens = [engine.result(i).token_ids for i in range(len(requests))]
    for r, (got, alone) in enumerate(zip(tokens, solo)):
        if got != alone:
            raise Wrong(say(en=f"r{r} generated {short(got)}, alone it generates {short(alone)}",
                            ko=f"r{particle(r, '이/가')} {particle(short(got), '을/를')} 생성했는데, 혼자 돌면 "
                               f"{short(alone)}입니다"))
    preempted = sum(engine.result(i).num_preemptions for i in range(len(requests)))
    popped = sum(1 for kind, _ in life if kind == "pop")
    pushes = len(life) - popped
    return say(en=f"{scenario.describe()}, with your allocator: {len(mine)} steps, "
                  f"{preempted} preemption(s), {popped} pops and {pushes} pushes; the table and free_blocks equal the article's engine's after "
                  "every step, the invariants held, and every request's tokens equal its solo "
                  f"run.  With fewer blocks free than needed it raised CacheFullError and changed "
                  f"nothing ({probed})",
               ko=f"{scenario.describe()}, 직접 쓴 할당기로: 스텝 {len(mine)}번, 선점 "
                  f"{preempted}번, pop {popped}번, push {pushes}번; 매 스텝 테이블과 free_blocks가 글의 엔진과 같고, 불변식이 지켜졌고, "
                  "모든 요청의 토큰이 혼자 돌 때와 같습니다.  필요한 것보다 적은 블록이 남았을 때 "
                  f"CacheFullError를 내고 아무것도 바꾸지 않았습니다 ({probed})")


def _describe_difference(mine, stock, i, what) -> str:
    if what == "length":
        return say(en=f"the run took {len(mine)} steps or more; the article's engine took "
                      f"{len(stock)}",
                   ko=f"실행이 스텝 {len(mine)}번 이상 걸렸습니다; 글의 엔진은 스텝 "
                      f"{len(stock)}번입니다")
    m, s = mine[i], stock[i]
    step = f"step {m.index} ({m.kind})"
    if what == "table":
        slot, layer, lb = (int(x) for x in np.argwhere(m.block_table != s.block_table)[0])
        return say(en=f"after {step}, block_table[{slot}, {layer}, {lb}] is "
                      f"{int(m.block_table[slot, layer, lb])}; in the article's engine it is "
                      f"{int(s.block_table[slot, layer, lb])} (pops take the last block of "
                      "free_blocks, layer by layer, logical block by logical block)",
                   ko=f"스텝 {m.index} ({term(m.kind)}) 뒤 {particle(f'block_table[{slot}, {layer}, {lb}]', '이/가')} "
                      f"{int(m.block_table[slot, layer, lb])}인데, 글의 엔진에서는 "
                      f"{int(s.block_table[slot, layer, lb])}입니다 (pop은 free_blocks의 맨 "
                      "끝 블록을, 레이어 순서, 논리 블록 순서로 꺼냅니다)")
    if what == "free":
        return say(en=f"after {step}, free_blocks ends with {m.free_blocks[-6:]}; in the "
                      f"article's engine it ends with {s.free_blocks[-6:]}",
                   ko=f"스텝 {m.index} ({term(m.kind)}) 뒤 free_blocks의 끝이 {m.free_blocks[-6:]}인데, "
                      f"글의 엔진에서는 {s.free_blocks[-6:]}입니다")
    return say(en=f"{step} differs from the article's engine ({what})",
               ko=f"스텝 {particle(f'{m.index} ({term(m.kind)})', '이/가')} 글의 엔진과 다릅니다 ({what})")


class AllocatorPuzzle(Puzzle):
    """A puzzle whose answer is a class: a subclass of ``AllocatorBase``."""

    @property
    def function_name(self) -> str:
        return self.signature.split("(")[0].replace("class", "").strip()

    @property
    def parameters(self) -> list[str]:
        return ["ensure_capacity", "release"]

    def stub(self) -> str:
        doc = f'    """{str(self.docstring).strip()}\n    """'
        return ("from paged_tutorial.cache import CacheFullError\n\n\n"
                f"{self.signature}\n{doc}\n\n"
                "    def ensure_capacity(self, slot, new_len):\n"
                f'        """{ENSURE_DOC}\n        """\n        ...   # {STUB_COMMENT}\n\n'
                "    def release(self, slot):\n"
                f'        """{RELEASE_DOC}\n        """\n        ...   # {STUB_COMMENT}\n')

    def check_answer(self, answer) -> Verdict | None:
        if not (isinstance(answer, type) and issubclass(answer, AllocatorBase)):
            return Verdict("wrong", say(
                en=f"the answer is a class that subclasses pt.exercises.AllocatorBase (got "
                   f"{short(answer)}): write `class {self.function_name}"
                   "(pt.exercises.AllocatorBase):` with its ensure_capacity and release",
                ko=f"답은 pt.exercises.AllocatorBase를 상속한 클래스입니다 ({particle(short(answer), '을/를')} "
                   f"받았습니다): ensure_capacity와 release를 가진 `class "
                   f"{self.function_name}(pt.exercises.AllocatorBase):`을 쓰세요"))
        missing = [m for m in self.parameters if getattr(answer, m) is getattr(AllocatorBase, m)
                   or is_stub(getattr(answer, m))]
        if missing:
            return Verdict("unsolved", say(
                en=f"write {' and '.join(missing)} (the stub's body is still ...)",
                ko=f"{', '.join(missing)}의 본문을 작성하세요 (아직 ... 입니다)"))
        return None


ENSURE_DOC = Text(
    en="Back positions 0..new_len-1 of `slot` with physical blocks in every layer,\n"
       "        taken from self.free_blocks as the article's engine takes them (the record\n"
       "        above shows its order).  If that cannot be done: raise CacheFullError,\n"
       "        changing nothing.",
    ko="`slot`의 위치 0..new_len-1이 모든 레이어에서 물리 블록을 갖게 합니다. 블록은\n"
       "        글의 엔진처럼 self.free_blocks에서 가져옵니다 (순서는 위의 기록에 있습니다).\n"
       "        그럴 수 없으면 아무것도 바꾸지 말고 CacheFullError를 냅니다.")
RELEASE_DOC = Text(
    en="Give every block `slot` owns back to self.free_blocks, in the order the\n"
       "        article's engine gives them back, leaving `slot` with none; return the\n"
       "        blocks given back, in that order.",
    ko="`slot`이 가진 모든 블록을 글의 엔진과 같은 순서로 self.free_blocks에 돌려주고\n"
       "        `slot`에는 블록을 남기지 않습니다; 돌려준 블록을 그 순서대로 돌려줍니다.")

PUZZLES = (
    AllocatorPuzzle(
        "06.allocator",
        Text(en="your block allocator: pop, release, and what happens when the cache is full",
             ko="직접 만드는 블록 할당기: 꺼내기, 반납, 그리고 캐시가 가득 찼을 때"),
        "class MyAllocator(pt.exercises.AllocatorBase):",
        Text(en="The block manager of the article's engine.  self.free_blocks is the stack of free\n"
                "    physical blocks; self.table.assign(slot, layer, logical, block) and\n"
                "    self.table.unassign(slot, layer, logical) edit the block table\n"
                "    (self.table.entries, -1 = none); self.config has num_layers, BLOCK_SIZE,\n"
                "    MAX_BLOCKS_PER_SEQ and blocks_for_tokens(n).  CacheFullError comes from\n"
                "    paged_tutorial.cache.",
             ko="글의 엔진의 블록 관리자.  self.free_blocks는 빈 물리 블록의 스택;\n"
                "    self.table.assign(slot, layer, logical, block)과\n"
                "    self.table.unassign(slot, layer, logical)이 블록 테이블을 고칩니다\n"
                "    (self.table.entries, -1 = 없음); self.config에 num_layers, BLOCK_SIZE,\n"
                "    MAX_BLOCKS_PER_SEQ, blocks_for_tokens(n)가 있습니다.  CacheFullError는\n"
                "    paged_tutorial.cache에 있습니다."),
        Text(en="Once the slot holds new_len tokens, which of its table entries must name a block, "
                "and which of those already do?  How many blocks is that, and are that many free "
                "before you pop the first?  For release, read the article's loop "
                "(main.cpp:1018-1029): which index runs in the outer loop?",
             ko="슬롯이 토큰 new_len개를 가지게 되면 테이블의 어느 항목이 블록을 가리켜야 하고, "
                "그중 어느 것이 이미 가리키고 있을까요?  그것이 몇 개이고, 첫 블록을 꺼내기 전에 "
                "그만큼 비어 있을까요?  반납은 글의 루프 (main.cpp:1018-1029)를 읽어 보세요: "
                "바깥 루프는 어느 인덱스를 돌까요?"),
        Text(en="two calls that ask for more blocks than are free at a table layout drawn afresh "
                "(four or five layers) and a slot grown by several blocks in one call, then a "
                "real Engine (torch backend) whose cache allocates "
                "with your class, next to a stock engine; its layout (2-3 layers, 2-3 slots, "
                "BLOCK_SIZE 8, 12 or 16: the probe uses another one, and one of the two is 12), "
                "its too small NUM_BLOCKS and "
                "its request stream are drawn afresh for every check, so that a decode step "
                "finds fewer blocks free than it needs, but not none, and the scheduler preempts",
             ko="채점할 때마다 새로 뽑는 테이블 배치(레이어 네 개나 다섯 개)에서 남은 것보다 많은 블록을 "
                "요구하는 호출 두 번과 한 번의 호출로 블록 여러 개만큼 자라는 슬롯, 그리고 직접 쓴 "
                "클래스로 할당하는 캐시를 가진 실제 Engine "
                "(torch 백엔드)과 표준 엔진을 나란히 돌린 실행; 엔진의 배치 (레이어 2-3개, 슬롯 "
                "2-3개, BLOCK_SIZE 8, 12, 16: 앞의 호출은 다른 것이고 둘 중 하나는 12), 모자란 "
                "NUM_BLOCKS, 요청 흐름은 "
                "채점할 때마다 새로 뽑아서, 디코드 스텝이 필요한 것보다 적은 (그러나 0은 아닌) "
                "블록을 만나고 스케줄러가 선점하게 합니다"),
        "main.cpp:266-272, 859-865, 1018-1029", grade, on_host=True),
)
