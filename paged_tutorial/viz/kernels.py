"""Helpers and figures for notebooks 03-05: the decode kernel's addresses, its warp-shuffle
reduction and its online softmax -- each drawn from what the package's kernels actually do.

Nothing here is run by the engine.  What lives here:

- **Running the article's kernel**: ``article_decode`` launches the package's
  ``paged_attention_kernel`` (``attention.make_paged_attention_kernel``) exactly as
  ``NumbaBackend.decode_attention`` does, so the notebooks stay on the article's kernel even
  where the backend picks an optimised one; ``record_decode_calls`` keeps the arguments of an
  engine's attention calls so a notebook can replay one.
- **NumPy traces** of the kernel's arithmetic: ``kernel_read_trace`` (every block-table entry
  and cache element one (batch row, q head) thread block reads, in loop order) and
  ``online_softmax_trace`` (running max / correction / denominator / accumulator per token).
  Notebooks check them against the kernel's output; ``exact_attention``,
  ``online_softmax_attention`` and ``oracle_decode`` (the torch oracle) are the references.
- **Instruments**: ``poisoned_copy`` (a cache in which every element a trace does not list is
  NaN), ``log_kernel_accesses`` (simulator only: records every read and write a kernel makes
  to chosen tensors by handing it a recording stand-in over the same memory) and
  ``shared_memory_races`` (an epoch analysis of the score reduction's shared memory).
- **Demo kernels** for chapter 04, *not* engine kernels: ``shuffle_chain`` (the decode
  kernel's five ``shfl_down_sync`` steps, recording each lane after each step),
  ``package_warp_sum`` (the package's ``reduce.warp_sum``) and ``article_two_warp_dot`` (the
  article's fixed two-warp score reduction, kept to show why it needs head_dim 64).

matplotlib is imported inside the plotting functions only.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import dataclass

import numpy as np
import torch

# Importing the backend first decides simulator vs GPU before numba.cuda is imported.
from ..backends import numba_cuda as _numba_backend
from ..backends.numba_cuda import attention, launch, reduce
from ..backends.numba_cuda.sim_shim import SIMULATING
from ..kv_cache import PagedKVCache

# A module global named ``cuda``: the simulator swaps it while a kernel of this module runs.
from numba import cuda, float32  # noqa: E402

__all__ = [
    "ReadTrace", "kernel_read_trace", "article_decode", "quiet_nan_arithmetic", "clone_cache",
    "poisoned_copy", "kernel_device", "AccessLog", "log_kernel_accesses", "DecodeCall",
    "record_decode_calls", "shuffle_chain", "shfl_down_model", "package_warp_sum",
    "article_two_warp_dot", "OFFSETS", "online_softmax_trace", "exact_attention",
    "online_softmax_attention", "oracle_decode", "shared_memory_races", "plot_buffer_reads",
    "plot_address_by_token", "plot_lane_diagram", "plot_online_softmax_trace",
    "plot_softmax_error",
]

WARP_SIZE = attention.WARP_SIZE
#: the decode kernel's shuffle offsets (kernels.cu:489-493)
OFFSETS = (16, 8, 4, 2, 1)
FIG_DPI = 80


def kernel_device() -> torch.device:
    """Where kernel arguments must live in this process: the CPU when simulating, else CUDA."""
    return torch.device("cpu") if SIMULATING else torch.device("cuda", torch.cuda.current_device())


# =========================================================================================
# 03: the addresses the decode kernel reads
# =========================================================================================

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


def kernel_read_trace(cache: PagedKVCache, layer: int, slot: int, seq_len: int, q_head: int,
                      q_per_kv: int, block_table=None) -> ReadTrace:
    """Replay, in NumPy, the address arithmetic of the decode kernel (``attention.py``, the
    article's ``kernels.cu:470-485``) for one (slot, q head): which block-table entries and
    which cache elements it reads.  ``block_table`` defaults to ``cache.block_table``."""
    c = cache.config
    table = np.asarray(cache.block_table if block_table is None else
                       (block_table.cpu().numpy() if torch.is_tensor(block_table)
                        else block_table))
    flat_table = table.reshape(-1)
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
                     np.array(table_index), np.array(physical), np.array(tib),
                     np.array(logical_of_token), np.array(token_of_token),
                     k_index, k_index + c.V_OFFSET_ELEMS)


def article_decode(q: torch.Tensor, cache: PagedKVCache, block_table: torch.Tensor, layer: int,
                   seq_lens, active_slots, scale: float) -> torch.Tensor:
    """Run the article's decode kernel -- the package's ``paged_attention_kernel``, built by
    ``attention.make_paged_attention_kernel`` from the cache's constants -- on q [B, nH, D]
    and return q, which now holds the output (in place).  The launch is the one
    ``NumbaBackend.decode_attention`` makes: grid (B, nH), ``block_threads(head_dim)`` threads.
    Calling the factory directly keeps these notebooks on the article's kernel even where the
    backend picks an optimised one.  Tensors must be on ``kernel_device()``."""
    from ..backends.numba_cuda.dtypes import ops_for

    c = cache.config
    dtype = ops_for(q.dtype).name
    if q.dtype != cache.buffer.dtype:
        raise TypeError(f"article_decode: q is {q.dtype}, the cache holds {cache.buffer.dtype}")
    n_seqs, n_q_heads, head_dim = q.shape
    if head_dim != c.head_dim or n_q_heads % c.num_kv_heads:
        raise ValueError("article_decode: q must be [B, n_q_heads, head_dim] with n_q_heads a "
                         "multiple of the cache's kv heads")
    kernel = attention.make_paged_attention_kernel(
        dtype, c.head_dim, c.BLOCK_SIZE, c.num_layers, c.MAX_BLOCKS_PER_SEQ, c.KV_DIM,
        c.BLOCK_ELEMS, c.V_OFFSET_ELEMS)
    dev = q.device
    lens = torch.as_tensor(seq_lens).to(device=dev, dtype=torch.int32).contiguous()
    slots = torch.as_tensor(active_slots).to(device=dev, dtype=torch.int32).contiguous()
    table = block_table.to(device=dev, dtype=torch.int32).contiguous()
    qa, q_rs = launch.rows(q, "q")
    launch.launch(kernel, (n_seqs, n_q_heads), attention.block_threads(c.head_dim),
                  int(layer), qa, q_rs, launch.flat(cache.buffer, "cache.buffer"),
                  launch.flat(table), launch.flat(lens), launch.flat(slots),
                  n_q_heads // c.num_kv_heads, float(scale))
    if not SIMULATING:
        torch.cuda.synchronize()
    return q


@contextlib.contextmanager
def quiet_nan_arithmetic():
    """The simulator computes with NumPy scalars, which warn when a kernel does arithmetic on
    NaN (e.g. a poisoned cache); the hardware does not.  Silence those RuntimeWarnings."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def clone_cache(cache: PagedKVCache, device=None) -> PagedKVCache:
    """An independent copy of a cache (config, buffer, block table, free list)."""
    twin = PagedKVCache(cache.config, cache.device if device is None else device)
    twin.buffer.copy_(cache.buffer)
    twin.block_table[...] = cache.block_table
    twin.free_blocks = list(cache.free_blocks)
    twin._dirty = set(range(twin.block_table.size))     # send the whole table once
    return twin


def poisoned_copy(cache: PagedKVCache, keep_elements, keep_table_entries,
                  value: float = float("nan")) -> PagedKVCache:
    """A copy of ``cache`` in which every buffer element *not* in ``keep_elements`` holds
    ``value`` (NaN by default) and every block-table entry *not* in ``keep_table_entries``
    (flat indices) points at a physical block that holds no kept element (so it is all
    ``value``) -- a trap for any read the trace did not predict."""
    c = cache.config
    twin = clone_cache(cache)
    keep = torch.as_tensor(np.asarray(keep_elements, dtype=np.int64), device=twin.buffer.device)
    kept_values = twin.buffer[keep].clone()
    twin.buffer.fill_(value)
    twin.buffer[keep] = kept_values
    keep_entries = np.asarray(keep_table_entries, dtype=np.int64)
    kept_blocks = set((np.asarray(keep_elements) // c.BLOCK_ELEMS).tolist())
    trap = next((b for b in range(c.NUM_BLOCKS) if b not in kept_blocks), None)
    if trap is None:
        raise ValueError("poisoned_copy: every physical block holds a kept element; no block "
                         "is left to serve as the NaN trap")
    flat = twin.block_table.reshape(-1)
    entries = flat[keep_entries].copy()
    flat[:] = trap
    flat[keep_entries] = entries
    twin.trap_block = trap
    return twin


@dataclass
class DecodeCall:
    """One ``decode_attention`` call as the engine made it (inputs copied before the call)."""

    layer: int
    q_in: torch.Tensor            # q before the call (the kernel overwrites q)
    out: torch.Tensor             # q after the call: the attention output
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    active_slots: torch.Tensor
    scale: float


@contextlib.contextmanager
def record_decode_calls(engine):
    """While active, every ``decode_attention`` call of ``engine``'s backend is recorded (one
    ``DecodeCall`` per layer of each decode step) and then carried out unchanged.  A decode
    step replayed from a CUDA graph (the numba GPU backend's default) makes no Python call:
    record with an engine built with ``backend="torch"`` (or without CUDA graphs)."""
    backend = engine.backend
    real = backend.decode_attention
    calls: list[DecodeCall] = []

    def recording(q, cache, block_table, layer, seq_lens, active_slots, scale):
        q_in = q.detach().clone()
        out = real(q, cache, block_table, layer, seq_lens, active_slots, scale)
        calls.append(DecodeCall(int(layer), q_in, out.detach().clone(),
                                block_table.detach().clone(), seq_lens.detach().clone(),
                                active_slots.detach().clone(), float(scale)))
        return out

    backend.decode_attention = recording
    try:
        yield calls
    finally:
        del backend.decode_attention


# --- recording what a simulated kernel touches ---------------------------------------------

class AccessLog:
    """Stands in for one kernel array argument in Numba's CUDA simulator and records every
    element access: ``records`` is a list of (seq, op 'R'/'W', index, block (x, y), thread).
    ``seq`` is a global order over all logged arrays of one launch."""

    _counter = itertools.count()

    def __init__(self, array: np.ndarray, name: str):
        self.array = array
        self.name = name
        self.records: list[tuple] = []
        self.shape = array.shape
        self.dtype = array.dtype

    def _note(self, op, index):
        t = threading.current_thread()
        block = (t.blockIdx.x, t.blockIdx.y) if hasattr(t, "blockIdx") else (-1, -1)
        thread = t.threadIdx.x if hasattr(t, "threadIdx") else -1
        self.records.append((next(AccessLog._counter), op, int(index), block, thread))

    def __getitem__(self, index):
        self._note("R", index)
        return self.array[index]

    def __setitem__(self, index, value):
        self._note("W", index)
        self.array[index] = value

    def __len__(self):
        return len(self.array)

    # summaries -----------------------------------------------------------------------
    def reads(self) -> np.ndarray:
        return np.array([r[2] for r in self.records if r[1] == "R"], dtype=np.int64)

    def writes(self) -> np.ndarray:
        return np.array([r[2] for r in self.records if r[1] == "W"], dtype=np.int64)

    def by_block(self, op: str | None = None) -> dict:
        """{(block x, block y): sorted unique indices} for reads ('R'), writes ('W') or both."""
        out: dict = {}
        for _, o, index, block, _ in self.records:
            if op is None or o == op:
                out.setdefault(block, set()).add(index)
        return {b: np.array(sorted(s)) for b, s in sorted(out.items())}


@contextlib.contextmanager
def log_kernel_accesses(optional: bool = False, **tensors):
    """Simulator only.  While active, any of the given torch tensors handed to a kernel by the
    Numba backend (through ``launch.as_kernel_array``, which ``flat`` and ``rows`` use) is
    replaced by an ``AccessLog`` over the same memory, so the kernel runs unchanged and its
    reads and writes land in the tensor *and* in the log.  Yields {name: AccessLog}; a log is
    created when its tensor is first passed.

        with vk.log_kernel_accesses(q=q, block_table=bt) as logs:
            backend.decode_attention(q, cache, bt, ...)
        logs["q"].records

    With ``optional=True`` on a GPU it logs nothing and yields an empty dict (instead of
    raising), so one notebook cell serves both.
    """
    if not SIMULATING:
        if optional:
            yield {}
            return
        raise RuntimeError("log_kernel_accesses needs Numba's CUDA simulator (a GPU kernel's "
                           "memory accesses cannot be intercepted from Python)")
    wanted = {name: t for name, t in tensors.items()}
    logs: dict[str, AccessLog] = {}
    real = launch.as_kernel_array

    def wrapping(t):
        arr = real(t)
        for name, target in wanted.items():
            if (t.data_ptr() == target.data_ptr() and t.numel() == target.numel()):
                host = arr._ary if hasattr(arr, "_ary") else np.asarray(arr)
                log = logs.get(name)
                if log is None or log.array is not host:
                    log = logs.setdefault(name, AccessLog(host, name))
                    log.array = host
                return log
        return arr

    launch.as_kernel_array = wrapping
    had_pkg = hasattr(_numba_backend, "as_kernel_array")
    if had_pkg:
        _numba_backend.as_kernel_array = wrapping
    try:
        yield logs
    finally:
        launch.as_kernel_array = real
        if had_pkg:
            _numba_backend.as_kernel_array = real


# =========================================================================================
# 04: warp shuffles
# =========================================================================================

@cuda.jit
def _shuffle_chain_kernel(values, offsets, accumulate, steps):
    """Each thread loads one value, then for each offset does v = shfl_down(v, offset)
    (or v += ... with ``accumulate``), recording v after every step in ``steps``
    ([len(offsets) + 1, n] flattened).  The decode kernel's reduction is offsets
    16, 8, 4, 2, 1 with accumulate."""
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    v = values[tid]
    steps[tid] = v
    for s in range(offsets.shape[0]):
        got = cuda.shfl_down_sync(attention.WARP_FULL_MASK, v, offsets[s])
        if accumulate:
            v = v + got
        else:
            v = got
        steps[(s + 1) * n + tid] = v


@cuda.jit
def _warp_sum_kernel(values, out):
    tid = cuda.threadIdx.x
    out[tid] = reduce.warp_sum(values[tid])


@cuda.jit
def _article_two_warp_dot_kernel(q, k, out):
    """The article's score reduction (kernels.cu:486-505) with its fixed layout: warp sums by
    shfl_down, then *threads 0 and 32* publish into two shared floats and thread 0 adds those
    two.  Launched with head_dim threads, as the article launches HEAD_DIM threads.  Writes
    out[0] = the sum thread 0 forms (unscaled), out[1], out[2] = the two shared floats."""
    dot_products = cuda.shared.array(2, float32)
    tid = cuda.threadIdx.x
    if tid < 2:
        dot_products[tid] = float32(0.0)      # (the article leaves them uninitialised)
    cuda.syncthreads()
    qk = float32(q[tid]) * float32(k[tid])
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 16)
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 8)
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 4)
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 2)
    qk += cuda.shfl_down_sync(attention.WARP_FULL_MASK, qk, 1)
    if tid == 0:
        dot_products[0] = qk
    if tid == 32:
        dot_products[1] = qk
    cuda.syncthreads()
    if tid == 0:
        out[0] = dot_products[0] + dot_products[1]
        out[1] = dot_products[0]
        out[2] = dot_products[1]


def _run(kernel, threads: int, *tensors_and_scalars):
    args = [launch.as_kernel_array(a) if torch.is_tensor(a) else a for a in tensors_and_scalars]
    launch.launch(kernel, 1, threads, *args)
    if not SIMULATING:
        torch.cuda.synchronize()


def shuffle_chain(values, offsets=OFFSETS, accumulate: bool = True) -> np.ndarray:
    """Run the shuffle demo kernel on ``values`` (one per thread, a single block) and return
    every lane's value before and after each step: float32 [len(offsets) + 1, n]."""
    dev = kernel_device()
    v = torch.as_tensor(np.asarray(values, dtype=np.float32)).to(dev)
    n = v.numel()
    offs = torch.tensor(list(offsets), dtype=torch.int32, device=dev)
    steps = torch.full(((len(offsets) + 1) * n,), float("nan"), dtype=torch.float32, device=dev)
    _run(_shuffle_chain_kernel, n, v, offs, bool(accumulate), steps)
    return steps.cpu().numpy().reshape(len(offsets) + 1, n)


def shfl_down_model(values, offset: int) -> np.ndarray:
    """NumPy model of one ``shfl_down_sync`` (width 32): lane i receives lane i + offset of its
    own warp, or keeps its own value when i + offset >= 32.  When the source lane lies past the
    end of a *partial* last warp (a block that is not a multiple of 32 threads) the hardware
    result is undefined (an H200 returned 0); this model, like the simulator shim, keeps the
    reader's value.  The package's decode kernel always launches whole warps."""
    values = np.asarray(values)
    n = len(values)
    out = values.copy()
    for tid in range(n):
        lane = tid % WARP_SIZE
        src = tid + offset
        if lane + offset < WARP_SIZE and src < n:
            out[tid] = values[src]
    return out


def package_warp_sum(values) -> np.ndarray:
    """Every lane's result of the package's ``reduce.warp_sum`` (butterfly ``shfl_xor``)."""
    dev = kernel_device()
    v = torch.as_tensor(np.asarray(values, dtype=np.float32)).to(dev)
    out = torch.full_like(v, float("nan"))
    _run(_warp_sum_kernel, v.numel(), v, out)
    return out.cpu().numpy()


def article_two_warp_dot(q, k) -> dict:
    """Run the article's fixed two-warp score reduction with len(q) threads (its HEAD_DIM).
    Returns {'score': what thread 0 computes (before the 1/sqrt(d) scale), 'dot_products':
    the two shared floats, 'exact': the full float64 dot product}."""
    dev = kernel_device()
    qa = torch.as_tensor(np.asarray(q, dtype=np.float32)).to(dev)
    ka = torch.as_tensor(np.asarray(k, dtype=np.float32)).to(dev)
    if qa.numel() != ka.numel() or not 33 <= qa.numel() <= 1024:
        raise ValueError("article_two_warp_dot: q and k need the same length, 33..1024 (the "
                         "layout needs a thread 32)")
    out = torch.full((3,), float("nan"), dtype=torch.float32, device=dev)
    _run(_article_two_warp_dot_kernel, qa.numel(), qa, ka, out)
    o = out.cpu().numpy()
    return {"score": float(o[0]), "dot_products": (float(o[1]), float(o[2])),
            "exact": float(np.dot(np.asarray(q, np.float64), np.asarray(k, np.float64)))}


# =========================================================================================
# 05: online softmax
# =========================================================================================

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


def exact_attention(scores, values) -> np.ndarray:
    """Two-pass softmax-weighted average in float64: max, then exp and sum, then divide."""
    s = np.asarray(scores, dtype=np.float64)
    p = np.exp(s - s.max())
    return (p / p.sum()) @ np.asarray(values, dtype=np.float64)


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
    from ..backends.torch_ref import TorchBackend
    from ..config import CacheConfig

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


def shared_memory_races(variant: str, num_warps: int = 2, num_tokens: int = 2) -> list[dict]:
    """Find unordered conflicting accesses to the decode kernel's shared memory.

    Every shared access of ``num_tokens`` token iterations is listed per thread with its
    *epoch* (barriers the thread has passed) and, within the epoch, its *warp step* (warp-wide
    shuffles it has passed: a ``*_sync`` shuffle makes all 32 lanes of a warp meet).  Two
    accesses by different threads to the same cell, at least one a write, race when they fall
    in the same epoch and nothing orders them: they are in different warps, or in one warp at
    the same warp step.

    ``variant``: ``"article"`` (the summed score is stored back into ``dot_products[0]``,
    kernels.cu:502-507) or ``"package"`` (the score has its own cell, attention.py)."""
    if variant not in ("article", "package"):
        raise ValueError("variant is 'article' or 'package'")
    threads = num_warps * WARP_SIZE
    score_cell = "dot_products[0]" if variant == "article" else "score[0]"
    events = []   # (thread, epoch, warp_step, op, cell, token, what)
    for t in range(num_tokens):
        e = 2 * t                                       # barriers passed before token t
        for tid in range(threads):
            # 5 shuffles (warp step += 5), then the leaders publish their warp's sum
            if tid % WARP_SIZE == 0:
                events.append((tid, e, 5 * (t + 1), "W", f"dot_products[{tid // WARP_SIZE}]",
                               t, "publishes its warp's partial sum"))
        # barrier 1 -> epoch e + 1: thread 0 combines the partials and writes the score
        for w in range(num_warps):
            events.append((0, e + 1, 5 * (t + 1), "R", f"dot_products[{w}]", t,
                           "reads a warp partial"))
        events.append((0, e + 1, 5 * (t + 1), "W", score_cell, t, "writes the scaled score"))
        # barrier 2 -> epoch e + 2: everyone reads the score (before token t + 1's shuffles)
        for tid in range(threads):
            events.append((tid, e + 2, 5 * (t + 1), "R", score_cell, t, "reads the score"))
    races = []
    for a, b in itertools.combinations(events, 2):
        ta, ea, sa, oa, ca, *_ = a
        tb, eb, sb, ob, cb, *_ = b
        if ta == tb or ca != cb or ea != eb or "W" not in (oa, ob):
            continue
        same_warp = ta // WARP_SIZE == tb // WARP_SIZE
        if same_warp and sa != sb:
            continue                                    # ordered by the warp's shuffles
        races.append({"cell": ca, "epoch": ea, "thread_a": ta, "op_a": oa, "token_a": a[5],
                      "what_a": a[6], "thread_b": tb, "op_b": ob, "token_b": b[5],
                      "what_b": b[6]})
    return races


# =========================================================================================
# figures
# =========================================================================================

def _plt():
    import matplotlib.pyplot as plt
    return plt


def plot_buffer_reads(cache: PagedKVCache, traces, labels=None, ncols: int = 4,
                      title: str | None = None):
    """The flat cache buffer, one tile per physical block (K rows on top, V rows below, one
    column per element of KV_DIM).  Elements each trace reads are coloured by the token's
    position in its sequence; blocks owned by someone else are grey; free blocks white.
    Each tile is labelled with its owner (slot, layer, logical block) from the block table."""
    plt = _plt()

    c = cache.config
    traces = list(traces) if isinstance(traces, (list, tuple)) else [traces]
    labels = labels or [f"slot {t.slot} q head {t.q_head}" for t in traces]
    cmaps = ["viridis", "plasma", "cividis", "magma"]
    nb = c.NUM_BLOCKS
    rows_per_block = 2 * c.BLOCK_SIZE
    owners = cache.owner_map()
    per_slot = c.num_layers * c.MAX_BLOCKS_PER_SEQ
    img = np.ones((nb, rows_per_block, c.KV_DIM, 4))
    for b in range(nb):
        if owners[b] >= 0:
            img[b, :, :, :3] = 0.82
    for trace, cmap_name in zip(traces, cmaps):
        cmap = plt.get_cmap(cmap_name)
        for which, index in (("K", trace.k_index), ("V", trace.v_index)):
            for t in range(trace.seq_len):
                rel = index[t] - (index[t] // c.BLOCK_ELEMS) * c.BLOCK_ELEMS
                blk = index[t] // c.BLOCK_ELEMS
                row = rel // c.KV_DIM
                col = rel % c.KV_DIM
                color = cmap(0.15 + 0.75 * t / max(trace.seq_len - 1, 1))
                img[blk, row, col] = color
    nrows = -(-nb // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.3 * ncols, 1.25 * nrows + 0.6),
                             dpi=FIG_DPI, squeeze=False)
    for b in range(nrows * ncols):
        ax = axes[b // ncols][b % ncols]
        ax.set_xticks([])
        ax.set_yticks([])
        if b >= nb:
            ax.axis("off")
            continue
        ax.imshow(img[b], aspect="auto", interpolation="nearest")
        ax.axhline(c.BLOCK_SIZE - 0.5, color="black", lw=0.8)
        if b % ncols == 0:
            ax.set_yticks([c.BLOCK_SIZE / 2 - 0.5, 1.5 * c.BLOCK_SIZE - 0.5])
            ax.set_yticklabels(["K", "V"], fontsize=7)
        for h in range(1, c.num_kv_heads):
            ax.axvline(h * c.head_dim - 0.5, color="white", lw=0.6, ls=":")
        if owners[b] >= 0:
            o = int(owners[b])
            s, rem = divmod(o, per_slot)
            layer, lb = divmod(rem, c.MAX_BLOCKS_PER_SEQ)
            ax.set_title(f"phys {b}: s{s} L{layer} lb{lb}", fontsize=7)
        else:
            ax.set_title(f"phys {b}: free", fontsize=7, color="0.5")
    handles = [plt.Line2D([], [], marker="s", ls="", color=plt.get_cmap(m)(0.6), label=lab)
               for lab, m in zip(labels, cmaps)]
    handles.append(plt.Line2D([], [], marker="s", ls="", color="0.82", label="owned, not read"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7,
               frameon=False)
    fig.suptitle(title or "cache buffer: K rows (top) / V rows (bottom) of each physical block; "
                 "columns = KV_DIM", fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return fig


def plot_address_by_token(cache: PagedKVCache, trace: ReadTrace):
    """Element index of K[token, dim 0] and V[token, dim 0] against the token's position:
    contiguous runs inside a block (stride KV_DIM), jumps between physical blocks."""
    plt = _plt()
    c = cache.config
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=FIG_DPI)
    pos = np.arange(trace.seq_len)
    ax.plot(pos, trace.k_index[:, 0], "o-", ms=3, lw=0.8, label="K, dim 0")
    ax.plot(pos, trace.v_index[:, 0], "s-", ms=3, lw=0.8, label="V, dim 0 (K + V_OFFSET)")
    for lb in range(trace.num_blocks):
        x0 = lb * c.BLOCK_SIZE
        ax.axvline(x0 - 0.5, color="0.7", lw=0.6, ls="--")
        ax.text(x0 + 0.2, trace.k_index[x0, 0],
                f" lb {lb} -> phys {trace.physical_block[lb]}", fontsize=7, va="bottom")
    ax.set_xlabel("token position in the sequence")
    ax.set_ylabel("element index in cache.buffer")
    ax.set_title(f"slot {trace.slot}, layer {trace.layer}, q head {trace.q_head} "
                 f"(kv head {trace.kv_head}): where each token's K and V live", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def plot_lane_diagram(steps: np.ndarray, offsets=OFFSETS, lanes: int = WARP_SIZE,
                      warp: int = 0):
    """A lanes x steps picture of the shfl_down reduction of one warp, from the values the
    demo kernel recorded (``shuffle_chain``).  Cell colour: how many of the warp's inputs the
    lane's value sums (from the coefficient model, checked against the recorded values);
    hatched: values that count some input twice (lanes whose source was past lane 31 added
    their own value).  Arrows: the additions that reach lane 0.  Lane 0's value is printed."""
    plt = _plt()
    base = warp * WARP_SIZE
    vals = steps[:, base:base + lanes]
    n_steps = len(offsets) + 1
    # coefficient model: coef[s][lane] = multiplicity of each input in the lane's value
    coef = [np.eye(lanes)]
    for off in offsets:
        prev = coef[-1]
        got = np.array([prev[i + off] if i + off < WARP_SIZE and i + off < lanes else prev[i]
                        for i in range(lanes)])
        coef.append(prev + got)
    coef = np.array(coef)                               # [steps, lanes, inputs]
    model = coef @ vals[0].astype(np.float64)
    if not np.allclose(model, vals, rtol=1e-5, atol=1e-5):
        raise AssertionError("recorded lane values do not follow the shfl_down model")
    n_terms = (coef > 0).sum(-1)
    doubled = (coef > 1).any(-1)
    fig, ax = plt.subplots(figsize=(7.5, 6.2), dpi=FIG_DPI)
    im = ax.imshow(n_terms.T, aspect="auto", cmap="Blues", vmin=0, vmax=lanes,
                   origin="upper", extent=(-0.5, n_steps - 0.5, lanes - 0.5, -0.5))
    for s in range(n_steps):
        for lane in range(lanes):
            if doubled[s, lane]:
                ax.add_patch(plt.Rectangle((s - 0.5, lane - 0.5), 1, 1, fill=False,
                                           hatch="////", lw=0, color="0.55"))
    # arrows of the tree that ends in lane 0: at step s (offset off), lane i < off gets i+off
    for s, off in enumerate(offsets, start=1):
        for i in range(off):
            if i + off < lanes:
                ax.annotate("", xy=(s - 0.05, i), xytext=(s - 0.95, i + off),
                            arrowprops=dict(arrowstyle="->", lw=0.6, color="tab:red"))
    for s in range(n_steps):
        ax.text(s, 0, f"{vals[s, 0]:.3f}", ha="center", va="center", fontsize=7,
                color="black", bbox=dict(fc="white", ec="none", alpha=0.7, pad=0.5))
    ax.set_xticks(range(n_steps))
    ax.set_xticklabels(["load"] + [f"+shfl_down\n{o}" for o in offsets], fontsize=8)
    ax.set_yticks(range(0, lanes, 4))
    ax.set_ylabel(f"lane (warp {warp}: threads {base}..{base + lanes - 1})")
    cb = fig.colorbar(im, ax=ax, fraction=0.04)
    cb.set_label("inputs summed in the lane's value", fontsize=8)
    ax.set_title("warp shuffle reduction: red = additions that reach lane 0; "
                 "hatched = counts an input twice", fontsize=9)
    fig.tight_layout()
    return fig


def plot_online_softmax_trace(trace: dict, kernel_out=None, dims=(0, 1, 2),
                              block_size: int | None = None):
    """Three panels over the tokens: scores and the running max (with the correction factor
    where it is < 1), the denominator d, and acc/d for a few output dimensions converging to
    the kernel's final output (dashed)."""
    plt = _plt()
    n = len(trace["score"])
    pos = np.arange(n)
    fig, axes = plt.subplots(3, 1, figsize=(7.5, 6.6), dpi=FIG_DPI, sharex=True)
    ax = axes[0]
    ax.plot(pos, trace["score"], "o", ms=3, label="score q.k/sqrt(d)")
    ax.step(pos, trace["max"], where="post", color="tab:red", lw=1, label="running max")
    jumps = np.flatnonzero(trace["correction"][1:] < 1) + 1
    for j in jumps:
        ax.annotate(f"x{trace['correction'][j]:.2f}", (j, trace["max"][j]), fontsize=6,
                    textcoords="offset points", xytext=(2, 4), color="tab:red")
    ax.set_ylabel("score")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("online softmax, token by token (red labels: correction exp(old max - new max))",
                 fontsize=9)
    ax = axes[1]
    ax.plot(pos, trace["d"], "-o", ms=2, color="tab:purple")
    ax.set_ylabel("denominator d")
    ax = axes[2]
    for i, dim in enumerate(dims):
        line, = ax.plot(pos, trace["acc"][:, dim] / trace["d"], lw=1, label=f"acc/d, dim {dim}")
        if kernel_out is not None:
            ax.axhline(float(kernel_out[dim]), color=line.get_color(), ls="--", lw=0.8)
    ax.set_ylabel("acc / d")
    ax.set_xlabel("token position (kernel loop order)")
    ax.legend(fontsize=7, loc="best")
    if block_size:
        for a in axes:
            for x in range(block_size, n, block_size):
                a.axvline(x - 0.5, color="0.75", lw=0.7, ls="--")
    fig.tight_layout()
    return fig


def plot_softmax_error(lengths, curves: dict, markers: dict | None = None):
    """Relative error against float64 two-pass attention, per sequence length (log-log), with
    the float32 and bfloat16 rounding levels for scale."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.2, 3.6), dpi=FIG_DPI)
    styles = ["-o", "--s", "-^", "--v", "-d", "--x"]
    for (name, errs), st in zip(curves.items(), styles):
        ax.plot(lengths, errs, st, ms=4, lw=1, label=name)
    for name, (ls, es) in (markers or {}).items():
        ax.plot(ls, es, "*", ms=12, label=name)
    for level, text in ((2.0 ** -24, "float32: half an ulp at 1 (2^-24)"),
                        (2.0 ** -8, "bfloat16: half an ulp at 1 (2^-8)")):
        ax.axhline(level, color="0.6", lw=0.7, ls=":")
        ax.text(lengths[-1], level * 1.25, text, fontsize=7, color="0.35", ha="right")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens read by the decode step)")
    ax.set_ylabel("max |error| / max |output|")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("online softmax vs two-pass softmax, against float64", fontsize=9)
    fig.tight_layout()
    return fig
