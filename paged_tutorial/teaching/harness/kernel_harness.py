"""Run the article's decode kernel with one of its parts replaced by the reader's function, and
grade it against the oracles.

A ``KernelCase`` is one small launch: a ``PagedKVCache`` whose blocks were handed out from a
shuffled free list (so logical and physical blocks differ), random K/V and q, a batch of rows
(cache slot, seq_len) and a layer.  ``prepare`` builds it once and computes

- the **torch oracle** (``TorchBackend.decode_attention``, the engine's reference) on a clean
  copy, and
- a **poisoned copy** (``oracles.poisoned_copy``): every element the article's kernel does not
  read is NaN and every table entry it does not read points at an all-NaN block, so a kernel
  that reads anything else cannot return a plausible number.

``run`` launches ``attention.decode`` -- the kernel the backend launches, built with the
reader's part (``KernelParts``) -- on the poisoned copy, in the simulator on a CPU or on the
GPU, recording its cache and table reads when the simulator can (``access_log``).

``run_body`` does the same for the kernel's body parts (``walk_blocks``, ``token_score``,
``write_output``) and records shared memory and barriers too (``access_log.SharedLog``), so a
grader can name a race or a barrier in a divergent branch; ``divergence_message`` and
``race_message`` say them in words.

``replay`` walks the kernel's address arithmetic on the host with the same parts (plain
Python): before a launch it refuses a part that would read outside the table or the cache (on a
GPU that is an illegal memory access, which ends the process's CUDA context), and after a wrong
launch it says where the reads went.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from paged_tutorial.backends.warp import WARP_SIZE
from paged_tutorial.config import CacheConfig
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.teaching.oracles import (clone_cache, kernel_device, kernel_read_trace, poisoned_copy,
                       quiet_nan_arithmetic)
from paged_tutorial.teaching.error_text import compile_error_text, error_text
from paged_tutorial.teaching.language import particle, say
from paged_tutorial.teaching.harness.base import (Wrong, compile_errors, host_call,
                                                  host_only_code, need_int)
from paged_tutorial.teaching.harness.faults import is_checker_fault
from paged_tutorial.teaching.verdict import Verdict

#: agreement with the torch oracle (float32 throughout; the reader may sum in float64)
RTOL, ATOL = 1e-4, 1e-5
#: a block is never read for more than this many token rows by a sane part
MAX_ROWS_FACTOR = 4


@dataclass(frozen=True)
class KernelCase:
    """One launch: rows are (cache slot, seq_len) per batch row."""

    label: str
    rows: tuple = ((0, 20),)
    head_dim: int = 32
    num_kv_heads: int = 1
    n_q_heads: int = 1
    num_layers: int = 1
    max_slots: int = 1
    max_seq_len: int = 48
    layer: int = 0
    num_blocks: int = 16
    q_scale: float = 1.0
    seed: int = 0
    block_size: int = 16
    #: the softmax scale the kernel is launched with; None: the model's 1/sqrt(head_dim)
    scale: float | None = None
    #: elements between the end of one q row's heads and the next row (q rows of a wider
    #: matrix: the kernel's q_row_stride is n_q_heads * head_dim + q_row_pad)
    q_row_pad: int = 0
    #: dimensions (from 0) of every KV head whose V is 0 in every token: their output is
    #: exactly 0 (acc is 0), which a store that skips zeros leaves unwritten
    zero_v_dims: int = 0
    #: dimensions (the last ones) of every KV head whose V has a magnitude of at least
    #: ``large_v`` in every token, the sign alternating by dimension: their output is that
    #: large too (past float16's 65504 when ``large_v`` is)
    large_v_dims: int = 0
    large_v: float = 0.0
    #: (low, high): every score (q . k * scale) the launch computes, of every row, q head and
    #: token, is drawn from this range (``place_scores``); None: the scores of random q and K
    score_band: tuple | None = None
    #: (low, high): in every row and KV head one token of the first block (drawn) scores the
    #: highest, and every other token a drawn low-high below it, its V scaled up to about
    #: e^gap / (tokens - 1) times the peak's V, of the opposite sign, so that together the
    #: far tokens weigh one to three times as much as the peak (``place_scores``); None: no
    #: peak
    far_below_peak: tuple | None = None

    @property
    def config(self) -> CacheConfig:
        return CacheConfig(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads,
                           head_dim=self.head_dim, dtype="float32",
                           kv_cache_bytes=self.num_blocks * 2 * self.block_size
                           * self.num_kv_heads * self.head_dim * 4,
                           max_slots=self.max_slots, max_seq_len=self.max_seq_len,
                           block_size=self.block_size)

    @property
    def q_row_stride(self) -> int:
        """Elements from one batch row of q to the next, as the kernel is given it."""
        return self.n_q_heads * self.head_dim + self.q_row_pad

    @property
    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else float(self.scale)


@dataclass
class Prepared:
    case: KernelCase
    cache: PagedKVCache               # clean, on the kernel device
    poisoned: PagedKVCache            # the trap, on the kernel device
    q: torch.Tensor                   # [rows, n_q_heads, head_dim], CPU
    reference: torch.Tensor           # the torch oracle's output, CPU
    traces: dict                      # (row, q_head) -> oracles.ReadTrace (the article's reads)
    scale: float
    slots: list = field(default_factory=list)
    lens: list = field(default_factory=list)
    max_abs_score: float = 0.0        # the largest |q.k * scale| any block computes

    @property
    def atol(self) -> float:
        """The absolute agreement asked of an output: float32 rounds ``exp(score - max)`` to
        about ``|score| * 2**-23`` of itself, so scores in the hundreds (the online softmax's
        wide launch) leave rounding far above ``ATOL`` in a right answer (V is of unit scale)."""
        return max(ATOL, 8 * self.max_abs_score * 2.0 ** -23)

    @property
    def q_per_kv(self) -> int:
        return self.case.n_q_heads // self.case.num_kv_heads


@lru_cache(maxsize=32)
def prepare(case: KernelCase) -> Prepared:
    c = case.config
    rng = np.random.default_rng(case.seed)
    cache = PagedKVCache(c, kernel_device())
    cache.free_blocks = [int(b) for b in rng.permutation(cache.NUM_BLOCKS)]
    for slot, n in case.rows:
        cache.ensure_capacity(slot, n)
    gen = torch.Generator().manual_seed(case.seed)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=gen).to(cache.buffer.device))
    if case.zero_v_dims:
        halves = cache.buffer.view(c.NUM_BLOCKS, 2, c.BLOCK_SIZE, c.num_kv_heads, c.head_dim)
        halves[:, 1, :, :, :case.zero_v_dims] = 0.0
    if case.large_v_dims:
        halves = cache.buffer.view(c.NUM_BLOCKS, 2, c.BLOCK_SIZE, c.num_kv_heads, c.head_dim)
        dims = torch.arange(c.head_dim - case.large_v_dims, c.head_dim)
        sign = 1.0 - 2.0 * (dims % 2).to(cache.buffer.dtype).to(cache.buffer.device)
        large = halves[:, 1, :, :, c.head_dim - case.large_v_dims:]
        large.copy_(sign * case.large_v * (1.0 + large.abs()))
    q = torch.randn(len(case.rows), case.n_q_heads, case.head_dim, generator=gen) * case.q_scale
    slots = [s for s, _ in case.rows]
    lens = [n for _, n in case.rows]
    scale = case.softmax_scale
    q_per_kv = case.n_q_heads // case.num_kv_heads
    traces = {(row, h): kernel_read_trace(cache, case.layer, slot, n, h, q_per_kv)
              for row, (slot, n) in enumerate(case.rows) for h in range(case.n_q_heads)}
    if case.score_band is not None or case.far_below_peak is not None:
        place_scores(cache, q, traces, case, rng)
    cpu = clone_cache(cache, "cpu")
    from paged_tutorial.backends.torch_ref import TorchBackend

    reference = TorchBackend().decode_attention(q.clone(), cpu, cpu.device_block_table(),
                                                case.layer, torch.tensor(lens),
                                                torch.tensor(slots), scale)
    keep = np.unique(np.concatenate([t.elements() for t in traces.values()]))
    entries = np.unique(np.concatenate([t.table_index for t in traces.values()]))
    poisoned = poisoned_copy(cache, keep, entries)
    keys = cpu.buffer.double().numpy()
    max_abs_score = max(float(np.abs(keys[t.k_index] @ q[row, h].double().numpy()).max()) * scale
                        for (row, h), t in traces.items())
    return Prepared(case, cache, poisoned, q, reference, traces, scale, slots, lens,
                    max_abs_score)


def place_scores(cache: PagedKVCache, q: torch.Tensor, traces: dict, case: KernelCase,
                 rng) -> None:
    """Move the K vectors the launch reads so that every score q . k * scale of every row, q
    head and token is the drawn one (``drawn_scores``); where the case has a peak, scale the
    far tokens' V too (``weigh_far_tokens``).  Per row and KV head, with Q the q vectors of
    its q heads and K the keys of its tokens, the smallest change of K that gives the drawn
    scores S: ``K + (S / scale - K Q^T) (Q Q^T)^-1 Q``."""
    flat = cache.buffer.view(-1)
    q_per_kv = case.n_q_heads // case.num_kv_heads
    for row in range(len(case.rows)):
        for kv_head in range(case.num_kv_heads):
            first = kv_head * q_per_kv
            trace = traces[(row, first)]
            index = torch.from_numpy(trace.k_index).to(flat.device)
            heads = q[row, first:first + q_per_kv].double()               # [q_per_kv, dim]
            keys = flat[index].double().cpu()                              # [tokens, dim]
            want, peak, gaps = drawn_scores(case, keys.shape[0], q_per_kv, rng)
            keys += (want / case.softmax_scale - keys @ heads.T) @ torch.linalg.solve(
                heads @ heads.T, heads)
            flat[index] = keys.to(flat.dtype).to(flat.device)
            if peak is not None:
                weigh_far_tokens(flat, trace.v_index, peak, gaps, rng)


#: the highest score of a launch with a peak (each q head's drawn between the two)
PEAK_SCORE = (-4.0, 4.0)
#: together, the tokens far below a launch's peak weigh this many times as much as the peak
#: (each token's share drawn between the two, its V of the opposite sign)
FAR_TOKENS_WEIGHT = (1.0, 3.0)


def drawn_scores(case: KernelCase, tokens: int, q_per_kv: int, rng):
    """The scores of one row and KV head, [tokens, q_per_kv], and for a case with a peak the
    peak's token and every token's distance below it (else None, None): from
    ``case.score_band`` every score uniformly; from ``case.far_below_peak`` one token of the
    first block at a drawn top of each q head and every other token the same drawn gap below
    it in every q head (they share one V)."""
    if case.far_below_peak is None:
        low, high = case.score_band
        return torch.from_numpy(rng.uniform(low, high, (tokens, q_per_kv))), None, None
    peak = int(rng.integers(0, min(case.block_size, tokens)))
    gaps = rng.uniform(*case.far_below_peak, tokens)
    gaps[peak] = 0.0
    tops = rng.uniform(*PEAK_SCORE, q_per_kv)
    return torch.from_numpy(tops[None, :] - gaps[:, None]), peak, gaps


def weigh_far_tokens(flat: torch.Tensor, v_index: np.ndarray, peak: int, gaps: np.ndarray,
                     rng) -> None:
    """Set every token's V but the peak's to the peak's V times -e^gap / (tokens - 1) and a
    drawn share of ``FAR_TOKENS_WEIGHT``: each weighs exp(-gap) of the peak in the softmax, so
    together they move the output by one to three times the peak's V, and a walk that leaves
    out tokens far below the running max is off by about that much."""
    tokens = len(gaps)
    if tokens < 2:
        return
    index = torch.from_numpy(v_index).to(flat.device)                     # [tokens, dim]
    values = flat[index].double().cpu()
    share = rng.uniform(*FAR_TOKENS_WEIGHT, tokens) * np.exp(gaps) / (tokens - 1)
    far = torch.from_numpy(-share)[:, None] * values[peak][None, :]
    far[peak] = values[peak]
    flat[index] = far.to(flat.dtype).to(flat.device)


def launch_q(prep: Prepared, device) -> torch.Tensor:
    """A fresh copy of the case's q on ``device``, as the kernel gets it: [rows, heads,
    head_dim] whose rows are ``case.q_row_stride`` elements apart.  The padding between rows,
    and one warp's width after the last row, hold NaN: a read of it poisons the output, and a
    store into it is seen afterwards (``stray_q_stores``)."""
    case = prep.case
    rows, width = len(case.rows), case.n_q_heads * case.head_dim
    storage = torch.full((rows * case.q_row_stride + WARP_SIZE,), float("nan"),
                         dtype=prep.q.dtype)
    grid = storage[:rows * case.q_row_stride].view(rows, case.q_row_stride)
    grid[:, :width] = prep.q.reshape(rows, width)
    storage = storage.to(device)
    return storage.as_strided((rows, case.n_q_heads, case.head_dim),
                              (case.q_row_stride, case.head_dim, 1))


def stray_q_stores(q: torch.Tensor) -> list:
    """(row, offset) of every element of ``launch_q``'s storage outside the heads' elements that
    no longer holds NaN: a store that landed in the padding after row ``row``'s last q head
    (``offset`` elements past it), or after the last row."""
    rows, heads, head_dim = q.shape
    stride, width = q.stride(0), heads * head_dim
    storage = _whole_storage(q).cpu()
    found = []
    for row in range(rows):
        end = (row + 1) * stride if row + 1 < rows else storage.numel()
        padding = storage[row * stride + width:end]
        found += [(row, int(i)) for i in torch.nonzero(~torch.isnan(padding)).flatten()]
    return found


def _whole_storage(q: torch.Tensor) -> torch.Tensor:
    """Every element of ``q``'s storage (its padding included), as one flat tensor."""
    return q.as_strided((q.untyped_storage().nbytes() // q.element_size(),), (1,), 0)


def _host_copy(q: torch.Tensor) -> torch.Tensor:
    """``q`` copied to the host with its whole storage, in one transfer: the same view (shape,
    strides) over the copy, so that ``stray_q_stores`` reads the padding from it too."""
    return _whole_storage(q).cpu().as_strided(q.shape, q.stride(), q.storage_offset())


def _disagreeing_heads(prep: Prepared, out: torch.Tensor) -> list:
    """(row, q head) of every output of ``out`` that is not finite or not the oracle's."""
    return [(row, h) for row in range(len(prep.slots)) for h in range(prep.case.n_q_heads)
            if not (torch.isfinite(out[row, h]).all()
                    and torch.allclose(out[row, h], prep.reference[row, h], rtol=RTOL,
                                       atol=prep.atol))]


def q_span(q: torch.Tensor) -> torch.Tensor:
    """The flat span of q's storage the kernel addresses (row stride included), so that an
    access log's index is the kernel's own ``row * q_row_stride + head * HEAD_DIM + dim``."""
    rows = q.shape[0]
    span = (rows - 1) * q.stride(0) + q.shape[1] * q.shape[2] if rows else 0
    return q.as_strided((span,), (1,), q.storage_offset())


@dataclass
class KernelRun:
    out: torch.Tensor                 # CPU copy of the kernel's output
    logs: dict | None                 # access logs (simulator), else None
    bad: list                         # (row, q_head) pairs that disagree with the oracle

    @property
    def ok(self) -> bool:
        return not self.bad


def run(prep: Prepared, parts) -> KernelRun:
    """Launch the kernel with ``parts`` (``attention.KernelParts``) on the poisoned cache;
    compare with the oracle."""
    from paged_tutorial.backends.numba_cuda.runtime import access_log
    from paged_tutorial.backends.numba_cuda.kernels import attention

    host_only = _host_only_part(parts)
    if host_only is not None:
        raise Wrong(host_only)
    dev = kernel_device()
    q = launch_q(prep, dev)
    table = prep.poisoned.device_block_table()
    logs = None
    try:
        with quiet_nan_arithmetic(), simulated_time_limit(KERNEL_TIMEOUT_S):
            if access_log.AVAILABLE:
                with access_log.record_kernel_accesses(kv_cache=prep.poisoned.buffer,
                                                       block_table=table) as logs:
                    attention.decode(q, prep.poisoned, table, prep.case.layer, prep.lens,
                                     prep.slots, prep.scale, parts)
            else:
                attention.decode(q, prep.poisoned, table, prep.case.layer, prep.lens,
                                 prep.slots, prep.scale, parts)
    except KernelTimeout:
        raise Wrong(stuck_message(KERNEL_TIMEOUT_S)) from None
    except compile_errors() as exc:
        raise Wrong(say(en=f"the kernel did not compile with your function: "
                           f"{compile_error_text(exc)}",
                        ko=f"여러분의 함수로는 커널이 컴파일되지 않습니다: "
                           f"{compile_error_text(exc)}")) from None
    except Exception as exc:      # a simulated thread raised (e.g. an index out of range)
        if is_checker_fault(exc):
            raise
        raise Wrong(say(en=f"the kernel failed with your function: {_first_line(exc)}",
                        ko=f"여러분의 함수로 커널이 실패했습니다: {_first_line(exc)}")) from None
    out = q.cpu()
    return KernelRun(out, logs, _disagreeing_heads(prep, out))


# --- host replay of the kernel's addressing --------------------------------------------------

@dataclass
class Replay:
    """What one thread block (row, q head) reads when the kernel runs with some parts."""

    row: int
    q_head: int
    kv_head: int
    seq_len: int
    num_blocks: int
    table_index: list                 # flat table entries read, per logical block
    physical_block: list
    tokens: list                      # tokens read per logical block
    k_index: list                     # [n tokens read] arrays of head_dim element indices

    def elements(self) -> np.ndarray:
        if not self.k_index:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(self.k_index))


PART_ARGS = {
    "blocks_to_read": ["seq_len", "BLOCK_SIZE"],
    "block_table_index": ["slot", "layer", "logical_block", "N_LAYERS", "MAX_BLOCKS_PER_SEQ"],
    "table_index_from_max_seq_len": ["slot", "layer", "logical_block", "N_LAYERS",
                                     "MAX_SEQ_LEN", "BLOCK_SIZE"],
    "tokens_in_block": ["seq_len", "logical_block", "BLOCK_SIZE"],
    "q_head_k_index": ["physical_block", "token", "q_head", "thread_id", "Q_PER_KV",
                       "BLOCK_ELEMS", "KV_DIM", "HEAD_DIM"],
    "k_index": ["physical_block", "token", "kv_head", "thread_id", "BLOCK_ELEMS", "KV_DIM",
                "HEAD_DIM"],
}


def _call_int(fn, args, part: str, what: str) -> int:
    names = PART_ARGS[part]
    value = host_call(fn, args, names)
    shown = {"q_head_k_index": "k_index",
             "table_index_from_max_seq_len": "block_table_index"}.get(part, part)
    return need_int(value, what, f"{shown}({', '.join(f'{n}={a}' for n, a in zip(names, args))})")


def replay(prep: Prepared, parts, q_head_k_index=None,
           max_seq_len_table_index=None) -> list[Replay]:
    """The kernel's address arithmetic with ``parts``, on the host, over the poisoned table the
    launch will read; raises ``Wrong`` for a read outside the table or the cache buffer.
    ``q_head_k_index``: 03.k_index's answer, which takes the query head and the q heads per KV
    head where the kernel's ``k_index`` takes the KV head (``kernel_addresses.kernel_part``);
    ``max_seq_len_table_index``: 02.table_index's answer, which takes MAX_SEQ_LEN and
    BLOCK_SIZE where the kernel's takes MAX_BLOCKS_PER_SEQ (``kernel_addresses.table_part``)."""
    case, c = prep.case, prep.case.config
    table = prep.poisoned.block_table.reshape(-1)
    n_elems = c.NUM_BLOCKS * c.BLOCK_ELEMS
    out = []
    for row, (slot, seq_len) in enumerate(case.rows):
        for h in range(case.n_q_heads):
            kv_head = h // prep.q_per_kv
            n = _call_int(parts.blocks_to_read, (seq_len, c.BLOCK_SIZE), "blocks_to_read",
                          say(en="the number of blocks", ko="블록 수"))
            rep = Replay(row, h, kv_head, seq_len, n, [], [], [], [])
            for lb in range(max(n, 0)):
                if max_seq_len_table_index is None:
                    ti = _call_int(parts.block_table_index,
                                   (slot, case.layer, lb, c.num_layers, c.MAX_BLOCKS_PER_SEQ),
                                   "block_table_index",
                                   say(en="the table index", ko="테이블 인덱스"))
                else:
                    ti = _call_int(max_seq_len_table_index,
                                   (slot, case.layer, lb, c.num_layers, c.max_seq_len,
                                    c.BLOCK_SIZE), "table_index_from_max_seq_len",
                                   say(en="the table index", ko="테이블 인덱스"))
                if not 0 <= ti < table.size:
                    shape = say(en=f"{c.max_slots} slots x {c.num_layers} layers x "
                                   f"{c.MAX_BLOCKS_PER_SEQ} logical blocks",
                                ko=f"슬롯 {c.max_slots}개 x 레이어 {c.num_layers}개 x 논리 블록 "
                                   f"{c.MAX_BLOCKS_PER_SEQ}개")
                    raise Wrong(say(
                        en=f"for slot {slot}, layer {case.layer}, logical block {lb} the kernel "
                           f"would read block_table[{ti}], outside the table's {table.size} "
                           f"entries ({shape}; the loop visits {n} block(s) for seq_len "
                           f"{seq_len}): on a GPU that read leaves the table",
                        ko=f"슬롯 {slot}, 레이어 {case.layer}, 논리 블록 {lb}에 대해 커널이 "
                           f"{particle(f'block_table[{ti}]', '을/를')} 읽게 됩니다. 테이블의 {table.size}개 항목 "
                           f"({shape}; seq_len {seq_len}이면 루프는 블록 {n}개를 돕니다) 밖이라 "
                           "GPU에서는 테이블을 벗어난 읽기입니다"))
                phys = int(table[ti])
                t = _call_int(parts.tokens_in_block, (seq_len, lb, c.BLOCK_SIZE),
                              "tokens_in_block",
                              say(en="the number of tokens", ko="토큰 수"))
                if t > MAX_ROWS_FACTOR * c.BLOCK_SIZE:
                    raise Wrong(say(
                        en=f"tokens_in_block({seq_len}, {lb}, {c.BLOCK_SIZE}) = {t}: the kernel "
                           f"would read {t} token rows from one {c.BLOCK_SIZE}-token block, far "
                           "past its end",
                        ko=f"tokens_in_block({seq_len}, {lb}, {c.BLOCK_SIZE}) = {t}: 커널이 "
                           f"{c.BLOCK_SIZE}토큰짜리 블록 하나에서 토큰 행 {t}개를 읽게 되어, "
                           "블록 끝을 한참 넘습니다"))
                rep.table_index.append(ti)
                rep.physical_block.append(phys)
                rep.tokens.append(t)
                for token in range(max(t, 0)):
                    if q_head_k_index is None:
                        idx = np.array([_call_int(parts.k_index,
                                                  (phys, token, kv_head, d, c.BLOCK_ELEMS,
                                                   c.KV_DIM, c.head_dim), "k_index",
                                                  say(en="the K element", ko="K 원소"))
                                        for d in range(c.head_dim)], dtype=np.int64)
                    else:
                        idx = np.array([_call_int(q_head_k_index,
                                                  (phys, token, h, d, prep.q_per_kv,
                                                   c.BLOCK_ELEMS, c.KV_DIM, c.head_dim),
                                                  "q_head_k_index",
                                                  say(en="the K element", ko="K 원소"))
                                        for d in range(c.head_dim)], dtype=np.int64)
                    worst = idx[(idx < 0) | (idx + c.V_OFFSET_ELEMS >= n_elems)]
                    if worst.size:
                        d = int(np.flatnonzero(idx == worst[0])[0])
                        raise Wrong(say(
                            en=f"thread {d} of block (row {row}, q head {h}) would read K "
                               f"element {int(worst[0])} (and V at +V_OFFSET_ELEMS) for token "
                               f"{token} of physical block {phys}: outside the cache's "
                               f"{n_elems} elements ({c.NUM_BLOCKS} blocks x BLOCK_ELEMS "
                               f"{c.BLOCK_ELEMS}); on a GPU that read leaves the buffer",
                            ko=f"블록 (행 {row}, q 헤드 {h})의 "
                               f"스레드 {particle(str(d), '이/가')} 물리 블록 {phys}의 "
                               f"토큰 {token}에 대해 K 원소 "
                               f"{particle(f'{int(worst[0])} (그리고 +V_OFFSET_ELEMS의 V)', '을/를')} "
                               f"읽게 됩니다: 캐시의 {n_elems}개 원소 "
                               f"(블록 {c.NUM_BLOCKS}개 x BLOCK_ELEMS {c.BLOCK_ELEMS}) 밖이라 GPU에서는 "
                               "버퍼를 벗어난 읽기입니다"))
                    rep.k_index.append(idx)
            out.append(rep)
    return out


def recorded_k_reads(logs: dict | None, prep: Prepared, row: int, q_head: int):
    """The K-half elements block (row, q_head) read in the recorded launch (None on a GPU)."""
    if not logs:
        return None
    reads = logs["kv_cache"].by_block("R").get((row, q_head), np.zeros(0, dtype=np.int64))
    c = prep.case.config
    in_block = reads % c.BLOCK_ELEMS
    return reads[in_block < c.V_OFFSET_ELEMS]


def bad_summary(prep: Prepared, result: KernelRun, nan_means: str = "it read poisoned memory"
                ) -> str:
    row, h = result.bad[0]
    got = result.out[row, h]
    err = float((got - prep.reference[row, h]).abs().max())
    if not torch.isfinite(got).all():
        what = say(en=f"NaN or inf ({nan_means})",
                   ko="NaN 또는 inf (오염된 메모리를 읽었습니다)"
                   if nan_means == "it read poisoned memory" else f"NaN 또는 inf ({nan_means})")
    else:
        what = say(en=f"off by up to {err:.3g}", ko=f"최대 {err:.3g}만큼 다릅니다")
    slot, n = prep.case.rows[row]
    total = len(prep.slots) * prep.case.n_q_heads
    return say(en=f"{len(result.bad)} of {total} outputs differ from the torch oracle; first: "
                  f"row {row} (slot {slot}, seq_len {n}), q head {h}: {what}",
               ko=f"출력 {total}개 중 {len(result.bad)}개가 torch 오라클과 다릅니다; 첫 번째: 행 "
                  f"{row} (슬롯 {slot}, seq_len {n}), q 헤드 {h}: {what}")


# --- the body parts: a whole launch with the reader's loop, score or store ---------------------

@dataclass
class BodyRun:
    """One launch with body parts replaced: the output (None when the kernel failed), the
    cache and table access logs and the shared-memory log (simulator; None on a GPU), the
    rows/heads that disagree with the oracle, and what the kernel raised (or None)."""

    out: torch.Tensor | None
    logs: dict | None
    shared: object | None
    bad: list
    error: str | None
    #: (row, offset) of stores that landed in q's padding (``stray_q_stores``)
    stray: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.bad and not self.stray


def _first_line(exc: Exception) -> str:
    """The last line of ``exc``'s message, without the simulator's thread ids, as
    ``error_text`` words it in the language in use."""
    text = str(exc).strip()
    line = text.splitlines()[-1] if text else ""
    # the simulator prefixes a thread's exception with its ids: "tid=[3, 0, 0] ctaid=[0, 0, 0]: "
    if line.startswith("tid=") and "]: " in line:
        line = line.split("]: ", 2)[-1]
    return error_text(type(exc).__name__, line)


#: a simulated launch of a graded case takes seconds; one still running after this long is
#: stuck (a thread spinning on shared memory while the others wait at a barrier)
KERNEL_TIMEOUT_S = 90.0
#: how often (seconds) a stuck launch's watchdog tries again to reach its running thread
STOP_RETRY_S = 0.05


class KernelTimeout(Exception):
    """Raised inside the simulated threads of a launch that ran past its time limit."""


def _quiet_stopped_threads() -> None:
    """A simulated thread ended by ``KernelTimeout`` is part of a reported stop: keep its
    traceback out of the notebook (every other thread exception is printed as before)."""
    if getattr(threading.excepthook, "drops_kernel_timeouts", False):
        return
    previous = threading.excepthook

    def hook(args):
        if args.exc_type is not None and issubclass(args.exc_type, KernelTimeout):
            return
        previous(args)
    hook.drops_kernel_timeouts = True
    threading.excepthook = hook


@contextlib.contextmanager
def simulated_time_limit(seconds: float):
    """In the simulator, stop a launch that runs longer than ``seconds``: the thread running
    kernel code gets a ``KernelTimeout`` (the launch then fails with it and ends its other
    threads), so a stuck kernel ends the cell with a message instead of hanging it.  Nothing
    happens on a GPU."""
    from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

    if not SIMULATING:
        yield
        return
    _quiet_stopped_threads()
    done = threading.Event()

    def stop():
        if done.wait(seconds):
            return
        from paged_tutorial.backends.numba_cuda.device.sim_block import \
            interrupt_running_threads

        # the thread that holds its block's turn, while it runs kernel code (a moment later
        # if it is handing the turn over); the launch then fails and ends the others
        while not done.is_set():
            interrupt_running_threads(KernelTimeout)
            done.wait(STOP_RETRY_S)
    watchdog = threading.Thread(target=stop, daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()


def _host_only_part(parts) -> str | None:
    """Why a part of ``parts`` that is not the article's could not compile for a GPU (it
    builds a list, dict, set or string), or None."""
    import dataclasses

    from paged_tutorial.backends.numba_cuda.kernels import attention

    for field_ in dataclasses.fields(parts):
        part = getattr(parts, field_.name)
        if part is not getattr(attention.ARTICLE_PARTS, field_.name):
            problem = host_only_code(part)
            if problem is not None:
                return problem
    return None


def stuck_message(limit: float) -> str:
    return say(en=f"the kernel was still running after {limit:g} s and was stopped: some thread "
                  "never gets past a loop, or waits for something another thread never does "
                  "(on a GPU the block would hang)",
               ko=f"커널이 {limit:g}초가 지나도 끝나지 않아 멈췄습니다: 어떤 스레드가 루프를 "
                  "빠져나오지 못하거나 다른 스레드가 하지 않는 일을 기다립니다 (GPU에서는 블록이 "
                  "멈춥니다)")


def run_body(prep: Prepared, parts, timeout: float | None = None) -> BodyRun:
    """Launch the kernel with ``parts`` on the poisoned cache, recording cache, table and
    shared-memory accesses where the simulator can; a failing kernel is reported in
    ``error``, never raised, so that the grader can read the logs first.  A simulated launch
    still running after ``timeout`` seconds (default ``KERNEL_TIMEOUT_S``) is stopped and
    reported as stuck."""
    from paged_tutorial.backends.numba_cuda.runtime import access_log
    from paged_tutorial.backends.numba_cuda.kernels import attention

    host_only = _host_only_part(parts)
    if host_only is not None:
        return BodyRun(None, None, None, [], host_only)
    dev = kernel_device()
    q = launch_q(prep, dev)
    table = prep.poisoned.device_block_table()
    logs = shared = None
    error = None

    def launch():
        attention.decode(q, prep.poisoned, table, prep.case.layer, prep.lens, prep.slots,
                         prep.scale, parts)
    limit = KERNEL_TIMEOUT_S if timeout is None else timeout
    try:
        with quiet_nan_arithmetic(), simulated_time_limit(limit):
            if access_log.AVAILABLE:
                with access_log.record_kernel_accesses(kv_cache=prep.poisoned.buffer,
                                                       block_table=table,
                                                       q=q_span(q)) as logs, \
                        access_log.record_shared_accesses() as shared:
                    launch()
            else:
                launch()
    except KernelTimeout:
        error = stuck_message(limit)
    except compile_errors() as exc:
        error = say(en=f"the kernel did not compile with your function: "
                       f"{compile_error_text(exc)}",
                    ko=f"여러분의 함수로는 커널이 컴파일되지 않습니다: {compile_error_text(exc)}")
    except Exception as exc:      # a simulated thread raised (e.g. an index out of range)
        if is_checker_fault(exc):
            raise
        error = _first_line(exc)
    if error is not None:
        return BodyRun(None, logs, shared, [], error)
    out = _host_copy(q)
    return BodyRun(out, logs, shared, _disagreeing_heads(prep, out), None, stray_q_stores(out))


_EMPTY_BODY_OPS = {"RESUME", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST", "POP_TOP",
                   "CACHE", "PUSH_NULL"}


def is_stub(fn) -> bool:
    """True when ``fn``'s body does nothing (only a docstring, ``...`` or ``pass``): the stub a
    notebook starts with.  A device function cannot be called on the host to find out."""
    import dis

    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    return all(i.opname in _EMPTY_BODY_OPS for i in dis.get_instructions(code))


def threads_text(threads) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    threads = sorted(threads)
    runs, start = [], None
    for i, t in enumerate(threads):
        if start is None:
            start = t
        if i + 1 == len(threads) or threads[i + 1] != t + 1:
            runs.append(f"{start}" if start == t else f"{start}-{t}")
            start = None
    return ", ".join(runs)


def divergence_message(divergence) -> str:
    """A barrier in a divergent branch, in words (which round, which threads where)."""
    where = []
    for site, threads in divergence.at.items():
        if site is None:
            where.append(say(en=f"threads {threads_text(threads)} have no barrier left (they "
                                "finished)",
                             ko=f"스레드 {particle(str(threads_text(threads)), '은/는')} 남은 배리어가 없습니다 "
                                "(이미 끝남)"))
        else:
            where.append(say(en=f"threads {threads_text(threads)} wait at line {site.line} of "
                                f"{site.function} (`{site.code()}`)",
                             ko=f"스레드 {particle(str(threads_text(threads)), '은/는')} "
                                f"{site.function}의 "
                                f"{site.line}번 줄(`{site.code()}`)에서 기다립니다"))
    rnd = divergence.round + 1
    return say(
        en=f"barrier round {rnd} of thread block {divergence.block}: " + "; ".join(where)
        + ".  A cuda.syncthreads() that not every thread of the block reaches (inside a branch "
        "on thread_id) never releases on a GPU: the block deadlocks.  Every thread must call "
        "the same barriers in the same order",
        ko=f"스레드 블록 {divergence.block}의 {rnd}번째 배리어: " + "; ".join(where)
        + ".  블록의 모든 스레드가 도달하지 않는 cuda.syncthreads() (thread_id에 따른 분기 "
        "안)는 GPU에서 풀리지 않아 블록이 멈춥니다(deadlock).  모든 스레드가 같은 배리어를 같은 "
        "순서로 호출해야 합니다")


def race_message(race, count: int) -> str:
    """The first race of a shared-memory log, in words."""
    w, o = race.write, race.other
    other_op = say(en="read", ko="읽었") if o.op == "R" else say(en="wrote", ko="썼")
    return say(
        en=f"race on {race.cell}: thread {w.thread} wrote it (line {w.site.line} of "
           f"{w.site.function}: `{w.site.code()}`) and thread {o.thread} {other_op} it (line "
           f"{o.site.line}: `{o.site.code()}`) with no barrier between them (both after "
           f"barrier {w.epoch} of block {w.block}); {count} such pair(s) in the launch.  On a "
           "GPU the read may see the old or the new value",
        ko=f"{race.cell}에 경합(race): "
           f"스레드 {particle(str(w.thread), '이/가')} 쓰고({w.site.function}의 "
           f"{w.site.line}번 줄: `{w.site.code()}`) 스레드 "
           f"{particle(str(o.thread), '이/가')} {other_op}습니다"
           f"({o.site.line}번 줄: `{o.site.code()}`). 둘 사이에 배리어가 없습니다(둘 다 블록 "
           f"{w.block}의 {w.epoch}번째 배리어 뒤). 이 런치에서 {count}쌍.  GPU에서는 읽는 "
           "쪽이 옛 값을 볼지 새 값을 볼지 정해져 있지 않습니다")


def case_verdict(run_case, case: KernelCase, correct, name_case: bool = True) -> Verdict:
    """One fixed ``case`` through a puzzle's checks (``run_case()`` raises ``Wrong`` or returns
    the figure): a chapter's demonstration of a whole set of parts, as a ``Verdict``.  With
    ``name_case`` a wrong verdict starts with the case's label unless its message already does."""
    try:
        figure = run_case()
    except Wrong as wrong:
        message = wrong.message
        if name_case and not message.startswith("["):
            message = f"[{case.label}] {message}"
        return Verdict("wrong", message, wrong.figure)
    return Verdict("correct", correct, figure)
