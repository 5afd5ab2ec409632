"""Rotary position embedding, in place on q and k (HF's rotate-half convention).

For head dim D and i < D/2, with c = cos[pos, i], s = sin[pos, i]:
    x[i]       <- x[i] * c - x[i + D/2] * s
    x[i + D/2] <- x[i + D/2] * c + x[i] * s
One work item is one (token, head, i) pair, over the q heads then the k heads, in one launch.
Rounding follows HF on bf16 tensors: cos/sin are rounded to the model dtype first, each product
is rounded, and so is the sum (``TorchBackend.rope``).
"""

from __future__ import annotations

import functools

from numba import cuda

from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS
from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import cached_kernel


@functools.lru_cache(maxsize=None)
def rope_item_function(dtype_name: str):
    """Device function: grid-stride item -> (token, head, i, position, c, s): pair i of one
    head (q heads, then k heads) of one token, with its cos and sin rounded to the model
    dtype as HF does; shared by ``rope`` and the fused ``rope_write_kv``."""
    rnd = DTYPE_OPS[dtype_name].rnd

    @cuda.jit(device=True)
    def rope_item(item, heads, half, positions, cos, sin):
        t = item // (heads * half)
        rest = item - t * heads * half
        h = rest // half
        i = rest - h * half
        pos = positions[t]
        return t, h, i, pos, rnd(cos[pos * half + i]), rnd(sin[pos * half + i])

    return rope_item


@functools.lru_cache(maxsize=None)
def rotate_values_function(dtype_name: str):
    """Device function ``rotate_values(x1, x2, c, s) -> (x1', x2')``: the rotation of one pair
    with HF's rounding (each product rounded to the model dtype; the caller rounds the sums
    when it stores them).  Every kernel that applies RoPE calls this one: ``rope``,
    ``rope_write_kv`` and the QKV GEMV's epilogue (``gemv.py``)."""
    rnd = DTYPE_OPS[dtype_name].rnd

    @cuda.jit(device=True)
    def rotate_values(x1, x2, c, s):
        return rnd(x1 * c) - rnd(x2 * s), rnd(x2 * c) + rnd(x1 * s)

    return rotate_values


#: the bf16 rotation, for the kernels that only exist for bf16
rotate_values = rotate_values_function("bfloat16")


@functools.lru_cache(maxsize=None)
def rotate_pair_function(dtype_name: str):
    """Device function rotating the pair (x[lo], x[hi]) by (c, s) in place
    (``rotate_values``); shared by ``rope`` and the fused ``rope_write_kv``."""
    ops = DTYPE_OPS[dtype_name]
    load, store = ops.load, ops.store
    rotate = rotate_values_function(dtype_name)

    @cuda.jit(device=True)
    def rotate_pair(x, lo, hi, c, s):
        a, b = rotate(load(x, lo), load(x, hi), c, s)
        store(x, lo, a)
        store(x, hi, b)

    return rotate_pair


@functools.lru_cache(maxsize=None)
def rope_kernel(dtype_name: str):
    rope_item = rope_item_function(dtype_name)
    rotate_pair = rotate_pair_function(dtype_name)

    @cached_kernel
    def rope(q, q_row_stride, n_q_heads, k, k_row_stride, n_kv_heads, head_dim,
             positions, cos, sin, n_tokens):
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
                lo = t * k_row_stride + (h - n_q_heads) * head_dim + i
                rotate_pair(k, lo, lo + half, c, s)

    return rope
