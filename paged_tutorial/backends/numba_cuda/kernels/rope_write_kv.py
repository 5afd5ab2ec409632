"""RoPE and the K/V cache write fused into one kernel (``Backend.rope_write_kv``).

The unfused path is two launches per layer: ``rope`` (rotate q and k in place) and
``write_kv`` (scatter k and v into their paged blocks).  Here one work item is one
(token, head, i < D/2) pair, over the q heads then the KV heads:

- a q-head item rotates the pair (i, i + D/2) of q in place, exactly as ``rope.py`` does;
- a KV-head item rotates the pair of k, stores it back into k (prefill attention reads the
  rotated k) *and* into the token's cache row, then copies the same two elements of v.

Rounding is ``rope.py``'s (cos/sin rounded to the storage dtype, each product rounded, the sum
rounded on store), and the cache receives the very bits stored into k, so the result is bit
for bit ``rope`` followed by ``write_kv``.  A token whose block-table entry is -1 is not
written to the cache (as ``write_kv_kernel``).
"""

from __future__ import annotations

import functools

from numba import cuda

from paged_tutorial.backends.numba_cuda.kernels.rope import rope_item_function, rotate_pair_function
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel


@functools.lru_cache(maxsize=None)
def rope_write_kv_kernel(dtype_name: str):
    rope_item = rope_item_function(dtype_name)
    rotate_pair = rotate_pair_function(dtype_name)

    @cached_kernel
    def rope_write_kv(q, q_row_stride, n_q_heads, k, k_row_stride, v, v_row_stride,
                      n_kv_heads, head_dim, positions, cos, sin, n_tokens, kv_cache,
                      block_table, layer, slots, KV_DIM, BLOCK_SIZE, BLOCK_ELEMS,
                      V_OFFSET_ELEMS):
        half = head_dim // 2
        heads = n_q_heads + n_kv_heads
        n = n_tokens * heads * half
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for item in range(start, n, stride):
            t, h, i, pos, c, s = rope_item(item, heads, half, positions, cos, sin)
            if h < n_q_heads:
                lo = t * q_row_stride + h * head_dim + i
                rotate_pair(q, lo, lo + half, c, s)
            else:
                kh = h - n_q_heads
                lo = t * k_row_stride + kh * head_dim + i
                rotate_pair(k, lo, lo + half, c, s)
                phys = block_table[slots[t], layer, pos // BLOCK_SIZE]
                if phys >= 0:
                    dst = phys * BLOCK_ELEMS + (pos % BLOCK_SIZE) * KV_DIM + kh * head_dim + i
                    kv_cache[dst] = k[lo]                      # the bits just stored
                    kv_cache[dst + half] = k[lo + half]
                    vlo = t * v_row_stride + kh * head_dim + i
                    kv_cache[dst + V_OFFSET_ELEMS] = v[vlo]
                    kv_cache[dst + V_OFFSET_ELEMS + half] = v[vlo + half]

    return rope_write_kv
