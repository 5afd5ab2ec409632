"""What the notebooks and the puzzles grade the kernels against.

- ``kernel_read_trace``: the decode kernel's address arithmetic (``kernels.cu:470-485``)
  replayed in NumPy: every block-table entry and every cache element one thread block reads.
- ``poisoned_copy``: a copy of a cache in which everything such a trace does *not* list is NaN
  (and every unlisted table entry points at an all-NaN block): a kernel that reads anything
  else returns NaN instead of a plausible number.
- ``exact_attention`` (float64, two passes), ``online_softmax_trace`` (the kernel's recurrence,
  token by token, float32) and ``oracle_decode`` (the torch backend, the engine's own oracle,
  on a one-slot cache).
- ``kernel_device`` (where kernel arguments live in this process, from
  ``backends.availability``), ``clone_cache`` (from ``cache.paged_cache``) and
  ``quiet_nan_arithmetic``.

None of this is used by the engine.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from paged_tutorial.backends.availability import kernel_device  # noqa: F401
from paged_tutorial.cache.paged_cache import PagedKVCache, clone_cache  # noqa: F401


# --- the addresses the decode kernel reads -----------------------------------------------------

@dataclass
class ReadTrace:
    """Everything one block (one sequence of the batch, one q head) of the decode kernel reads
    from the block table and the cache, in the kernel's loop order.

    ``k_index[t, d]`` / ``v_index[t, d]``: element index into ``cache.buffer`` that thread
    ``d`` reads for the t-th token (multiply by the itemsize for the article's byte offsets).
    """

    slot: int
    layer: int
    q_head: int
    kv_head: int
    seq_len: int
    num_blocks: int
    table_index: np.ndarray        # [num_blocks] flat block-table entries read
    physical_block: np.ndarray     # [num_blocks] what those entries hold
    tokens_in_block: np.ndarray    # [num_blocks] min(seq_len - lb*BLOCK_SIZE, BLOCK_SIZE)
    logical_block: np.ndarray      # [seq_len] per token
    token_in_block: np.ndarray     # [seq_len] per token
    k_index: np.ndarray            # [seq_len, head_dim]
    v_index: np.ndarray            # [seq_len, head_dim]

    def elements(self) -> np.ndarray:
        """Every cache element this block reads (K then V), sorted."""
        return np.unique(np.concatenate([self.k_index.ravel(), self.v_index.ravel()]))


def _host_table(cache: PagedKVCache, block_table) -> np.ndarray:
    if block_table is None:
        return cache.block_table
    if torch.is_tensor(block_table):
        return block_table.cpu().numpy()
    return np.asarray(block_table)


def kernel_read_trace(cache: PagedKVCache, layer: int, slot: int, seq_len: int, q_head: int,
                      q_per_kv: int, block_table=None) -> ReadTrace:
    """Replay, in NumPy, the address arithmetic of the decode kernel (``attention.py``, the
    article's ``kernels.cu:470-485``) for one (slot, q head): which block-table entries and
    which cache elements it reads.  ``block_table`` defaults to ``cache.block_table``."""
    c = cache.config
    flat_table = _host_table(cache, block_table).reshape(-1)
    kv_head = q_head // q_per_kv
    bs = c.BLOCK_SIZE
    num_blocks = (seq_len + bs - 1) // bs                     # ceil(seq_len / BLOCK_SIZE)
    table_index, physical, tib = [], [], []
    logical_of_token, token_of_token, k_rows = [], [], []
    dims = np.arange(c.head_dim)
    for lb in range(num_blocks):
        ti = slot * c.num_layers * c.MAX_BLOCKS_PER_SEQ + layer * c.MAX_BLOCKS_PER_SEQ + lb
        phys = int(flat_table[ti])
        n = min(seq_len - lb * bs, bs)
        table_index.append(ti)
        physical.append(phys)
        tib.append(n)
        for token in range(n):
            logical_of_token.append(lb)
            token_of_token.append(token)
            k_rows.append(phys * c.BLOCK_ELEMS + token * c.KV_DIM + kv_head * c.head_dim + dims)
    k_index = np.array(k_rows, dtype=np.int64).reshape(seq_len, c.head_dim)
    return ReadTrace(slot, layer, q_head, kv_head, seq_len, num_blocks,
                     np.array(table_index, dtype=np.int64), np.array(physical, dtype=np.int64),
                     np.array(tib, dtype=np.int64), np.array(logical_of_token, dtype=np.int64),
                     np.array(token_of_token, dtype=np.int64), k_index,
                     k_index + c.V_OFFSET_ELEMS)


# --- caches that catch wrong reads -------------------------------------------------------------

class PoisonedCache(PagedKVCache):
    """A cache made by ``poisoned_copy``: ``trap_block`` is the all-poison physical block that
    every unlisted block-table entry points at."""

    trap_block: int = -1


def poisoned_copy(cache: PagedKVCache, keep_elements, keep_table_entries,
                  value: float = float("nan")) -> PoisonedCache:
    """A copy of ``cache`` in which every buffer element *not* in ``keep_elements`` holds
    ``value`` (NaN by default) and every block-table entry *not* in ``keep_table_entries``
    (flat indices) points at a physical block that holds no kept element (so it is all
    ``value``): a trap for any read the trace did not predict."""
    c = cache.config
    twin = PoisonedCache(c, cache.device)
    twin.buffer.copy_(cache.buffer)
    twin.free_blocks = list(cache.free_blocks)
    keep = torch.as_tensor(np.asarray(keep_elements, dtype=np.int64), device=twin.buffer.device)
    kept_values = twin.buffer[keep].clone()
    twin.buffer.fill_(value)
    twin.buffer[keep] = kept_values
    keep_entries = np.asarray(keep_table_entries, dtype=np.int64)
    kept_blocks = set((np.asarray(keep_elements, dtype=np.int64) // c.BLOCK_ELEMS).tolist())
    trap = next((b for b in range(c.NUM_BLOCKS) if b not in kept_blocks), None)
    if trap is None:
        raise ValueError("poisoned_copy: every physical block holds a kept element; no block "
                         "is left to serve as the trap (give the cache one more block)")
    flat = twin.block_table.reshape(-1)
    flat[:] = trap
    flat[keep_entries] = cache.block_table.reshape(-1)[keep_entries]
    twin.trap_block = trap
    twin.mark_table_changed()
    return twin


@contextlib.contextmanager
def quiet_nan_arithmetic():
    """The simulator computes with NumPy scalars, which warn when a kernel does arithmetic on
    NaN (e.g. a poisoned cache); the hardware does not.  Silence those RuntimeWarnings."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with np.errstate(all="ignore"):
            yield


# --- attention references ----------------------------------------------------------------------

def exact_attention(scores, values) -> np.ndarray:
    """Two-pass softmax-weighted average in float64: max, then exp and sum, then divide."""
    s = np.asarray(scores, dtype=np.float64)
    p = np.exp(s - s.max())
    return (p / p.sum()) @ np.asarray(values, dtype=np.float64)


def online_softmax_trace(scores, values=None) -> dict:
    """The decode kernel's online softmax (kernels.cu:509-519) replayed token by token in
    float32.  ``scores`` [n]; ``values`` [n, D] (optional).  Returns per-step arrays:
    score, max (after the step), correction, exp_score, d, and acc [n, D] / out [D] when
    values are given."""
    s = np.asarray(scores, dtype=np.float32)
    n = s.shape[0]
    vals = None if values is None else np.asarray(values, dtype=np.float32)
    current_max = np.float32(-np.inf)
    d = np.float32(0.0)
    acc = None if vals is None else np.zeros(vals.shape[1], dtype=np.float32)
    rec = {k: np.zeros(n, dtype=np.float32) for k in ("max", "correction", "exp_score", "d")}
    accs = [] if vals is not None else None
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(n):
            new_max = s[i] if s[i] > current_max else current_max
            correction = np.exp(np.float32(current_max - new_max))
            current_max = new_max
            exp_score = np.exp(np.float32(s[i] - current_max))
            d = np.float32(d * correction + exp_score)
            rec["max"][i], rec["correction"][i] = current_max, correction
            rec["exp_score"][i], rec["d"][i] = exp_score, d
            if vals is not None:
                acc = (acc * correction + exp_score * vals[i]).astype(np.float32)
                accs.append(acc.copy())
    out = {"score": s, **rec}
    if vals is not None:
        out["acc"] = np.array(accs)
        out["out"] = (acc / d).astype(np.float32)
    return out


def online_softmax_attention(q, k, v, scale) -> np.ndarray:
    """Single-head decode attention by the kernel's recurrence, in float32 (q [D], k/v [n, D])."""
    q32 = np.asarray(q, np.float32)
    scores = (np.asarray(k, np.float32) @ q32).astype(np.float32) * np.float32(scale)
    return online_softmax_trace(scores, v)["out"]


def oracle_decode(q, k, v, scale: float, dtype=torch.float32) -> np.ndarray:
    """The torch oracle's decode attention for one query head over n tokens (q [D], k/v [n, D]),
    through the package's public path: a one-slot paged cache in ``dtype``, ``write_kv`` and
    ``TorchBackend.decode_attention`` (two-pass softmax in float32; with bf16 it rounds scores
    and probabilities to bf16, as HF does).  Returns float64 [D]."""
    from paged_tutorial.backends.torch_ref import TorchBackend
    from paged_tutorial.config import CacheConfig

    k = torch.as_tensor(np.asarray(k, np.float32))
    n, head_dim = k.shape
    name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    probe = CacheConfig(num_layers=1, num_kv_heads=1, head_dim=head_dim, dtype=name,
                        max_slots=1, max_seq_len=max(n, 1))
    cache = PagedKVCache(CacheConfig(num_layers=1, num_kv_heads=1, head_dim=head_dim, dtype=name,
                                     max_slots=1, max_seq_len=max(n, 1),
                                     kv_cache_bytes=probe.blocks_for_tokens(n) * probe.BLOCK_BYTES))
    cache.ensure_capacity(0, n)
    ref = TorchBackend("cpu")
    table = cache.device_block_table()
    v = torch.as_tensor(np.asarray(v, np.float32))
    ref.write_kv(cache, k.to(dtype)[:, None], v.to(dtype)[:, None], table, 0,
                 torch.zeros(n, dtype=torch.int32), torch.arange(n, dtype=torch.int32))
    qt = torch.as_tensor(np.asarray(q, np.float32)).to(dtype).reshape(1, 1, head_dim).clone()
    ref.decode_attention(qt, cache, table, 0, torch.tensor([n]), torch.tensor([0]), scale)
    return qt[0, 0].double().numpy()
