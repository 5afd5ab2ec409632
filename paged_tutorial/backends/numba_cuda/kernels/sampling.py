"""Sampling without sorting: thread blocks per row of logits, block-wide reductions only.

The rule is ``paged_tutorial.backends.sampling_rule`` (``sample_reference``):

- temperature 0: greedy, the first index of the largest logit.  One block reading a
  128256-entry row alone is slow (a single SM's bandwidth), so the row is split over
  ``greedy_parts(B)`` blocks, each finds its part's winner (``block_argmax``; every thread
  issues ``GREEDY_UNROLL`` loads before it compares: 16-byte loads of eight bf16 logits where
  the rows allow, ``vector`` below, else one logit each) and publishes it, and the last block
  to finish (an atomic ticket per row, as in ``attention_fast.py``) picks the winner of the
  winners, one part per thread (``beats``: ties to the smaller id, NaN above everything).
- otherwise (one block per row; the other blocks of the row return at once)
  p = softmax(logits / T) (a max reduction, then a sum reduction of the exps; the
  probabilities go to a float32 scratch row).  Top-p keeps token i when the mass of the tokens
  strictly more likely than i, M(p_i) = sum of p_j > p_i, is below top_p.  M(v) only decreases
  as v grows, so the kept set is {i : p_i >= theta} for the smallest value theta with
  M(theta) < top_p.  theta is found by **bisection on the float's bit pattern** (positive
  float32s are ordered like their int32 bits) between 0 and max(p): at most 31 steps, each one
  block-wide sum of M(mid).  No sort, no per-token state.
- the inverse CDF in token-id order: thread t owns the contiguous ids [t*C, (t+1)*C); each
  thread sums its kept mass; thread 0 walks the per-thread sums to find the chunk where the
  running mass reaches u * (kept total); that chunk's owner walks its ids to the first kept,
  non-zero token where it does.

The logits are read in the dtype the LM head wrote them (``sample_kernel_for``); bf16 rows whose
length and stride are multiples of 8 and that start 16-byte aligned are handed over as int32
words (``vector``), so the greedy scan loads a 16-byte chunk per load.  The kernel
is launched overlapped with the LM head (``device/grid_dependency.py``): it reads its row's
temperature, then waits for the logits.

Equality with ``sample_reference``: the same token for the same logits and uniform, except
when u * total falls within float rounding of a CDF step or M(p_i) within rounding of top_p
(sums are taken in a different order) -- "ties aside".
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, int32

from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS
from paged_tutorial.backends.numba_cuda.device.grid_dependency import (allow_next_grid,
                                                                        wait_for_previous_grid)
from paged_tutorial.backends.numba_cuda.device.reduce import MAX_WARPS, beats, block_argmax, block_max, block_sum
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING, libdevice, threadfence
from paged_tutorial.backends.numba_cuda.device.vector_io import (CHUNK_ELEMS, CHUNK_WORDS,
                                                                  load_u32x4, unpack2)
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel
from paged_tutorial.backends.numba_cuda.runtime.launch import overlapping

MAX_SAMPLE_THREADS = 1024


def greedy_parts(batch: int, simulating: bool = SIMULATING) -> int:
    """Blocks per row for the greedy path: about 256 blocks in all (two per SM of an H200:
    the kernel's 512-thread blocks, sized for the top-p path, fit two per SM; more blocks
    were slower at batch 64), at most 64 per row.  Depends only on the
    batch size, so a CUDA graph can fix it."""
    if simulating:
        return 2                                       # exercise the merge, cheaply
    return max(1, min(64, -(-256 // max(1, batch))))



#: loads a thread of the greedy path issues at once (independent loads in flight, then the
#: comparisons): a loop of one load and one comparison waits for every load in turn
GREEDY_UNROLL = 8


@cuda.jit(device=True)
def bf16_from_words(words, i):
    """Element i of bf16 values stored two to an int32 word (element 2j in the low half)."""
    lo, hi = unpack2(words[i >> 1])
    return hi if i & 1 else lo


def part_argmax_elements(load):
    """Device function ``(logits, base, lo, hi, vocab, tid, n_threads) -> (value, index)``:
    this thread's winner (``beats``) among the logits lo <= i < hi of the row at ``base``,
    one ``load`` per logit (index ``vocab``: none)."""

    @cuda.jit(device=True)
    def part_argmax(logits, base, lo, hi, vocab, tid, n_threads):
        vals = cuda.local.array(GREEDY_UNROLL, float32)
        best = float32(-math.inf)
        best_i = int32(vocab)                      # "nothing yet": loses every tie
        for i0 in range(lo + tid, hi, n_threads * GREEDY_UNROLL):
            for u in range(GREEDY_UNROLL):         # every load first ...
                i = i0 + u * n_threads
                vals[u] = load(logits, base + i) if i < hi else float32(-math.inf)
            for u in range(GREEDY_UNROLL):         # ... then the comparisons
                i = int32(i0 + u * n_threads)      # (ties go to the smaller id)
                if i < hi and beats(vals[u], i, best, best_i):
                    best = vals[u]
                    best_i = i
        return best, best_i

    return part_argmax


@cuda.jit(device=True)
def part_argmax_words(logits, base, lo, hi, vocab, tid, n_threads):
    """``part_argmax_elements`` for bf16 logits as int32 words, a 16-byte chunk of eight per
    load: ``base``, ``lo`` and ``hi`` are multiples of 8 (``hi`` may be ``vocab``, itself one)."""
    words = cuda.local.array((GREEDY_UNROLL, CHUNK_WORDS), int32)
    best = float32(-math.inf)
    best_i = int32(vocab)
    c_lo = lo // CHUNK_ELEMS
    c_hi = hi // CHUNK_ELEMS
    w_base = base // 2
    for c0 in range(c_lo + tid, c_hi, n_threads * GREEDY_UNROLL):
        for u in range(GREEDY_UNROLL):             # every load first ...
            c = c0 + u * n_threads
            if c < c_hi:
                w0, w1, w2, w3 = load_u32x4(logits, w_base + c * CHUNK_WORDS)
            else:
                w0 = w1 = w2 = w3 = int32(0)
            words[u, 0] = w0
            words[u, 1] = w1
            words[u, 2] = w2
            words[u, 3] = w3
        for u in range(GREEDY_UNROLL):             # ... then the comparisons
            c = c0 + u * n_threads
            if c < c_hi:
                for k in range(CHUNK_WORDS):
                    a, b = unpack2(words[u, k])
                    i = int32(c * CHUNK_ELEMS + 2 * k)
                    if beats(a, i, best, best_i):
                        best = a
                        best_i = i
                    if beats(b, i + 1, best, best_i):
                        best = b
                        best_i = i + 1
    return best, best_i


@functools.lru_cache(maxsize=None)
def sample_kernel_for(dtype_name: str, vector: bool = False):
    """The sampling kernel for logits stored as ``dtype_name`` (bf16 logits are read as they
    are: no float32 copy of the [B, vocab] row first).  ``vector`` (bf16 only): ``logits`` is
    the rows as int32 words, ``vocab`` and ``logits_row_stride`` (in logits, as always)
    multiples of 8, the rows 16-byte aligned.
    Launch: ``grid = (B, parts)``, ``block`` = a multiple of 32, at most 1024.  ``part_v`` /
    ``part_i``: float32 / int32 scratch of B * parts entries; ``tickets``: int32, B entries,
    zero before the launch (left at zero)."""
    if vector and dtype_name != "bfloat16":
        raise ValueError(f"sample_kernel_for: 16-byte loads are for bf16 logits, not {dtype_name}")
    load = bf16_from_words if vector else DTYPE_OPS[dtype_name].load
    part_argmax = part_argmax_words if vector else part_argmax_elements(load)
    ALIGN = CHUNK_ELEMS if vector else 1           # a part starts at a multiple of this

    @cached_kernel
    @overlapping
    def sample_kernel(logits, logits_row_stride, vocab, temperature, top_p, uniforms, probs,
                      out, part_v, part_i, tickets):
        row = cuda.blockIdx.x
        part = cuda.blockIdx.y
        n_parts = cuda.gridDim.y
        tid = cuda.threadIdx.x
        n_threads = cuda.blockDim.x
        red_v = cuda.shared.array(MAX_WARPS, float32)
        red_i = cuda.shared.array(MAX_WARPS, int32)
        chunk_mass = cuda.shared.array(MAX_SAMPLE_THREADS, float32)
        chosen_chunk = cuda.shared.array(1, int32)
        chosen_prefix = cuda.shared.array(2, float32)  # [running mass before, target]
        is_last = cuda.shared.array(1, int32)
        base = row * logits_row_stride
        t = float32(temperature[row])                  # a step input, read before the wait;
        wait_for_previous_grid()                       # the logits are the previous kernel's
        allow_next_grid()

        if t == float32(0.0):
            # --- greedy: first index of the maximum, the row split over ``parts`` blocks ---
            span = ((vocab + n_parts - 1) // n_parts + ALIGN - 1) // ALIGN * ALIGN
            lo = part * span
            hi = min(lo + span, vocab)
            best, best_i = part_argmax(logits, base, lo, hi, vocab, tid, n_threads)
            best_i = block_argmax(best, best_i, red_v, red_i)
            if n_parts == 1:
                if tid == 0:
                    out[row] = best_i
                return
            if tid == 0:                               # publish this part's winner
                part_v[row * n_parts + part] = load(logits, base + best_i) \
                    if best_i < vocab else float32(-math.inf)
                part_i[row * n_parts + part] = best_i
                threadfence()
                ticket = cuda.atomic.add(tickets, row, 1)
                is_last[0] = 1 if ticket == n_parts - 1 else 0
            cuda.syncthreads()
            if is_last[0] == 1:                        # the last part to finish merges,
                threadfence()                          # one part per thread
                bv = float32(-math.inf)
                bi = int32(vocab)
                for p in range(tid, n_parts, n_threads):
                    pv = part_v[row * n_parts + p]
                    pi = part_i[row * n_parts + p]
                    if beats(pv, pi, bv, bi):
                        bv = pv
                        bi = pi
                bi = block_argmax(bv, bi, red_v, red_i)
                if tid == 0:
                    out[row] = bi
                    tickets[row] = 0
            return
        if part != 0:                                      # top-p rows: one block does the row
            return

        # --- p = softmax(logits / T) into the scratch row --------------------------------
        prow = row * vocab
        m = float32(-math.inf)
        for i in range(tid, vocab, n_threads):
            m = max(m, load(logits, base + i) / t)
        m = block_max(m, red_v)
        z = float32(0.0)
        for i in range(tid, vocab, n_threads):
            e = float32(math.exp(load(logits, base + i) / t - m))
            probs[prow + i] = e
            z += e
        z = block_sum(z, red_v)
        for i in range(tid, vocab, n_threads):           # same elements as above: no barrier
            probs[prow + i] = float32(probs[prow + i] / z)
        p_max = float32(float32(1.0) / z)                # the max element has e = exp(0) = 1

        # --- top-p threshold by bisection on float bits ----------------------------------
        # invariant: M(int_as_float(hi)) < top_p; lo = -1 or M(int_as_float(lo)) >= top_p
        tp = float32(top_p[row])
        lo = int32(-1)
        hi = int32(libdevice.float_as_int(p_max))
        while hi - lo > 1:                               # block-uniform: every thread agrees
            mid = int32((lo + hi) // 2)
            v = libdevice.int_as_float(mid)
            mass = float32(0.0)
            for i in range(tid, vocab, n_threads):
                p = probs[prow + i]
                if p > v:
                    mass += p
            mass = block_sum(mass, red_v)
            if mass < tp:
                hi = mid
            else:
                lo = mid
        theta = libdevice.int_as_float(hi)

        # --- inverse CDF in token-id order, over contiguous chunks -------------------------
        chunk = (vocab + n_threads - 1) // n_threads
        first = tid * chunk
        last = min(first + chunk, vocab)
        kept_mass = float32(0.0)
        for i in range(first, last):
            p = probs[prow + i]
            if p >= theta:
                kept_mass += p
        chunk_mass[tid] = kept_mass
        cuda.syncthreads()
        if tid == 0:
            total = float32(0.0)
            for c in range(n_threads):
                total += chunk_mass[c]
            target = float32(uniforms[row]) * total
            running = float32(0.0)
            pick = int32(-1)
            pick_prefix = float32(0.0)
            for c in range(n_threads):
                cm = chunk_mass[c]
                if cm > float32(0.0):
                    pick = int32(c)                      # falls back to the last non-empty chunk
                    pick_prefix = running
                    if running + cm >= target:
                        break
                    running += cm
            chosen_chunk[0] = pick
            chosen_prefix[0] = pick_prefix
            chosen_prefix[1] = target
        cuda.syncthreads()
        if tid == chosen_chunk[0]:
            running = chosen_prefix[0]
            target = chosen_prefix[1]
            choice = int32(-1)
            for i in range(first, last):
                p = probs[prow + i]
                if p >= theta and p > float32(0.0):
                    choice = int32(i)                    # the last kept id, if rounding runs out
                    running += p
                    if running >= target:
                        break
            out[row] = choice

    return sample_kernel
