"""The loops of ``cpu_decode_ops.py``, compiled by Numba (import them through that module).

Each works on numpy views of the torch tensors: float32 rows of activations, the cache as
float32 [NUM_BLOCKS, 2 (K, V), BLOCK_SIZE, KV_DIM], the block table as int32 [slots, layers,
blocks], int32 positions, slots and lengths.  Each loop has one signature, compiled when this
module is first imported (or read from Numba's disk cache): a step never compiles.
"""

from __future__ import annotations

from paged_tutorial.backends.numba_env import decide_numba_environment

decide_numba_environment()      # before Numba reads its environment, at its first import

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402


@njit("void(f4[:, :], f4[:, ::1], f4[::1], f8, f4[:, ::1])", nogil=True, cache=True)
def rms_norm_rows(x, residual, weight, eps, out):
    """out[b] = weight * (r * rsqrt(mean(r^2) + eps)) with r = residual[b] + x[b] (written back
    into residual) when ``x`` has rows, else r = residual[b]."""
    n_rows, width = residual.shape
    add = x.shape[0] == n_rows
    for b in range(n_rows):
        if add:
            for i in range(width):
                residual[b, i] += x[b, i]
        squares = np.float32(0.0)
        for i in range(width):
            squares += residual[b, i] * residual[b, i]
        inv = np.float32(1.0) / np.sqrt(squares / np.float32(width) + np.float32(eps))
        for i in range(width):
            out[b, i] = weight[i] * (residual[b, i] * inv)


@njit("b1(i4[:, :, ::1], i8, i8, i8, i8, i8)", nogil=True, cache=True)
def entries_valid(table, slot, layer, n_tokens, block_size, n_blocks):
    """Every logical block below n_tokens of (slot, layer) names a block in [0, n_blocks)."""
    needed = (n_tokens + block_size - 1) // block_size
    if slot < 0 or slot >= table.shape[0] or layer < 0 or layer >= table.shape[1] \
            or needed > table.shape[2]:
        return False
    for logical in range(needed):
        entry = table[slot, layer, logical]
        if entry < 0 or entry >= n_blocks:
            return False
    return True


@njit("b1(f4[:, :], i8, i8, i4[::1], f4[:, ::1], f4[:, ::1], f4[:, :, :, ::1], i4[:, :, ::1], "
      "i8, i4[::1])", nogil=True, cache=True)
def rope_write_kv_rows(qkv, n_q_heads, head_dim, positions, cos, sin, cache, table, layer,
                        slots):
    """RoPE on the q and k heads of qkv [T, (nH + 2 nKV) * D] in place, then its k and v
    written into ``cache`` [NUM_BLOCKS, 2, BLOCK_SIZE, KV_DIM] at block table[slots[t], layer,
    positions[t] // BLOCK_SIZE], row positions[t] % BLOCK_SIZE.  False (and nothing done) when
    an entry below a token's position is not a block of the cache, or the shapes disagree."""
    n_tokens = qkv.shape[0]
    n_blocks, _, block_size, kv_dim = cache.shape
    if qkv.shape[1] != n_q_heads * head_dim + 2 * kv_dim or kv_dim % head_dim \
            or cos.shape[1] * 2 != head_dim or sin.shape[0] != cos.shape[0] \
            or sin.shape[1] != cos.shape[1] or slots.shape[0] != n_tokens \
            or positions.shape[0] != n_tokens:
        return False
    for t in range(n_tokens):
        if positions[t] < 0 or positions[t] >= cos.shape[0] or not entries_valid(
                table, slots[t], layer, positions[t] + 1, block_size, n_blocks):
            return False
    half = head_dim // 2
    n_rotated = n_q_heads * head_dim + kv_dim
    q_dim = n_q_heads * head_dim
    for t in range(n_tokens):
        pos = positions[t]
        for start in range(0, n_rotated, head_dim):
            for i in range(half):
                c, s = cos[pos, i], sin[pos, i]
                x1 = qkv[t, start + i]
                x2 = qkv[t, start + half + i]
                qkv[t, start + i] = x1 * c - x2 * s
                qkv[t, start + half + i] = x2 * c + x1 * s
        block = table[slots[t], layer, pos // block_size]
        row = pos % block_size
        for i in range(kv_dim):
            cache[block, 0, row, i] = qkv[t, q_dim + i]
            cache[block, 1, row, i] = qkv[t, q_dim + kv_dim + i]
    return True


@njit("b1(f4[:, :, :], f4[:, :, :, ::1], i4[:, :, ::1], i8, i4[::1], i4[::1], f8, f4[::1])",
      nogil=True, cache=True, fastmath={"reassoc", "contract"})
def decode_attention_rows(q, cache, table, layer, slots, seq_lens, scale, scores):
    """In place: q[b, h] <- softmax(scale * q[b, h] . K) V over the first seq_lens[b] tokens of
    (slots[b], layer), K and V read block by block through the table; query head h reads KV
    head h // (nH / nKV).  ``scores`` is scratch of at least max(seq_lens) floats.  False
    (and nothing done) when an entry below a length is not a block of the cache, or the
    shapes disagree."""
    n_rows, n_heads, head_dim = q.shape
    n_blocks, _, block_size, kv_dim = cache.shape
    scale32 = np.float32(scale)
    if kv_dim % head_dim or n_heads % (kv_dim // head_dim) or slots.shape[0] != n_rows \
            or seq_lens.shape[0] != n_rows:
        return False
    group = n_heads // (kv_dim // head_dim)
    for b in range(n_rows):
        if seq_lens[b] < 1 or seq_lens[b] > scores.shape[0] or not entries_valid(
                table, slots[b], layer, seq_lens[b], block_size, n_blocks):
            return False
    query = np.empty(head_dim, np.float32)           # q[b, h], contiguous
    out = np.empty(head_dim, np.float32)
    for b in range(n_rows):
        slot, length = slots[b], seq_lens[b]
        for h in range(n_heads):
            kv = (h // group) * head_dim
            for i in range(head_dim):
                query[i] = q[b, h, i]
            top = np.float32(-np.inf)
            for p in range(length):
                key = cache[table[slot, layer, p // block_size], 0, p % block_size,
                            kv:kv + head_dim]
                dot = np.float32(0.0)
                for i in range(head_dim):
                    dot += query[i] * key[i]
                score = dot * scale32
                scores[p] = score
                top = max(top, score)
            total = np.float32(0.0)
            for p in range(length):
                e = np.exp(scores[p] - top)
                scores[p] = e
                total += e
            out[:] = 0.0
            for p in range(length):
                value = cache[table[slot, layer, p // block_size], 1, p % block_size,
                              kv:kv + head_dim]
                weight = scores[p] / total
                for i in range(head_dim):
                    out[i] += weight * value[i]
            for i in range(head_dim):
                q[b, h, i] = out[i]
    return True
