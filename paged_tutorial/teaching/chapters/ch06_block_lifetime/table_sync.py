"""Puzzle ``06.table_sync``: the article's fourth limit, written by the reader.  The article's
engine copies the whole block table host -> device before every decode layer
(``main.cpp:876``; the comment at ``main.cpp:551`` asks for less); this engine sends only the entries that changed, once per
step (``cache/block_table.py``'s ``device_table``).  The reader writes that sync:
``sync_table(host_table, device_table, changed)`` copies the entries listed in ``changed``
(flat indices whose host value changed since the last sync) from the host table into the device
table.

The grader runs a real decode (torch backend on the CPU; any backend and device can be given),
in a scenario drawn afresh for every check (``draw_scenario``: the table layout and the request
stream, named with its seed in the verdict), whose cache keeps a device table of its own -- a separate tensor even on the CPU, where the
stock cache shares memory -- and brings it up to date with the reader's function before every
step (``SyncedByReader``).  After every sync the device table must equal the host table; the
tokens must equal a stock engine's.  Reads of the device table are counted as well as writes
(on a GPU both are copies): a sync that compares the device table with the host's is refused.
The verdict reports the entries copied per step against the article's whole-table copies.  A sync that copies the whole table gives the right tokens
but is the article's cost, not the fix: it is refused with that count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig
from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Unsolved, Wrong, host_call, is_stub, short
from paged_tutorial.teaching.harness.engine_harness import (TINY, engine_with_cache, run,
                                                            tiny_model)

#: what a scenario draws from: slots, layers, tokens per block, blocks per sequence
SLOT_CHOICES = (2, 3)
LAYER_CHOICES = (2, 3)
BLOCK_SIZE_CHOICES = (8, 16)
BLOCKS_PER_SEQ_CHOICES = (4, 5, 6)
#: the reader's cache holds at least this many blocks more than 65,536 (the article's own 2 GiB
#: Llama cache has 65,536), so block ids need more than 16 bits, signed or not
EXTRA_BLOCKS_CHOICES = (64, 700, 1500)
#: the id ranges the blocks handed out first are taken from, in turn: below 2**15, from 2**15
#: (past int16) and from 2**16 (past uint16) to the cache's last block
ID_RANGE_STARTS = (0, 2 ** 15, 2 ** 16)


@dataclass(frozen=True)
class Scenario:
    """One engine run of the grader, drawn afresh for every check: its table layout (slots,
    layers, BLOCK_SIZE, logical blocks per sequence) and its request stream, with more
    requests than slots (a finished request's slot and blocks are reused), and a first request
    whose decode crosses into a new block."""

    requests: tuple                     # ((prompt ids, max_tokens), ...) in arrival order
    max_slots: int
    num_layers: int
    block_size: int
    max_seq_len: int
    seed: int
    num_blocks: int = 2 ** 16 + EXTRA_BLOCKS_CHOICES[0]     # the reader's cache's blocks

    @property
    def engine(self) -> dict:
        # no CUDA graphs on a GPU: the sync runs before every step
        return dict(max_slots=self.max_slots, max_seq_len=self.max_seq_len,
                    block_size=self.block_size, cuda_graphs=False)

    def hand_out_ids_past_16_bits(self, cache: PagedKVCache) -> None:
        """Order ``cache``'s free list (a stack: the end is popped first) so that the blocks
        handed out come from below 2**15, from 2**15 and from 2**16 in turn: the table then
        holds ids that fit in int16, ids that fit only unsigned, and ids past 16 bits."""
        rng = np.random.default_rng(self.seed)
        bounds = list(zip(ID_RANGE_STARTS, ID_RANGE_STARTS[1:] + (cache.NUM_BLOCKS,)))
        # as many from each range as the table can hold at once, so every block handed out
        # comes from the ranges in turn
        per_range = min([cache.config.block_table_entries] + [hi - lo for lo, hi in bounds])
        ranges = [rng.choice(np.arange(lo, hi), size=per_range, replace=False)
                  for lo, hi in bounds]
        first = [int(b) for trio in zip(*ranges) for b in trio]
        taken = set(first)
        cache.free_blocks[:] = [b for b in cache.free_blocks if b not in taken] + first[::-1]

    def describe(self) -> str:
        lens = ", ".join(f"{len(p)}+{m}" for p, m in self.requests)
        entries = self.max_slots * self.num_layers * (self.max_seq_len // self.block_size)
        return say(en=f"{self.max_slots} slots x {self.num_layers} layers x "
                      f"{self.max_seq_len // self.block_size} logical blocks ({entries} entries), "
                      f"BLOCK_SIZE {self.block_size}, a cache of {self.num_blocks:,} blocks, "
                      f"{len(self.requests)} requests (prompt + new tokens: {lens}), seed "
                      f"{self.seed}",
                   ko=f"슬롯 {self.max_slots}개 x 레이어 {self.num_layers}개 x 논리 블록 "
                      f"{self.max_seq_len // self.block_size}개 (항목 {entries}개), BLOCK_SIZE "
                      f"{self.block_size}, 블록 {self.num_blocks:,}개짜리 캐시, 요청 "
                      f"{len(self.requests)}개 (프롬프트 + 새 토큰: {lens}), 시드 {self.seed}")


def draw_scenario() -> Scenario:
    """A table layout and a request stream no earlier check ran, and a cache of more than
    65,536 blocks (the article's 2 GiB Llama cache has 65,536) whose free list hands out ids
    from below 2**15, from 2**15 and from 2**16 in turn (``hand_out_ids_past_16_bits``), so
    block ids sent in 16 bits or fewer come out wrong."""
    rng, seed = shapes.fresh_rng()
    slots = shapes.pick(rng, SLOT_CHOICES)
    bs = shapes.pick(rng, BLOCK_SIZE_CHOICES)
    max_seq_len = bs * shapes.pick(rng, BLOCKS_PER_SEQ_CHOICES)
    requests = []
    for r in range(slots + int(rng.integers(1, 3))):
        if r == 0:           # a prompt ending inside a block, and a decode into the next one
            prompt = int(rng.integers(0, 2)) * bs + int(rng.integers(1, bs))
            new = -(-prompt // bs) * bs - prompt + int(rng.integers(2, bs))
        else:
            prompt = int(rng.integers(1, max_seq_len // 2))
            new = int(rng.integers(1, max_seq_len // 2))
        ids = tuple(int(t) for t in rng.integers(3, TINY["vocab_size"], prompt))
        requests.append((ids, min(new, max_seq_len - prompt)))
    return Scenario(tuple(requests), slots, shapes.pick(rng, LAYER_CHOICES), bs, max_seq_len,
                    seed, 2 ** 16 + shapes.pick(rng, EXTRA_BLOCKS_CHOICES))


NAMES = ["host_table", "device_table", "changed"]


@dataclass
class _Counts:
    """What the grader keeps of one sync: the device tensor and the entries read and written."""

    tensor: torch.Tensor
    reads: int = 0
    writes: int = 0


#: the live device tables, by key: the grader's side of each ``DeviceTable`` (her function sees
#: only the table's indexing, never the tensor or the counts)
_LIVE: dict[int, _Counts] = {}
_keys = __import__("itertools").count()


class DeviceTable:
    """The device copy of the block table, flat, as the reader's function sees it: index it
    like an array to read or write entries (``device_table[i] = v``, ``device_table[idx] =
    values``); every entry read and every entry written is counted (on a GPU a read is a
    device-to-host copy, a write a host-to-device one).  It holds no tensor and no count of
    its own, and lives only during the sync it was made for."""

    __slots__ = ("_key",)

    def __init__(self, key: int):
        object.__setattr__(self, "_key", key)

    def __setattr__(self, name, value):
        raise AttributeError(f"the device table has indexing only; set entries with "
                             f"device_table[i] = value (not .{name})")

    def _counts(self) -> _Counts:
        counts = _LIVE.get(self._key)
        if counts is None:
            raise RuntimeError("this device table belonged to an earlier sync: use the one "
                               "your function is given")
        return counts

    def __len__(self) -> int:
        return self._counts().tensor.numel()

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @staticmethod
    def _index(key):
        if isinstance(key, torch.Tensor):
            key = key.cpu().numpy()
        if isinstance(key, (list, tuple)) or isinstance(key, np.ndarray):
            key = np.asarray(key)
            return torch.from_numpy(key.astype(bool if key.dtype == bool else np.int64))
        return key

    def _size(self, index) -> int:
        return int(np.arange(len(self))[index.numpy() if isinstance(index, torch.Tensor)
                                        else index].size)

    def __getitem__(self, key):
        counts, index = self._counts(), self._index(key)
        counts.reads += self._size(index)
        value = counts.tensor[index].cpu()
        return value.numpy() if value.dim() else int(value)

    def __setitem__(self, key, value):
        counts, index = self._counts(), self._index(key)
        counts.writes += self._size(index)
        if isinstance(value, torch.Tensor):
            value = value.cpu().numpy()
        counts.tensor[index] = torch.as_tensor(np.asarray(value).astype(np.int32)).to(
            counts.tensor.device)

    def __repr__(self) -> str:
        return f"DeviceTable({len(self)} entries)"


class SyncedByReader(PagedKVCache):
    """A ``PagedKVCache`` whose device block table is a tensor of its own, brought up to date
    by the reader's ``sync_table`` before every step; ``syncs`` keeps (entries changed,
    entries written) of each."""

    def __init__(self, config, device, sync):
        super().__init__(config, device)
        self.sync = sync
        self.device_copy = torch.full(self.block_table.shape, -1, dtype=torch.int32,
                                      device=self.device)
        self.last_synced = self.block_table.reshape(-1).copy()
        self.syncs: list[tuple[int, int]] = []
        self.device_reads: list[int] = []

    def device_block_table(self) -> torch.Tensor:
        host = self.block_table.reshape(-1)
        changed = np.flatnonzero(host != self.last_synced)
        self.last_synced = host.copy()
        key = next(_keys)
        device = _LIVE[key] = _Counts(self.device_copy.view(-1))
        try:
            host_call(self.sync, (host.copy(), DeviceTable(key), [int(i) for i in changed]),
                      NAMES, allow_none=True)
        finally:
            del _LIVE[key]
        self.syncs.append((len(changed), device.writes))
        self.device_reads.append(device.reads)
        stale = np.flatnonzero(self.device_copy.view(-1).cpu().numpy() != host)
        if stale.size:
            i = int(stale[0])
            where = tuple(int(x) for x in np.unravel_index(i, self.block_table.shape))
            skipped = [int(j) for j in changed if j in set(stale.tolist())]
            held, truth = int(self.device_copy.view(-1)[i]), int(host[i])
            bits = bits_kept(held, truth)
            raise Wrong(say(
                en=f"after sync {len(self.syncs)} ({len(changed)} entries changed, you wrote "
                   f"{device.writes}), device entry {i} = block_table{list(where)} holds "
                   f"{held} while the host table holds {truth}; {len(stale)} entries are stale"
                   + (f", changed but not right on the device: {short(skipped)}" if skipped
                      else "")
                   + (f".  {held} is {truth} cut to {bits} bits: this cache has "
                      f"{self.NUM_BLOCKS:,} blocks, more ids than {bits} bits hold; send them as "
                      "the table holds them (int32)" if bits else "")
                   + ".  The kernels would follow the stale entry into another request's block",
                ko=f"{len(self.syncs)}번째 동기화 뒤 (바뀐 항목 {len(changed)}개, 쓴 항목 "
                   f"{device.writes}개), 디바이스 항목 {i} = block_table{particle(list(where), '이/가')} "
                   f"{held}인데 호스트 테이블은 {truth}입니다; "
                   f"낡은 항목 {len(stale)}개"
                   + (f", 바뀌었는데 디바이스 값이 틀린 항목: {short(skipped)}" if skipped else "")
                   + (f".  {particle(str(held), '은/는')} {particle(str(truth), '을/를')} {bits}비트로 "
                      f"자른 값입니다: 이 캐시의 블록은 {self.NUM_BLOCKS:,}개로, {bits}비트에 담기는 "
                      "번호보다 많습니다; 테이블이 담은 그대로 (int32) 보내세요" if bits else "")
                   + ".  커널은 낡은 항목을 따라 다른 요청의 블록을 읽게 됩니다"))
        return self.device_copy


def bits_kept(held: int, truth: int) -> int | None:
    """16 or 8 when ``held`` is ``truth`` cut to that many bits (read back signed or
    unsigned), else None (16 first: an id just past 2**16 cut to 16 bits is also its low byte)."""
    for bits in (16, 8):
        unsigned = truth % 2 ** bits
        if held != truth and held in (unsigned, unsigned - 2 ** bits):
            return bits
    return None


def stock_tokens(scenario: Scenario, backend: str = "torch", device: str = "cpu") -> tuple:
    """The stock engine's tokens, run anew for every grading (beside the reader's engine, in
    the same state of the process: kernels, caches and the model as they are now)."""
    engine = engine_with_cache(tiny_model(scenario.num_layers), backend=backend, device=device,
                               **scenario.engine)
    run(engine, scenario.requests)
    return tuple(tuple(engine.result(i).token_ids) for i in range(len(scenario.requests)))


def grade_on(fn, backend: str = "torch", device: str = "cpu",
             scenario: Scenario | None = None) -> str:
    """Grade ``fn`` on ``backend`` (``"numba"`` with ``device="cuda"`` on a GPU), in
    ``scenario`` (default: one drawn afresh); a wrong verdict names the scenario."""
    if is_stub(fn):
        raise Unsolved(say(en="sync_table is still the stub: write its body",
                           ko="sync_table이 아직 빈 함수입니다: 본문을 작성하세요"))
    scenario = scenario or draw_scenario()
    try:
        return _grade_in(fn, scenario, backend, device)
    except Wrong as wrong:
        raise Wrong(f"[{scenario.describe()}] {wrong.message}", wrong.figure) from None


def _grade_in(fn, scenario: Scenario, backend: str, device: str) -> str:
    requests = scenario.requests
    stock = stock_tokens(scenario, backend, device)
    caches = []

    def factory(config, dev):
        caches.append(SyncedByReader(config, dev, fn))
        scenario.hand_out_ids_past_16_bits(caches[-1])
        return caches[-1]
    model = tiny_model(scenario.num_layers)
    block_bytes = CacheConfig.for_model(model.config, dtype=model.dtype, kv_cache_bytes=1 << 62,
                                        block_size=scenario.block_size).BLOCK_BYTES
    engine = engine_with_cache(model, factory, backend=backend, device=device,
                               kv_cache_bytes=scenario.num_blocks * block_bytes,
                               **scenario.engine)
    # every sync leaves the device table equal to the host's or raises Wrong: the engine
    # follows the same entries as the stock engine's
    run(engine, requests)
    cache = caches[0]
    syncs = cache.syncs
    changed = sum(c for c, _ in syncs)
    written = sum(w for _, w in syncs)
    tokens = tuple(tuple(engine.result(i).token_ids) for i in range(len(requests)))
    if tokens != stock:
        r = next(i for i, (a, b) in enumerate(zip(tokens, stock)) if a != b)
        raise Wrong(say(en=f"r{r} generated {short(list(tokens[r]))}; the stock engine "
                           f"{short(list(stock[r]))}",
                        ko=f"r{particle(r, '이/가')} {particle(short(list(tokens[r])), '을/를')} 생성했는데 표준 엔진은 "
                           f"{short(list(stock[r]))}입니다"))
    entries = cache.config.block_table_entries
    layers = cache.config.num_layers
    # the article's habit is a whole-table copy at every sync that sends anything; a sync that
    # writes around each change may also reach the whole table in a step where many changed,
    # so it is named for what it does (more than changed), not for the article's cost
    whole = sum(1 for c, w in syncs if w >= entries and c < entries)
    if whole < sum(1 for c, w in syncs if w > c):
        whole = 0
    article = len(syncs) * entries * layers
    per_step = ", ".join(str(w) for _, w in syncs if w)
    read = sum(cache.device_reads)
    if read:
        worst = max(cache.device_reads)
        raise Wrong(say(
            en=f"the tokens are right, but your sync read {read} entries of the device table in "
               f"all (up to {worst} in one step, {entries} entries in the table): every read is "
               "a device-to-host copy, so comparing the device table with the host's costs what "
               "copying the whole table costs.  The host table and `changed` already say what "
               "to send",
            ko=f"토큰은 맞지만, 동기화가 디바이스 테이블의 항목을 모두 {read}칸 읽었습니다 (한 스텝에 "
               f"최대 {worst}칸, 테이블 전체는 {entries}칸): 읽기 하나하나가 디바이스에서 호스트로의 "
               "복사라서, 디바이스 테이블을 호스트 테이블과 비교하는 것은 테이블 전체를 복사하는 것만큼 "
               "듭니다.  무엇을 보낼지는 호스트 테이블과 `changed`가 이미 알려 줍니다"))
    if whole:
        raise Wrong(say(
            en=f"the tokens are right, but {whole} of {len(syncs)} syncs copied the whole table "
               f"({entries} entries): {written} entries in all where {changed} changed.  That is "
               "the article's cost (main.cpp:876 copies all of it, in every decode layer); copy "
               "only the entries in `changed`",
            ko=f"토큰은 맞지만, 동기화 {len(syncs)}번 중 {whole}번이 테이블 전체({entries}칸)를 "
               f"복사했습니다: 바뀐 것은 {changed}칸인데 모두 {written}칸.  그것이 글의 비용입니다 "
               "(main.cpp:876은 디코드 레이어마다 테이블 전체를 복사합니다); `changed`에 든 항목만 "
               "복사하세요"))
    if written > changed:
        raise Wrong(say(
            en=f"the tokens are right, but you wrote {written} entries where {changed} changed: "
               "copy only the entries in `changed`",
            ko=f"토큰은 맞지만, 바뀐 것은 {changed}칸인데 {written}칸을 썼습니다: `changed`에 "
               "든 항목만 복사하세요"))
    return say(
        en=f"{scenario.describe()}: {len(syncs)} steps, tokens equal to the stock engine's; "
           f"your sync copied {written} entries in all ({per_step} in the steps that changed "
           f"anything, 0 in the other {sum(1 for _, w in syncs if not w)}); copying the whole "
           f"table before each layer's attention, as the article does, sends {entries} entries "
           f"x {layers} layers per step, {article:,} in all",
        ko=f"{scenario.describe()}: 스텝 {len(syncs)}번, 토큰이 표준 엔진과 같습니다; 직접 쓴 "
           f"동기화는 모두 {written}칸을 복사했습니다 (무언가 바뀐 스텝에서 {per_step}, 나머지 "
           f"스텝 {sum(1 for _, w in syncs if not w)}번에서는 0); 글처럼 레이어마다 어텐션 전에 테이블 "
           f"전체를 복사하면 스텝마다 {entries}칸 x 레이어 {layers}개, 모두 {article:,}칸입니다")


def grade(fn) -> str:
    return grade_on(fn)


PUZZLES = (
    Puzzle(
        "06.table_sync",
        Text(en="send only the changed entries of the block table to the device",
             ko="블록 테이블에서 바뀐 항목만 디바이스로 보내기"),
        "def sync_table(host_table, device_table, changed):",
        Text(en="Bring the device copy of the block table up to date before a step.\n"
                "host_table: the host table, flat (a NumPy int32 array, the truth);\n"
                "device_table: the device copy, flat (index it like an array to write);\n"
                "changed: the flat indices whose host value changed since the last sync.\n"
                "Return nothing.",
             ko="스텝 전에 블록 테이블의 디바이스 사본을 최신으로 만듭니다.\n"
                "host_table: 평평한 호스트 테이블 (NumPy int32 배열, 기준);\n"
                "device_table: 평평한 디바이스 사본 (배열처럼 인덱싱해 씁니다);\n"
                "changed: 지난 동기화 뒤 호스트 값이 바뀐 평평한 인덱스들.\n"
                "아무것도 돌려주지 않습니다."),
        Text(en="An entry changes only when a block is popped or pushed; every other entry of the "
                "device copy is already right.",
             ko="항목은 블록을 꺼내거나 반납할 때만 바뀝니다; 디바이스 사본의 나머지 항목은 이미 "
                "맞습니다."),
        Text(en="a real Engine (torch backend) whose device block table is its own tensor, "
                "updated by your function before every step (every entry read or written "
                "counted), next to a stock engine; the table layout (2-3 slots, 2-3 layers, "
                "BLOCK_SIZE 8 or 16, 4-6 logical blocks per sequence), a cache of more than "
                "65,536 blocks whose ids handed out cross 2**15 and 2**16, and the request "
                "stream (more requests than slots, their lengths) are drawn afresh for every "
                "check",
             ko="디바이스 블록 테이블을 따로 두고 매 스텝 전에 직접 쓴 함수로 갱신하는 실제 "
                "Engine (torch 백엔드; 읽고 쓴 항목을 모두 셉니다)과 표준 엔진을 나란히 돌린 "
                "실행; 테이블 배치 (슬롯 2-3개, 레이어 2-3개, BLOCK_SIZE 8 또는 16, 시퀀스마다 논리 "
                "블록 4-6개), 블록 65,536개가 넘는 캐시 (내주는 블록 번호가 2**15와 2**16을 "
                "넘음)와 요청 흐름 (슬롯보다 많은 요청, 그 길이)은 채점할 때마다 새로 "
                "뽑습니다"),
        "main.cpp:551-552, 876, 1030", grade, on_host=True),
)
