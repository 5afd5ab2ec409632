"""RoPE and the K/V cache write fused into one kernel (``Backend.rope_write_kv``), in two forms.

The unfused path is two launches per layer: ``rope`` (rotate q and k in place) and
``write_kv`` (scatter k and v into their paged blocks).  Both kernels here walk the q heads then
the KV heads of every token, and treat a head the same way:

- a q head has its pairs (i, i + D/2) rotated in place, exactly as ``rope.py`` does;
- a KV head has its pairs of k rotated, stored back into k (prefill attention reads the rotated
  k) *and* into the token's cache row, and the same elements of v copied into the cache.

``rope_write_kv_kernel`` (scalar): one work item is one (token, head, i < D/2) pair, each
element moved by its own 2- or 4-byte load or store.  It takes any layout.

``rope_write_kv_vec_kernel`` (16 bytes per access, ``device/vector_io.py``): one work item is
one (token, head, run of E consecutive pair indices i), E = 8 for bf16 and float16, 4 for
float32, so that x[i..i+E) and x[i+D/2..i+D/2+E) of q or k, the same two runs of v and their
two cache destinations are each one 16-byte load or store, and the run's cos and sin (float32)
E / 4 loads each.  The arrays are passed as int32 words (``vector_io.chunk_codec`` converts
them), so the backend takes it only where every such access is 16-byte aligned: D / 2 a
multiple of E, the row strides of q, k and v multiples of E, and q, k, v, the cache, cos and
sin starting on 16 bytes, and the dtype one of 2 bytes (``NumbaBackend._rope_vec_ok``);
elsewhere the scalar kernel.  The kernel compiles for float32 too, and gives the scalar
kernel's bits in the simulator, but on a GPU the compiler fuses a float32 product and the sum
into one FMA, differently in the two kernels; so float32, which the GPU path does not use,
stays on the scalar kernel.

Both compute with ``rope.py``'s helpers, so the rounding is the same: cos/sin rounded to the
storage dtype, each product rounded (``rotate_values``), the sum rounded on store.  The cache
receives the very bits stored into k, so in bfloat16 and float16 either kernel gives bit for
bit ``rope`` followed by ``write_kv``.  A token whose block-table entry is -1 is not written to the cache (as
``write_kv_kernel``).
"""

from __future__ import annotations

import functools

from numba import cuda, float32

from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS
from paged_tutorial.backends.numba_cuda.device.sim_shim import libdevice
from paged_tutorial.backends.numba_cuda.device.vector_io import (CHUNK_WORDS, chunk_codec, chunk_elems,
                                                                 load_u32x4, load_u32x4_nc,
                                                                 store_u32x4)
from paged_tutorial.backends.numba_cuda.kernels.rope import (rope_item_function, rotate_pair_function,
                                                             rotate_values_function)
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


@functools.lru_cache(maxsize=None)
def rope_write_kv_vec_kernel(dtype_name: str):
    """``rope_write_kv_kernel`` moving 16-byte chunks (module docstring).  Takes the arguments
    of the scalar kernel, with q, k, v, the cache, cos and sin as int32 words (two elements of
    a 2-byte dtype per word, one float32) and the row strides of q, k and v counted in words;
    the other sizes stay in elements."""
    ops = DTYPE_OPS[dtype_name]
    rnd = ops.rnd
    rotate = rotate_values_function(dtype_name)
    decode, encode = chunk_codec(dtype_name)
    E = chunk_elems(ops.torch_dtype.itemsize)      # elements (pairs) per work item
    PER_WORD = E // CHUNK_WORDS                      # elements per int32 word
    TRIG_LOADS = E // CHUNK_WORDS                    # 16-byte loads of cos (and of sin) per item

    @cuda.jit(device=True)
    def rotate_chunk(x, lo, hi, c, s, x1, x2):
        """Rotate the run at word ``lo`` with its partner run at word ``hi`` by (c, s); return
        the eight words to store (the run's four, then its partner's)."""
        l0, l1, l2, l3 = load_u32x4(x, lo)
        h0, h1, h2, h3 = load_u32x4(x, hi)
        decode(l0, l1, l2, l3, x1)
        decode(h0, h1, h2, h3, x2)
        for j in range(E):
            a, b = rotate(x1[j], x2[j], c[j], s[j])
            x1[j] = a
            x2[j] = b
        a0, a1, a2, a3 = encode(x1)
        b0, b1, b2, b3 = encode(x2)
        return a0, a1, a2, a3, b0, b1, b2, b3

    @cached_kernel
    def rope_write_kv_vec(q, q_row_words, n_q_heads, k, k_row_words, v, v_row_words,
                          n_kv_heads, head_dim, positions, cos, sin, n_tokens, kv_cache,
                          block_table, layer, slots, KV_DIM, BLOCK_SIZE, BLOCK_ELEMS,
                          V_OFFSET_ELEMS):
        half = head_dim // 2
        runs = half // E                             # work items per head
        half_words = half // PER_WORD
        v_offset_words = V_OFFSET_ELEMS // PER_WORD
        heads = n_q_heads + n_kv_heads
        n = n_tokens * heads * runs
        x1 = cuda.local.array(E, float32)
        x2 = cuda.local.array(E, float32)
        c = cuda.local.array(E, float32)
        s = cuda.local.array(E, float32)
        start = cuda.grid(1)
        stride = cuda.gridsize(1)
        for item in range(start, n, stride):
            t = item // (heads * runs)
            rest = item - t * heads * runs
            h = rest // runs
            i = (rest - h * runs) * E                # the run's first pair index
            pos = positions[t]
            for j in range(TRIG_LOADS):              # cos/sin rounded to the dtype, as rope_item
                at = pos * half + i + j * CHUNK_WORDS
                cw = load_u32x4_nc(cos, at)
                sw = load_u32x4_nc(sin, at)
                for m in range(CHUNK_WORDS):
                    c[j * CHUNK_WORDS + m] = rnd(libdevice.int_as_float(cw[m]))
                    s[j * CHUNK_WORDS + m] = rnd(libdevice.int_as_float(sw[m]))
            if h < n_q_heads:
                lo = t * q_row_words + (h * head_dim + i) // PER_WORD
                a0, a1, a2, a3, b0, b1, b2, b3 = rotate_chunk(q, lo, lo + half_words, c, s,
                                                              x1, x2)
                store_u32x4(q, lo, a0, a1, a2, a3)
                store_u32x4(q, lo + half_words, b0, b1, b2, b3)
            else:
                kh = h - n_q_heads
                lo = t * k_row_words + (kh * head_dim + i) // PER_WORD
                a0, a1, a2, a3, b0, b1, b2, b3 = rotate_chunk(k, lo, lo + half_words, c, s,
                                                              x1, x2)
                store_u32x4(k, lo, a0, a1, a2, a3)
                store_u32x4(k, lo + half_words, b0, b1, b2, b3)
                phys = block_table[slots[t], layer, pos // BLOCK_SIZE]
                if phys >= 0:
                    dst = (phys * BLOCK_ELEMS + (pos % BLOCK_SIZE) * KV_DIM + kh * head_dim
                           + i) // PER_WORD
                    store_u32x4(kv_cache, dst, a0, a1, a2, a3)          # the words just stored
                    store_u32x4(kv_cache, dst + half_words, b0, b1, b2, b3)
                    vlo = t * v_row_words + (kh * head_dim + i) // PER_WORD
                    v0, v1, v2, v3 = load_u32x4(v, vlo)
                    store_u32x4(kv_cache, dst + v_offset_words, v0, v1, v2, v3)
                    v0, v1, v2, v3 = load_u32x4(v, vlo + half_words)
                    store_u32x4(kv_cache, dst + v_offset_words + half_words, v0, v1, v2, v3)

    return rope_write_kv_vec
