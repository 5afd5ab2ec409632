"""Prefill attention: causal attention inside each sequence of a packed prompt batch, with GQA.

A simple tiled kernel with an online softmax (the FlashAttention recurrence, in its plainest
form):

- one block per (query tile, query head); a query tile is TILE consecutive tokens of *one*
  sequence, so a block never mixes sequences.  ``tiles[b] = (seq_start, seq_end, q_start)``
  is built on the host from ``cu_seqlens``.
- thread ``i`` owns query ``q_start + i``: it keeps that query row (pre-loaded as float32) and
  its output accumulator in local arrays of head_dim floats.
- the block walks the keys of its sequence up to its last query, TILE keys at a time: all
  threads copy a K tile and a V tile into shared memory (float32), ``syncthreads``, then every
  thread scores its query against the tile's keys that are not in its future (the causal mask
  is just the loop bound ``key <= query``), updating running max ``m``, denominator ``l`` and
  the accumulator, ``syncthreads`` before the next tile overwrites shared memory.
- output = acc / l, written to a new tensor.

Every thread reads the same K/V element at the same time (a shared-memory broadcast), so there
are no bank conflicts; the price is head_dim-float local arrays per thread.  Good enough for
prompts of a few thousand tokens; faster kernels can replace it behind the same method.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel

SHARED_FLOATS = 8192          # 32 KiB of shared memory for the K and V tiles together


def tile_for(head_dim: int, simulating: bool) -> int:
    """Keys (and queries) per tile: 64 when K+V tiles fit in 32 KiB, fewer for big heads;
    16 in the simulator (fewer idle Python threads in short test prompts)."""
    if simulating:
        return 16
    return max(1, min(64, SHARED_FLOATS // (2 * head_dim)))


@functools.lru_cache(maxsize=None)
def make_prefill_kernel(dtype_name: str, HEAD_DIM: int, TILE: int):
    """Launch: ``grid = (n_tiles, n_q_heads)``, ``block = TILE``."""
    ops = DTYPE_OPS[dtype_name]
    load, store = ops.load, ops.store

    @cached_kernel
    def prefill_attention_kernel(q, q_row_stride, k, k_row_stride, v, v_row_stride, out,
                                 tiles, q_per_kv, scale):
        tile = cuda.blockIdx.x
        head = cuda.blockIdx.y
        tid = cuda.threadIdx.x
        kv_head = head // q_per_kv
        seq_start = tiles[tile, 0]
        seq_end = tiles[tile, 1]
        q_start = tiles[tile, 2]
        query = q_start + tid                      # this thread's token (packed row index)
        active = query < seq_end
        key_end = min(q_start + TILE, seq_end)     # keys this block needs: [seq_start, key_end)

        k_tile = cuda.shared.array((TILE, HEAD_DIM), float32)
        v_tile = cuda.shared.array((TILE, HEAD_DIM), float32)
        q_row = cuda.local.array(HEAD_DIM, float32)
        acc = cuda.local.array(HEAD_DIM, float32)

        if active:
            for dd in range(HEAD_DIM):
                q_row[dd] = load(q, query * q_row_stride + head * HEAD_DIM + dd)
                acc[dd] = float32(0.0)
        m = float32(-math.inf)
        l = float32(0.0)
        sc = float32(scale)

        for key0 in range(seq_start, key_end, TILE):
            # all threads copy TILE keys and values (coalesced along head_dim)
            for e in range(tid, TILE * HEAD_DIM, TILE):
                r = e // HEAD_DIM
                c = e - r * HEAD_DIM
                key = key0 + r
                if key < key_end:
                    k_tile[r, c] = load(k, key * k_row_stride + kv_head * HEAD_DIM + c)
                    v_tile[r, c] = load(v, key * v_row_stride + kv_head * HEAD_DIM + c)
            cuda.syncthreads()
            if active:
                n_keys = min(TILE, query - key0 + 1)   # causal: keys <= query only
                for j in range(n_keys):
                    s = float32(0.0)
                    for dd in range(HEAD_DIM):
                        s += q_row[dd] * k_tile[j, dd]
                    s = s * sc
                    new_m = max(m, s)
                    correction = math.exp(m - new_m)
                    p = math.exp(s - new_m)
                    m = new_m
                    l = l * correction + p
                    for dd in range(HEAD_DIM):
                        acc[dd] = acc[dd] * correction + p * v_tile[j, dd]
            cuda.syncthreads()                         # before the next tile overwrites

        if active:
            inv_l = float32(1.0) / l
            for dd in range(HEAD_DIM):
                store(out, query * HEAD_DIM * cuda.gridDim.y + head * HEAD_DIM + dd,
                      acc[dd] * inv_l)

    return prefill_attention_kernel
