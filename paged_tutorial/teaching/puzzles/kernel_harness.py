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

``replay`` walks the kernel's address arithmetic on the host with the same parts (plain
Python): before a launch it refuses a part that would read outside the table or the cache (on a
GPU that is an illegal memory access, which ends the process's CUDA context), and after a wrong
launch it says where the reads went.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch

from paged_tutorial.config import CacheConfig
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.teaching.oracles import (clone_cache, kernel_device, kernel_read_trace, poisoned_copy,
                       quiet_nan_arithmetic)
from paged_tutorial.teaching.puzzles.base import Wrong, host_call, need_int

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

    @property
    def config(self) -> CacheConfig:
        return CacheConfig(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads,
                           head_dim=self.head_dim, dtype="float32",
                           kv_cache_bytes=self.num_blocks * 2 * 16 * self.num_kv_heads
                           * self.head_dim * 4,
                           max_slots=self.max_slots, max_seq_len=self.max_seq_len)


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
    q = torch.randn(len(case.rows), case.n_q_heads, case.head_dim, generator=gen) * case.q_scale
    slots = [s for s, _ in case.rows]
    lens = [n for _, n in case.rows]
    scale = 1.0 / math.sqrt(case.head_dim)
    cpu = clone_cache(cache, "cpu")
    from paged_tutorial.backends.torch_ref import TorchBackend

    reference = TorchBackend().decode_attention(q.clone(), cpu, cpu.device_block_table(),
                                                case.layer, torch.tensor(lens),
                                                torch.tensor(slots), scale)
    q_per_kv = case.n_q_heads // case.num_kv_heads
    traces = {(row, h): kernel_read_trace(cache, case.layer, slot, n, h, q_per_kv)
              for row, (slot, n) in enumerate(case.rows) for h in range(case.n_q_heads)}
    keep = np.unique(np.concatenate([t.elements() for t in traces.values()]))
    entries = np.unique(np.concatenate([t.table_index for t in traces.values()]))
    poisoned = poisoned_copy(cache, keep, entries)
    return Prepared(case, cache, poisoned, q, reference, traces, scale, slots, lens)


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
    from numba.core.errors import NumbaError

    dev = kernel_device()
    q = prep.q.to(dev).clone()
    table = prep.poisoned.device_block_table()
    logs = None
    try:
        with quiet_nan_arithmetic():
            if access_log.AVAILABLE:
                with access_log.record_kernel_accesses(kv_cache=prep.poisoned.buffer,
                                                       block_table=table) as logs:
                    attention.decode(q, prep.poisoned, table, prep.case.layer, prep.lens,
                                     prep.slots, prep.scale, parts)
            else:
                attention.decode(q, prep.poisoned, table, prep.case.layer, prep.lens,
                                 prep.slots, prep.scale, parts)
    except NumbaError as exc:
        reason = next((line for line in str(exc).strip().splitlines() if line.strip()), "")
        raise Wrong(f"the kernel did not compile with your function: {reason.strip()}") from None
    except Exception as exc:      # a simulated thread raised (e.g. an index out of range)
        raise Wrong(f"the kernel failed with your function: {type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}") from None
    out = q.cpu()
    bad = []
    for row in range(len(prep.slots)):
        for h in range(prep.case.n_q_heads):
            got, ref = out[row, h], prep.reference[row, h]
            if not (torch.isfinite(got).all() and torch.allclose(got, ref, rtol=RTOL, atol=ATOL)):
                bad.append((row, h))
    return KernelRun(out, logs, bad)


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
    "tokens_in_block": ["seq_len", "logical_block", "BLOCK_SIZE"],
    "k_index": ["physical_block", "token", "kv_head", "thread_id", "BLOCK_ELEMS", "KV_DIM",
                "HEAD_DIM"],
}


def _call_int(fn, args, part: str, what: str) -> int:
    names = PART_ARGS[part]
    value = host_call(fn, args, names)
    return need_int(value, what, f"{part}({', '.join(f'{n}={a}' for n, a in zip(names, args))})")


def replay(prep: Prepared, parts) -> list[Replay]:
    """The kernel's address arithmetic with ``parts``, on the host, over the poisoned table the
    launch will read; raises ``Wrong`` for a read outside the table or the cache buffer."""
    case, c = prep.case, prep.case.config
    table = prep.poisoned.block_table.reshape(-1)
    n_elems = c.NUM_BLOCKS * c.BLOCK_ELEMS
    out = []
    for row, (slot, seq_len) in enumerate(case.rows):
        for h in range(case.n_q_heads):
            kv_head = h // prep.q_per_kv
            n = _call_int(parts.blocks_to_read, (seq_len, c.BLOCK_SIZE), "blocks_to_read",
                          "the number of blocks")
            rep = Replay(row, h, kv_head, seq_len, n, [], [], [], [])
            for lb in range(max(n, 0)):
                ti = _call_int(parts.block_table_index,
                               (slot, case.layer, lb, c.num_layers, c.MAX_BLOCKS_PER_SEQ),
                               "block_table_index", "the table index")
                if not 0 <= ti < table.size:
                    raise Wrong(
                        f"for slot {slot}, layer {case.layer}, logical block {lb} the kernel "
                        f"would read block_table[{ti}], outside the table's {table.size} "
                        f"entries ({c.max_slots} slots x {c.num_layers} layers x "
                        f"{c.MAX_BLOCKS_PER_SEQ} logical blocks; the loop visits {n} block(s) "
                        f"for seq_len {seq_len}): on a GPU that read leaves the table")
                phys = int(table[ti])
                t = _call_int(parts.tokens_in_block, (seq_len, lb, c.BLOCK_SIZE),
                              "tokens_in_block", "the number of tokens")
                if t > MAX_ROWS_FACTOR * c.BLOCK_SIZE:
                    raise Wrong(f"tokens_in_block({seq_len}, {lb}, {c.BLOCK_SIZE}) = {t}: the "
                                f"kernel would read {t} token rows from one {c.BLOCK_SIZE}-token "
                                "block, far past its end")
                rep.table_index.append(ti)
                rep.physical_block.append(phys)
                rep.tokens.append(t)
                for token in range(max(t, 0)):
                    idx = np.array([_call_int(parts.k_index,
                                              (phys, token, kv_head, d, c.BLOCK_ELEMS, c.KV_DIM,
                                               c.head_dim), "k_index", "the K element")
                                    for d in range(c.head_dim)], dtype=np.int64)
                    worst = idx[(idx < 0) | (idx + c.V_OFFSET_ELEMS >= n_elems)]
                    if worst.size:
                        d = int(np.flatnonzero(idx == worst[0])[0])
                        raise Wrong(
                            f"thread {d} of block (row {row}, q head {h}) would read K element "
                            f"{int(worst[0])} (and V at +V_OFFSET_ELEMS) for token {token} of "
                            f"physical block {phys}: outside the cache's {n_elems} elements "
                            f"({c.NUM_BLOCKS} blocks x BLOCK_ELEMS {c.BLOCK_ELEMS}); on a GPU "
                            "that read leaves the buffer")
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
    what = f"NaN or inf ({nan_means})" if not torch.isfinite(got).all() else \
        f"off by up to {float((got - prep.reference[row, h]).abs().max()):.3g}"
    slot, n = prep.case.rows[row]
    return (f"{len(result.bad)} of {len(prep.slots) * prep.case.n_q_heads} outputs differ from "
            f"the torch oracle; first: row {row} (slot {slot}, seq_len {n}), q head {h}: {what}")
