"""Split-KV (flash-decoding) for the decode attention kernels: how one sequence's logical blocks
are shared among several thread blocks, and how their partial results meet again.

``attention_fast`` and ``attention_tc`` both launch ``grid = (B, n_kv_heads, n_splits)`` and take
their split counts (``choose_splits``) and buffers (``scratch``) from here; ``attention_fast``
also calls the device functions below, while ``attention_tc`` writes the same steps out itself
(calling these, it measured 7-12 % slower on an H100 with the same main loop:
``benchmarks/results/attempts/attention-tc-split-kv-calls-2026-12-07.json``).
Split ``s`` takes an equal share of its sequence's logical blocks (``split_range``, computed on
the device from ``seq_lens``, so a CUDA graph captured once serves every length).  With one
split the kernel writes its output over q; with several, each split writes an unnormalised
partial output (``part_acc``) with its max and denominator (``part_ml``), and the *last split
block to finish* (``last_split_to_finish``: an atomic ticket per (sequence, KV head)) merges
them (``split_max``, ``split_sum``), so no second kernel is launched.

The three scratch buffers (``scratch``) are ``launch.persistent_buffer`` s shared by both
kernels: launches on one stream take turns.  The tickets start at zero and the merging block
resets its entry to zero, so the buffer is ready for the next launch or graph replay.
"""

from __future__ import annotations

import math

import torch
from numba import cuda, float32

from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING, threadfence
from paged_tutorial.backends.numba_cuda.runtime.launch import persistent_buffer

NEG_INF = float32(-math.inf)
#: the name of the kernels' ticket counters in ``launch.persistent_buffer``
TICKETS = "attention.tickets"
#: aim for this many thread blocks per launch before splitting sequences (about two per SM of
#: an H200; chosen by ``benchmarks/attention.py --sweep``: batch 64 x 8 KV heads unsplit,
#: batch 8 with 4 splits, batch 1 with 32)
TARGET_BLOCKS = 256
MAX_SPLITS = 32


def choose_splits(batch: int, n_kv_heads: int, max_blocks_per_seq: int, num_warps: int,
                  target_blocks: int = TARGET_BLOCKS, max_splits: int = MAX_SPLITS) -> int:
    """Splits per sequence: enough thread blocks to fill the GPU, each split keeping at least
    one logical block per warp of the longest possible sequence.  Depends only on the batch
    size and the cache shape (not on the current lengths), so a CUDA graph can fix it."""
    if SIMULATING:
        return 2 if max_blocks_per_seq > 1 else 1     # exercise the split path, cheaply
    want = -(-target_blocks // max(1, batch * n_kv_heads))
    cap = max(1, max_blocks_per_seq // num_warps)
    return max(1, min(want, cap, max_splits))


def scratch(device, n_seqs: int, n_q_heads: int, n_kv_heads: int, n_splits: int,
            head_dim: int):
    """``(part_acc, part_ml, tickets)`` for a launch: float32 partials [B, nH, n_splits, D]
    and [B, nH, n_splits, 2] (one element each when nothing is split) and int32 tickets
    [B * n_kv_heads], kept for the process (no allocation per call)."""
    n_part = n_seqs * n_q_heads * n_splits if n_splits > 1 else 1
    part_acc = persistent_buffer(device, "attention.part_acc", n_part * head_dim)
    part_ml = persistent_buffer(device, "attention.part_ml", n_part * 2)
    tickets = persistent_buffer(device, TICKETS, n_seqs * n_kv_heads, torch.int32, zero=True)
    return part_acc, part_ml, tickets


# --- on the device --------------------------------------------------------------------------

@cuda.jit(device=True)
def split_range(seq_len, split, n_splits, block_size):
    """``(lb_start, lb_end)``: the logical blocks of a ``seq_len``-token sequence that split
    ``split`` of ``n_splits`` reads."""
    n_logical = (seq_len + block_size - 1) // block_size
    per_split = (n_logical + n_splits - 1) // n_splits
    lb_start = split * per_split
    return lb_start, min(lb_start + per_split, n_logical)


@cuda.jit(device=True)
def table_entry(block_table, table_base, lb, lb_end):
    """Physical block of logical block lb (0 past the split's end: never read)."""
    phys = 0
    if lb < lb_end:
        phys = block_table[table_base + lb]
    return phys


@cuda.jit(device=True)
def last_split_to_finish(tickets, ticket, n_splits, sm_last):
    """Called by every thread of a split block once its partial is written: True in the block
    that finished last (its partials and every other split's are then visible to it).
    ``sm_last``: one int32 of shared memory."""
    threadfence()                                 # this block's partial, before its ticket
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        taken = cuda.atomic.add(tickets, ticket, 1)
        sm_last[0] = 1 if taken == n_splits - 1 else 0
    cuda.syncthreads()
    threadfence()                                 # the other splits' partials, after it
    return sm_last[0] != 0


@cuda.jit(device=True)
def split_max(part_ml, row0, n_splits):
    """The largest running max over the splits of partial rows row0 ..."""
    mm = NEG_INF
    for sp in range(n_splits):
        mm = max(mm, part_ml[(row0 + sp) * 2])
    return mm


@cuda.jit(device=True, fastmath=True)
def split_sum(part_ml, part_acc, row0, n_splits, mm, d, head_dim):
    """``(denominator, numerator of dim d)`` over the splits, each rescaled to the max
    ``mm`` (``split_max``); splits that saw no token (max -inf) add nothing."""
    ll = float32(0.0)
    oo = float32(0.0)
    if mm > NEG_INF:
        for sp in range(n_splits):
            ms = part_ml[(row0 + sp) * 2]
            if ms > NEG_INF:
                f = math.exp(ms - mm)
                ll += f * part_ml[(row0 + sp) * 2 + 1]
                oo += f * part_acc[(row0 + sp) * head_dim + d]
    return ll, oo


@cuda.jit(device=True, fastmath=True)   # the kernels' division
def normalized(oo, ll):
    """An attention output from its numerator and denominator (0 where no token was seen)."""
    if ll > float32(0.0):
        return oo / ll
    return float32(0.0)

