"""The small ops of a CPU decode step, compiled: the norms, RoPE with the cache write, and the
paged attention, each one call instead of a chain of torch ops.

A decode step of the embedded SmolLM2 on one CPU core takes about 30 ms, of which the
weights' products (``cpu_quantized.py``) are under half; the rest was the ops between them,
each a handful of torch calls on vectors of a few hundred values: an RMSNorm was five torch
ops (about 40 us), the decode attention of a short context a gather, two matmuls, two masks
and a softmax (about 200 us per layer).  At that size each torch op costs its dispatch, not its
arithmetic.  Here each is one Numba loop over the rows, reading the cache through the block
table as the kernels do (on a 2-core AMD EPYC the step went from 30 to 18 ms: the attention
from 6.0 to 1.7 ms a step, the norms from 4.8 to 1.0):

- ``rms_norm`` / ``add_rms_norm``: HF's RMSNorm (``weight * (x * rsqrt(mean(x^2) + eps))``),
  the residual added first in place;
- ``rope_write_kv``: RoPE (HF's rotate-half pairing) on q and k in place in the QKV projection's
  rows, then k and v written into their blocks: the same elementwise arithmetic as the torch
  ops, so the same bits;
- ``decode_attention``: each query row against its sequence's keys, gathered block by block
  through the block table; softmax in float32 like HF's.  The sums run in another order than
  the BLAS's, so the output agrees with the torch ops' to rounding.

Every table entry a loop would follow is checked first, inside the loop (a wild entry would
read or write outside the cache: Numba does not check indices).  When one is not valid the
loop does nothing and says so, and the torch backend runs its torch ops instead, whose checks
name the entry (``cache/block_table.py``'s ``check_block_entries``).

The torch backend takes these for float32 CPU steps of at most ``cpu_matvec.MAX_ROWS`` rows
with a float32 cache (``torch_ref.py``); other steps, and prompts, keep the torch ops.
"""

from __future__ import annotations

import numpy as np
import torch

from paged_tutorial.backends import cpu_matvec
from paged_tutorial.backends.paged_reads import cache_view

_compiled = None         # the module of compiled loops, imported on first use


def _loops():
    """The compiled loops (``cpu_decode_loops.py``): imported, and so compiled or read from
    Numba's disk cache, on first use."""
    global _compiled
    if _compiled is None:
        from paged_tutorial.backends import cpu_decode_loops

        _compiled = cpu_decode_loops
    return _compiled


def takes(*tensors: torch.Tensor) -> bool:
    """Whether these loops serve an op on ``tensors`` (its activation rows first): all float32
    on the CPU, at most ``cpu_matvec.MAX_ROWS`` rows (a decode step's, as for the products),
    none recording gradients."""
    return tensors[0].shape[0] <= cpu_matvec.MAX_ROWS and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and not t.requires_grad
        for t in tensors)


def takes_cache(cache, *tensors: torch.Tensor) -> bool:
    """Whether the loops read this cache and these index tensors: a float32 cache on the CPU,
    the tensors (table, positions, slots, lengths) on the CPU too."""
    return cache.buffer.device.type == "cpu" and cache.buffer.dtype == torch.float32 and \
        all(t.device.type == "cpu" for t in tensors)


def _host_ints(t: torch.Tensor) -> np.ndarray:
    """An int32 CPU tensor's numpy view (the engine's are; others are converted)."""
    return np.ascontiguousarray(t.numpy(), dtype=np.int32)


def rms_norm(x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor,
             eps: float) -> torch.Tensor:
    """``rms_norm(residual)`` (x None) or ``add_rms_norm(x, residual)``: a new [B, H] tensor,
    residual changed in place by the add.  Rows of [B, H] float32 CPU tensors."""
    out = torch.empty(residual.shape, dtype=torch.float32)
    rows = x.numpy() if x is not None else np.empty((0, 0), np.float32)
    _loops().rms_norm_rows(rows, residual.numpy(), weight.numpy(), float(eps), out.numpy())
    return out


def rope_write_kv(qkv: torch.Tensor, n_q_heads: int, head_dim: int, positions, cos, sin,
                  cache, block_table, layer: int, slots) -> bool:
    """RoPE on q and k inside ``qkv`` [T, (nH + 2 nKV) * D] and k, v into the cache; False,
    with nothing changed, when the table holds an entry that is not a block of the cache."""
    view = cache_view(cache).numpy()
    return _loops().rope_write_kv_rows(qkv.numpy(), n_q_heads, head_dim,
                                       _host_ints(positions), cos.numpy(), sin.numpy(), view,
                                       _host_ints(block_table), layer, _host_ints(slots))


def decode_attention(q: torch.Tensor, cache, block_table, layer: int, slots, seq_lens,
                     scale: float) -> bool:
    """q [B, nH, D] (float32, CPU) replaced by its attention over each sequence's cached K/V;
    False, with q unchanged, when the table holds an entry that is not a block of the cache."""
    view = cache_view(cache).numpy()
    table = _host_ints(block_table)
    scores = np.empty(table.shape[2] * cache.config.BLOCK_SIZE, np.float32)
    return _loops().decode_attention_rows(q.numpy(), view, table, layer, _host_ints(slots),
                                          _host_ints(seq_lens), float(scale), scores)


def compile_ops() -> None:
    """Compile the loops now (or read them from Numba's disk cache), so that no first decode
    step compiles, or imports, in the middle of a request."""
    _loops()


__all__ = ["compile_ops", "decode_attention", "rms_norm", "rope_write_kv",
           "takes", "takes_cache"]
