"""Sampling without sorting: thread blocks per row of logits, block-wide reductions only.

The rule is ``paged_tutorial.model.sampling`` (``sample_reference``):

- temperature 0: greedy, the first index of the largest logit.  One block reading a
  128256-entry row alone takes ~60 us (benchmarks/results/decode-2026-11-30.json); so the row
  is split over ``greedy_parts(B)`` blocks, each finds its part's winner (``block_argmax``)
  and publishes it, and the last block to finish (an atomic ticket per row, as in
  ``attention_fast.py``) picks the winner of the winners (``beats``: ties to the smaller id).
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

Equality with ``sample_reference``: the same token for the same logits and uniform, except
when u * total falls within float rounding of a CDF step or M(p_i) within rounding of top_p
(sums are taken in a different order) -- "ties aside".
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32

from paged_tutorial.backends.numba_cuda.device.reduce import MAX_WARPS, beats, block_argmax, block_max, block_sum
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING, libdevice, threadfence
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel

MAX_SAMPLE_THREADS = 1024


def greedy_parts(batch: int, simulating: bool = SIMULATING) -> int:
    """Blocks per row for the greedy path: about 256 blocks in all (two per SM of an H200:
    the kernel's 512-thread blocks, sized for the top-p path, fit two per SM; 1024 blocks
    measured slower at batch 64, 51 us against 36), at most 64 per row.  Depends only on the
    batch size, so a CUDA graph can fix it."""
    if simulating:
        return 2                                       # exercise the merge, cheaply
    return max(1, min(64, -(-256 // max(1, batch))))



@cached_kernel
def sample_kernel(logits, logits_row_stride, vocab, temperature, top_p, uniforms, probs, out,
                  part_v, part_i, tickets):
    """Launch: ``grid = (B, parts)``, ``block`` = a multiple of 32, at most 1024.  ``part_v`` /
    ``part_i``: float32 / int32 scratch of B * parts entries; ``tickets``: int32, B entries,
    zero before the launch (left at zero)."""
    row = cuda.blockIdx.x
    part = cuda.blockIdx.y
    n_parts = cuda.gridDim.y
    tid = cuda.threadIdx.x
    n_threads = cuda.blockDim.x
    red_v = cuda.shared.array(MAX_WARPS, float32)
    red_i = cuda.shared.array(MAX_WARPS, int32)
    chunk_mass = cuda.shared.array(MAX_SAMPLE_THREADS, float32)
    chosen_chunk = cuda.shared.array(1, int32)
    chosen_prefix = cuda.shared.array(2, float32)      # [running mass before, target]
    is_last = cuda.shared.array(1, int32)
    base = row * logits_row_stride
    t = float32(temperature[row])

    if t == float32(0.0):
        # --- greedy: first index of the maximum, the row split over ``parts`` blocks -------
        span = (vocab + n_parts - 1) // n_parts
        lo = part * span
        hi = min(lo + span, vocab)
        best = float32(-math.inf)
        best_i = int32(vocab)                          # "nothing yet": loses every tie
        for i in range(lo + tid, hi, n_threads):       # increasing i: the first max stays
            x = float32(logits[base + i])
            if beats(x, int32(i), best, best_i):
                best = x
                best_i = int32(i)
        best_i = block_argmax(best, best_i, red_v, red_i)
        if n_parts == 1:
            if tid == 0:
                out[row] = best_i
            return
        if tid == 0:                                   # publish this part's winner
            part_v[row * n_parts + part] = float32(logits[base + best_i]) if best_i < vocab \
                else float32(-math.inf)
            part_i[row * n_parts + part] = best_i
            threadfence()
            ticket = cuda.atomic.add(tickets, row, 1)
            is_last[0] = 1 if ticket == n_parts - 1 else 0
        cuda.syncthreads()
        if is_last[0] == 1 and tid == 0:               # the last part to finish merges
            threadfence()
            bv = part_v[row * n_parts]
            bi = part_i[row * n_parts]
            for p in range(1, n_parts):
                if beats(part_v[row * n_parts + p], part_i[row * n_parts + p], bv, bi):
                    bv = part_v[row * n_parts + p]
                    bi = part_i[row * n_parts + p]
            out[row] = bi
            tickets[row] = 0
        return
    if part != 0:                                      # top-p rows: one block does the row
        return

    # --- p = softmax(logits / T) into the scratch row --------------------------------
    prow = row * vocab
    m = float32(-math.inf)
    for i in range(tid, vocab, n_threads):
        m = max(m, float32(logits[base + i]) / t)
    m = block_max(m, red_v)
    z = float32(0.0)
    for i in range(tid, vocab, n_threads):
        e = float32(math.exp(float32(logits[base + i]) / t - m))
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
