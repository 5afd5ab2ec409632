"""Scatter new K/V vectors into the paged cache (the article's writer side, ``main.cpp:866-872``
for decode and ``main.cpp:265`` for prefill, done on the GPU instead of with host copies).

One thread per (token, element of KV_DIM), over a grid-stride loop:
    phys = block_table[slot, layer, pos // BLOCK_SIZE]
    K goes to phys * BLOCK_ELEMS + (pos % BLOCK_SIZE) * KV_DIM + h * D + d
    V goes to the same offset + V_OFFSET_ELEMS
The layout constants come from the cache's ``CacheConfig`` as arguments: one definition for the
host and the kernels (the article's ``kernels.cu:6`` TODO).  It is a pure copy (k/v and the
cache share a dtype), so bf16 moves as int16 bits.  A token whose block-table entry is -1 is
skipped (the backend's optional host check reports it; the kernel cannot raise).
"""

from __future__ import annotations

from numba import cuda
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel


@cached_kernel
def write_kv_kernel(k, k_row_stride, v, v_row_stride, kv_cache, block_table, layer, slots,
                    positions, n_tokens, KV_DIM, BLOCK_SIZE, BLOCK_ELEMS, V_OFFSET_ELEMS):
    n = n_tokens * KV_DIM
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for item in range(start, n, stride):
        t = item // KV_DIM
        e = item - t * KV_DIM                   # e = kv_head * D + d
        pos = positions[t]
        phys = block_table[slots[t], layer, pos // BLOCK_SIZE]
        if phys >= 0:
            dst = phys * BLOCK_ELEMS + (pos % BLOCK_SIZE) * KV_DIM + e
            kv_cache[dst] = k[t * k_row_stride + e]
            kv_cache[dst + V_OFFSET_ELEMS] = v[t * v_row_stride + e]
