"""``NumbaBackend``: the engine's ops as Numba CUDA kernel launches (GEMMs stay on cuBLAS through
``torch.matmul``).  Importing it imports ``numba.cuda``; the package's ``__init__`` has decided
simulator or GPU by then."""

from __future__ import annotations

import warnings

import torch

import numpy as np

from paged_tutorial.cache.block_table import check_block_entries
from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.numba_cuda.kernels import attention, elementwise, kv_write, norms, prefill, sampling
from paged_tutorial.backends.numba_cuda.runtime import launch  # noqa: F401
from paged_tutorial.backends.numba_cuda.device import sim_shim  # noqa: F401  (installs the simulator's shuffles)
from paged_tutorial.backends.numba_cuda.kernels import rope as rope_kernels
from paged_tutorial.backends.numba_cuda.kernels import attention_fast, gemv, prefill_sdpa, rope_write_kv  # the optimised paths
from paged_tutorial.backends.numba_cuda.kernels import attention_tc  # tensor cores, large batches
from paged_tutorial.backends.numba_cuda.device import grid_dependency
from paged_tutorial.backends.numba_cuda.device.dtypes import DTYPE_OPS, ops_for
from paged_tutorial.backends.numba_cuda.runtime.launch import as_kernel_array, flat, rows, words
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING
from paged_tutorial.backends.numba_cuda.device.vector_io import CHUNK_BYTES, chunk_elems
from paged_tutorial.backends.numba_cuda.options import KernelOptions
#: most threads per block of the 16-byte row kernels (norms): one 16-byte chunk per thread up
#: to rows of 8 * this many elements
VEC_ROW_MAX_THREADS = 32 if SIMULATING else 512

def backend_name() -> str:
    """The name this process can offer: ``numba`` on a GPU, ``numba-sim`` when simulating."""
    return "numba-sim" if SIMULATING else "numba"


def _mode_error(requested: str) -> RuntimeError:
    if requested == "numba":
        return RuntimeError(
            "backend 'numba' needs an NVIDIA GPU, but this process already runs Numba's CUDA "
            "simulator (NUMBA_ENABLE_CUDASIM=1 was set, or no CUDA GPU was visible when "
            "numba.cuda was first imported).  Numba chooses once per process: start a new "
            "process with a visible GPU and NUMBA_ENABLE_CUDASIM unset (or 0), or use "
            "'numba-sim' here.")
    return RuntimeError(
        "backend 'numba-sim' needs Numba's CUDA simulator, but this process imported "
        "numba.cuda for the real GPU.  Numba chooses once per process: start a new process "
        "and set NUMBA_ENABLE_CUDASIM=1 before anything imports numba.cuda (e.g. "
        "`NUMBA_ENABLE_CUDASIM=1 python ...`, or os.environ at the very top of the script), "
        "or use 'numba' here.")


class NumbaBackend(Backend):
    """Numba CUDA kernels for every op of ``Backend``; ``linear`` stays torch (cuBLAS) except
    at decode's batch 1, where the Numba GEMV takes it.

    ``NumbaBackend()`` picks the mode of this process.  ``NumbaBackend("numba")`` or
    ``NumbaBackend("numba-sim")`` (equivalently ``simulate=False`` / ``True``) insists on one
    and raises a RuntimeError explaining how to get it when the process runs the other.
    ``check_inputs`` (default: on in the simulator, off on the GPU, where it would cost a
    device sync) validates token ids, positions and block-table entries on the host before
    the kernels use them.  ``options`` (``KernelOptions``) chooses the kernels and fusions.
    """

    graph_capturable = True
    simulated = SIMULATING
    compiles_kernels = not SIMULATING

    def __init__(self, name: str | None = None, device: str | torch.device | None = None,
                 check_inputs: bool | None = None, simulate: bool | None = None,
                 options: KernelOptions | None = None):
        if options is None:
            options = KernelOptions()
        if not isinstance(options, KernelOptions):
            raise TypeError(f"NumbaBackend: options must be a KernelOptions, got "
                            f"{type(options).__name__}")
        #: the kernels and fusions this backend uses (``options.py``)
        self.options = options
        #: prefill attention: the options' choice, else "sdpa" on the GPU, "numba" simulated
        self.prefill = options.prefill or ("numba" if SIMULATING else "sdpa")
        #: whether the Numba GEMV takes bf16 decode at batch <= gemv.MAX_ROWS
        self.gemv = (not SIMULATING) if options.gemv is None else bool(options.gemv)
        if name not in (None, "numba", "numba-sim"):
            raise ValueError(f"NumbaBackend: unknown name {name!r} (use 'numba' or 'numba-sim')")
        if simulate is not None:
            wanted = "numba-sim" if simulate else "numba"
            if name is not None and name != wanted:
                raise ValueError(f"NumbaBackend: name {name!r} contradicts simulate={simulate}")
            name = wanted
        if name is not None and name != backend_name():
            raise _mode_error(name)
        self.name = backend_name()
        if SIMULATING:
            self.device = torch.device("cpu")
            if device is not None and torch.device(device).type != "cpu":
                raise ValueError("numba-sim runs on the CPU: tensors must live there")
        else:
            if not torch.cuda.is_available():
                raise RuntimeError(
                    "backend 'numba': numba.cuda was imported for a GPU (NUMBA_ENABLE_CUDASIM "
                    "unset or 0) but torch sees no CUDA device.  Start a new process with "
                    "NUMBA_ENABLE_CUDASIM=1 to simulate, or use the torch backend.")
            self.device = torch.device(device) if device is not None else \
                torch.device("cuda", torch.cuda.current_device())
        self.check_inputs = SIMULATING if check_inputs is None else bool(check_inputs)
        #: launches overlap their predecessor: asked for, and the GPU can (compute capability
        #: 9.0 or newer; on older GPUs, such as Colab's T4, every launch is plain)
        self.overlap = options.overlap and grid_dependency.supported()
        #: the GEMVs' launch: one block per row block, each letting the next kernel in at its
        #: entry (``KernelOptions.gemv_wave``), or a capped grid of blocks that loop
        self.gemv_wave = options.gemv_wave
        #: warps per GEMV block for that launch
        self.gemv_warps = gemv.WAVE_WARPS if options.gemv_wave else gemv.WARPS
        self._checked_tables: set = set()
        #: why ``attention="tensor_core"`` last fell back to "fast" (None: it did not)
        self.attention_fallback: str | None = None
        #: (dtype, head_dim, group, block size) -> why the tensor-core kernel cannot run it
        self._tensor_core_refusals: dict[tuple, str | None] = {}

    def _launch(self, kernel, grid, block, *args) -> None:
        """``launch.launch`` with this backend's ``overlap``."""
        launch.launch(kernel, grid, block, *args, overlap=self.overlap)

    def describe(self) -> str:
        mode = "Numba CUDA simulator" if SIMULATING else "Numba CUDA kernels + cuBLAS"
        return f"{self.name} on {self.device} ({mode})"

    # --- helpers ---------------------------------------------------------------------
    @staticmethod
    def _same_dtype(*tensors) -> str:
        dtype = tensors[0].dtype
        for t in tensors[1:]:
            if t.dtype != dtype:
                raise TypeError(f"numba backend: mixed dtypes {dtype} and {t.dtype}")
        return ops_for(dtype).name

    def _int32(self, t: torch.Tensor) -> torch.Tensor:
        """Index tensors: int32, contiguous, on this device (returned as they are when they
        already are: the hot path)."""
        if t.dtype == torch.int32 and t.device == self.device and t.is_contiguous():
            return t
        return t.to(device=self.device, dtype=torch.int32).contiguous()

    def _vec_rows(self, *tensors) -> bool:
        """May the 16-byte bf16 kernels take these [R, n] tensors?  bf16, n a multiple of 8,
        rows starting 16-byte aligned (data pointer and row stride), each row contiguous."""
        if not self.options.vector:
            return False
        for t in tensors:
            if t.dtype != torch.bfloat16 or t.data_ptr() % 16 or t.shape[-1] % 8:
                return False
            st = t.stride()
            if st[-1] != 1 or (len(st) > 1 and st[0] % 8):
                return False
        return True

    def _table_ok(self, cache, block_table) -> None:
        """``_check_table`` once per (cache, device table): the hot path skips it after."""
        key = (id(cache), block_table.data_ptr())
        if key not in self._checked_tables:
            self._check_table(cache, block_table)
            if len(self._checked_tables) > 64:
                self._checked_tables.clear()
            self._checked_tables.add(key)

    # --- GEMMs -----------------------------------------------------------------------
    def _gemv_rows(self, x, *weights) -> bool:
        """Does the Numba GEMV take x [T, K] @ W.T for these weights?  bf16, 16-byte rows,
        at most ``gemv.MAX_ROWS`` rows, contiguous weights of K columns."""
        return (self.gemv and x.dim() == 2 and 0 < x.shape[0] <= gemv.MAX_ROWS
                and all(w.dim() == 2 and w.shape[1] == x.shape[1] and w.is_contiguous()
                        for w in weights)
                and self._vec_rows(x, *weights))

    def _gemv(self, x, weight, out, add_into_out: bool = False) -> None:
        """``out = x @ weight.T`` (or ``out += ...``) by the Numba GEMV; out [T, N] contiguous."""
        n_out, k = weight.shape
        xa, x_rs = rows(x, "x", words=True)
        self._launch(gemv.gemv_kernel(x.shape[0], k, self.gemv_warps, add_into_out,
                                      self.gemv_wave),
                     gemv.grid(n_out, k, self.gemv_warps, self.gemv_wave), 32 * self.gemv_warps,
                     xa, x_rs, words(weight, "weight"), flat(out), n_out, n_out)

    def linear(self, x, weight, bias=None):
        """torch (cuBLAS) for GEMMs; the Numba GEMV (``gemv.py``) for bf16 at up to
        ``gemv.MAX_ROWS`` rows, where a decode step is all weight reads.  With a bias (a
        Qwen2 QKV projection): torch, the bias added by the GEMM."""
        if bias is not None:
            return torch.nn.functional.linear(x, weight, bias)
        if self._gemv_rows(x, weight):
            out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
            self._gemv(x, weight, out)
            return out
        return torch.nn.functional.linear(x, weight)

    def linear_silu_mul(self, x, gate_up_weight):
        """The gate/up GEMV with the SwiGLU in its store (``gemv.linear_silu_mul_kernel``) for
        bf16 at up to ``gemv.MAX_ROWS`` rows; otherwise ``linear`` then ``silu_mul``."""
        n_out, k = gate_up_weight.shape
        if not (self.options.fuse_epilogues and self._gemv_rows(x, gate_up_weight)
                and n_out % 2 == 0 and gemv.pair_supported(k)):
            return super().linear_silu_mul(x, gate_up_weight)
        inter = n_out // 2
        out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
        xa, x_rs = rows(x, "x", words=True)
        self._launch(gemv.linear_silu_mul_kernel(x.shape[0], k, self.gemv_wave),
                     gemv.pair_grid(inter, self.gemv_warps, self.gemv_wave),
                     32 * self.gemv_warps, xa, x_rs, xa, 0.0,    # no norm: x in its place
                     words(gate_up_weight, "gate_up_weight"), flat(out), inter)
        return out

    def _fuse_norms(self, residual, *weights) -> bool:
        """The five-kernel decoder layer (``KernelOptions.fuse_norms``) for this residual
        [T, H]: the GEMV's conditions, and a contiguous residual the projections add into."""
        return (self.options.fuse_norms and self.options.fuse_epilogues
                and residual.is_contiguous() and self._gemv_rows(residual, *weights))

    def o_proj_mlp(self, attn, residual, o_weight, norm_weight, eps, gate_up_weight,
                   down_weight):
        """With ``KernelOptions.fuse_norms`` at decode (bf16, batch 1): three kernels,
        ``gemv.py``: the output projection adding into ``residual``, the gate/up GEMV with the
        RMSNorm in its prologue and the SwiGLU in its epilogue, the down projection adding
        into ``residual``; returns None (nothing left to add).  Otherwise
        ``Backend.o_proj_mlp``."""
        n_inter, hidden = gate_up_weight.shape[0] // 2, residual.shape[1]
        if not (self._fuse_norms(residual, gate_up_weight) and gemv.pair_supported(hidden)
                and gate_up_weight.shape[0] % 2 == 0 and o_weight.shape[0] == hidden
                and tuple(down_weight.shape) == (hidden, n_inter)
                and self._gemv_rows(attn, o_weight) and self._vec_rows(norm_weight)
                and norm_weight.is_contiguous() and down_weight.is_contiguous()
                and self._vec_rows(down_weight)):
            return super().o_proj_mlp(attn, residual, o_weight, norm_weight, eps,
                                      gate_up_weight, down_weight)
        self._gemv(attn, o_weight, residual, add_into_out=True)
        act = torch.empty(residual.shape[0], n_inter, dtype=residual.dtype,
                          device=residual.device)
        ra, r_rs = rows(residual, "residual", words=True)
        self._launch(gemv.norm_linear_silu_mul_kernel(residual.shape[0], hidden,
                                                      self.gemv_wave),
                     gemv.pair_grid(n_inter, self.gemv_warps, self.gemv_wave),
                     32 * self.gemv_warps, ra, r_rs,
                     words(norm_weight, "norm_weight"), float(eps),
                     words(gate_up_weight, "gate_up_weight"), flat(act), n_inter)
        self._gemv(act, down_weight, residual, add_into_out=True)
        return None

    # --- per-token ops ---------------------------------------------------------------
    def embed(self, weight, token_ids):
        ops_for(weight.dtype)
        ids = self._int32(token_ids)
        n_tokens, hidden = ids.shape[0], weight.shape[1]
        if self.check_inputs and n_tokens and (int(ids.min()) < 0 or
                                               int(ids.max()) >= weight.shape[0]):
            raise IndexError(f"embed: token id out of range [0, {weight.shape[0]})")
        out = torch.empty(n_tokens, hidden, dtype=weight.dtype, device=weight.device)
        n = n_tokens * hidden
        if n == 0:
            return out
        if self._vec_rows(weight):
            w, w_rs = rows(weight, "weight", words=True)
            n_chunks = n // 8
            self._launch(elementwise.embed_vec_kernel, launch.elemwise_grid(n_chunks),
                    launch.ELEMWISE_THREADS, w, w_rs, flat(ids), words(out), hidden // 2,
                    n_chunks)
            return out
        w, w_rs = rows(weight, "weight")
        self._launch(elementwise.embed_kernel, launch.elemwise_grid(n), launch.ELEMWISE_THREADS,
                w, w_rs, flat(ids), flat(out), hidden, n)
        return out

    def rms_norm(self, x, weight, eps):
        dtype = self._same_dtype(x, weight)
        n_tokens, hidden = x.shape
        out = torch.empty(n_tokens, hidden, dtype=x.dtype, device=x.device)
        if n_tokens == 0:
            return out
        if self._vec_rows(x, weight):
            threads, per_thread = norms.vec_row_threads(hidden, VEC_ROW_MAX_THREADS)
            kernel = norms.rms_norm_vec_kernels(per_thread)[0]
            xa, x_rs = rows(x, "x", words=True)
            self._launch(kernel, n_tokens, threads, xa, x_rs, words(weight, "weight"), words(out),
                    hidden, float(eps))
            return out
        kernel, _ = norms.rms_norm_kernels(dtype)
        xa, x_rs = rows(x, "x")
        self._launch(kernel, n_tokens, launch.ROW_THREADS, xa, x_rs, flat(weight, "weight"),
                flat(out), hidden, float(eps))
        return out

    def add_rms_norm(self, x, residual, weight, eps):
        dtype = self._same_dtype(x, residual, weight)
        n_tokens, hidden = x.shape
        if residual.shape != x.shape:
            raise ValueError(f"add_rms_norm: residual {tuple(residual.shape)} != x "
                             f"{tuple(x.shape)}")
        out = torch.empty(n_tokens, hidden, dtype=x.dtype, device=x.device)
        if n_tokens == 0:
            return out
        if self._vec_rows(x, residual, weight):
            threads, per_thread = norms.vec_row_threads(hidden, VEC_ROW_MAX_THREADS)
            kernel = norms.rms_norm_vec_kernels(per_thread)[1]
            xa, x_rs = rows(x, "x", words=True)
            ra, r_rs = rows(residual, "residual", words=True)
            self._launch(kernel, n_tokens, threads, xa, x_rs, ra, r_rs, words(weight, "weight"),
                    words(out), hidden, float(eps))
            return out
        _, kernel = norms.rms_norm_kernels(dtype)
        xa, x_rs = rows(x, "x")
        ra, r_rs = rows(residual, "residual")
        self._launch(kernel, n_tokens, launch.ROW_THREADS, xa, x_rs, ra, r_rs,
                flat(weight, "weight"), flat(out), hidden, float(eps))
        return out

    def rope(self, q, k, positions, cos, sin):
        dtype = self._same_dtype(q, k)
        n_tokens, n_q_heads, head_dim = q.shape
        n_kv_heads = k.shape[1]
        if cos.dtype != torch.float32 or sin.dtype != torch.float32:
            raise TypeError("rope: cos/sin tables must be float32")
        if cos.shape[-1] != head_dim // 2:
            raise ValueError(f"rope: cos/sin have {cos.shape[-1]} columns, need {head_dim // 2}")
        n = n_tokens * (n_q_heads + n_kv_heads) * (head_dim // 2)
        if n == 0:
            return
        pos = self._int32(positions)
        if self.check_inputs and (int(pos.min()) < 0 or int(pos.max()) >= cos.shape[0]):
            raise IndexError(f"rope: position out of range [0, {cos.shape[0]})")
        qa, q_rs = rows(q, "q")
        ka, k_rs = rows(k, "k")
        self._launch(rope_kernels.rope_kernel(dtype), launch.elemwise_grid(n), launch.ELEMWISE_THREADS,
                qa, q_rs, n_q_heads, ka, k_rs, n_kv_heads, head_dim, flat(pos),
                flat(cos.contiguous()), flat(sin.contiguous()), n_tokens)

    def silu_mul(self, gate_up):
        dtype = self._same_dtype(gate_up)
        n_tokens, two_inter = gate_up.shape
        inter = two_inter // 2
        out = torch.empty(n_tokens, inter, dtype=gate_up.dtype, device=gate_up.device)
        n = n_tokens * inter
        if n == 0:
            return out
        if inter % 8 == 0 and self._vec_rows(gate_up):
            ga, g_rs = rows(gate_up, "gate_up", words=True)
            n_chunks = n // 8
            self._launch(elementwise.silu_mul_vec_kernel, launch.elemwise_grid(n_chunks),
                    launch.ELEMWISE_THREADS, ga, g_rs, words(out), inter // 2, n_chunks)
            return out
        ga, g_rs = rows(gate_up, "gate_up")
        self._launch(elementwise.silu_mul_kernel(dtype), launch.elemwise_grid(n),
                launch.ELEMWISE_THREADS, ga, g_rs, flat(out), inter, n)
        return out

    # --- the paged cache -------------------------------------------------------------
    @staticmethod
    def _check_table(cache, block_table):
        c = cache.config
        expected = (c.max_slots, c.num_layers, c.MAX_BLOCKS_PER_SEQ)
        if tuple(block_table.shape) != expected or block_table.dtype != torch.int32 \
                or not block_table.is_contiguous():
            raise ValueError(f"block_table must be a contiguous int32 tensor of shape {expected} "
                             f"(cache.device_block_table()), got {block_table.dtype} "
                             f"{tuple(block_table.shape)}")
        if cache.buffer.dtype != DTYPE_OPS[c.dtype].torch_dtype:
            raise TypeError("cache.buffer dtype does not match cache.config.dtype")

    def write_kv(self, cache, k, v, block_table, layer, slots, positions):
        self._same_dtype(k, v, cache.buffer)
        self._table_ok(cache, block_table)
        c = cache.config
        n_tokens = k.shape[0]
        if tuple(k.shape[1:]) != (c.num_kv_heads, c.head_dim) or v.shape != k.shape:
            raise ValueError(f"write_kv: k/v must be [T, {c.num_kv_heads}, {c.head_dim}], got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
        if n_tokens == 0:
            return
        slots32, pos32 = self._int32(slots), self._int32(positions)
        if self.check_inputs:
            table = block_table.cpu().numpy()
            s, p = slots32.cpu().numpy(), pos32.cpu().numpy()
            for slot in np.unique(s):
                check_block_entries(cache, table, int(slot), layer,
                                    int(p[s == slot].max()) + 1, "write_kv")
        ka, k_rs = rows(k, "k")
        va, v_rs = rows(v, "v")
        n = n_tokens * c.KV_DIM
        self._launch(kv_write.write_kv_kernel, launch.elemwise_grid(n), launch.ELEMWISE_THREADS,
                ka, k_rs, va, v_rs, flat(cache.buffer, "cache.buffer"),
                as_kernel_array(block_table), int(layer), flat(slots32), flat(pos32),
                n_tokens, c.KV_DIM, c.BLOCK_SIZE, c.BLOCK_ELEMS, c.V_OFFSET_ELEMS)

    @staticmethod
    def _check_rope_write(cache, block_table, layer, pos32, slots32, cos) -> None:
        """check_inputs: positions inside the RoPE tables, block-table entries assigned."""
        if int(pos32.min()) < 0 or int(pos32.max()) >= cos.shape[0]:
            raise IndexError(f"rope: position out of range [0, {cos.shape[0]})")
        table = block_table.cpu().numpy()
        s, p = slots32.cpu().numpy(), pos32.cpu().numpy()
        for slot in np.unique(s):
            check_block_entries(cache, table, int(slot), layer, int(p[s == slot].max()) + 1,
                                "write_kv")

    def qkv_rope_write_kv(self, x, qkv_weight, n_q_heads, positions, cos, sin, cache,
                          block_table, layer, slots):
        """The QKV GEMV, RoPE and the cache write in one kernel (``gemv.py``) for bf16 decode
        at up to ``gemv.MAX_ROWS`` tokens; otherwise the separate ops (``Backend``)."""
        c = cache.config
        n_out, k_in = qkv_weight.shape
        n_tokens = x.shape[0]
        if not (self.options.fuse_epilogues and self._gemv_rows(x, qkv_weight)
                and self._rope_fusable(cache, qkv_weight, n_q_heads, cos, sin)):
            return super().qkv_rope_write_kv(x, qkv_weight, n_q_heads, positions, cos, sin,
                                             cache, block_table, layer, slots)
        self._table_ok(cache, block_table)
        pos32, slots32 = self._int32(positions), self._int32(slots)
        if self.check_inputs:
            self._check_rope_write(cache, block_table, layer, pos32, slots32, cos)
        out = torch.empty(n_tokens, n_out, dtype=x.dtype, device=x.device)
        xa, x_rs = rows(x, "x", words=True)
        self._launch(gemv.qkv_rope_write_kv_kernel(n_tokens, k_in, self.gemv_wave),
                     gemv.qkv_grid(n_out, self.gemv_warps, self.gemv_wave),
                     32 * self.gemv_warps, xa, x_rs, xa, 0.0,    # no norm: x in its place
                     words(qkv_weight, "qkv_weight"), flat(out), n_out, flat(pos32),
                     flat(cos), flat(sin), n_q_heads, c.num_kv_heads, c.head_dim,
                     flat(cache.buffer, "cache.buffer"), as_kernel_array(block_table),
                     int(layer), flat(slots32), c.KV_DIM, c.BLOCK_SIZE, c.BLOCK_ELEMS,
                     c.V_OFFSET_ELEMS)
        return self._qkv_views(out, n_q_heads, c)

    @staticmethod
    def _rope_fusable(cache, qkv_weight, n_q_heads, cos, sin) -> bool:
        """Can the QKV GEMV's epilogue do RoPE and the cache write for this layout?"""
        c = cache.config
        n_out, k_in = qkv_weight.shape
        return (cache.buffer.dtype == torch.bfloat16
                and gemv.fused_qkv_supported(k_in, c.head_dim)
                and n_out == (n_q_heads + 2 * c.num_kv_heads) * c.head_dim
                and cos.dtype == torch.float32 and sin.dtype == torch.float32
                and cos.shape[-1] == c.head_dim // 2 and cos.is_contiguous()
                and sin.is_contiguous())

    @staticmethod
    def _qkv_views(out, n_q_heads, c):
        """q, k, v as views of the projection [T, (nH + 2 nKV) D]."""
        n_tokens, d, q_dim = out.shape[0], c.head_dim, n_q_heads * c.head_dim
        return (out[:, :q_dim].view(n_tokens, n_q_heads, d),
                out[:, q_dim:q_dim + c.KV_DIM].view(n_tokens, c.num_kv_heads, d),
                out[:, q_dim + c.KV_DIM:].view(n_tokens, c.num_kv_heads, d))

    def norm_qkv_rope_write_kv(self, h, residual, norm_weight, eps, qkv_weight, n_q_heads,
                               positions, cos, sin, cache, block_table, layer, slots):
        """With ``KernelOptions.fuse_norms`` at decode (bf16, batch 1, nothing left to add:
        ``h`` None): one kernel, the RMSNorm in the QKV GEMV's prologue, RoPE and the cache
        write in its epilogue (``gemv.norm_qkv_rope_write_kv_kernel``).  Otherwise
        ``Backend``'s ops: the norm (with the add), then ``qkv_rope_write_kv``."""
        c = cache.config
        n_out, k_in = qkv_weight.shape
        n_tokens = residual.shape[0]
        if not (h is None and self._fuse_norms(residual, qkv_weight)
                and self._rope_fusable(cache, qkv_weight, n_q_heads, cos, sin)
                and self._vec_rows(norm_weight) and norm_weight.is_contiguous()):
            return super().norm_qkv_rope_write_kv(h, residual, norm_weight, eps, qkv_weight,
                                                  n_q_heads, positions, cos, sin, cache,
                                                  block_table, layer, slots)
        self._table_ok(cache, block_table)
        pos32, slots32 = self._int32(positions), self._int32(slots)
        if self.check_inputs:
            self._check_rope_write(cache, block_table, layer, pos32, slots32, cos)
        out = torch.empty(n_tokens, n_out, dtype=residual.dtype, device=residual.device)
        ra, r_rs = rows(residual, "residual", words=True)
        self._launch(gemv.norm_qkv_rope_write_kv_kernel(n_tokens, k_in, self.gemv_wave),
                     gemv.qkv_grid(n_out, self.gemv_warps, self.gemv_wave),
                     32 * self.gemv_warps, ra, r_rs, words(norm_weight, "norm_weight"), float(eps),
                     words(qkv_weight, "qkv_weight"), flat(out), n_out, flat(pos32), flat(cos),
                     flat(sin), n_q_heads, c.num_kv_heads, c.head_dim,
                     flat(cache.buffer, "cache.buffer"), as_kernel_array(block_table),
                     int(layer), flat(slots32), c.KV_DIM, c.BLOCK_SIZE, c.BLOCK_ELEMS,
                     c.V_OFFSET_ELEMS)
        return self._qkv_views(out, n_q_heads, c)

    def rope_write_kv(self, q, k, v, positions, cos, sin, cache, block_table, layer, slots):
        """``rope`` then ``write_kv`` in one kernel (``rope_write_kv.py``)."""
        dtype = self._same_dtype(q, k, v, cache.buffer)
        self._table_ok(cache, block_table)
        c = cache.config
        n_tokens, n_q_heads, head_dim = q.shape
        if tuple(k.shape[1:]) != (c.num_kv_heads, c.head_dim) or v.shape != k.shape \
                or head_dim != c.head_dim or cos.dtype != torch.float32 \
                or sin.dtype != torch.float32 or cos.shape[-1] != head_dim // 2:
            # unusual shapes: the two separate ops check and report them
            return super().rope_write_kv(q, k, v, positions, cos, sin, cache, block_table,
                                         layer, slots)
        if n_tokens == 0:
            return
        pos32, slots32 = self._int32(positions), self._int32(slots)
        if self.check_inputs:
            self._check_rope_write(cache, block_table, layer, pos32, slots32, cos)
        cos, sin = cos.contiguous(), sin.contiguous()
        if self._rope_vec_ok(q, k, v, cos, sin, cache):
            qa, q_rw = self._word_rows(q, "q")
            ka, k_rw = self._word_rows(k, "k")
            va, v_rw = self._word_rows(v, "v")
            n_chunks = (n_tokens * (n_q_heads + c.num_kv_heads) * (head_dim // 2)
                        // chunk_elems(q.element_size()))
            self._launch(rope_write_kv.rope_write_kv_vec_kernel(dtype),
                         launch.elemwise_grid(n_chunks), launch.ELEMWISE_THREADS, qa, q_rw,
                         n_q_heads, ka, k_rw, va, v_rw, c.num_kv_heads, head_dim, flat(pos32),
                         flat(cos.view(torch.int32)), flat(sin.view(torch.int32)), n_tokens,
                         self._words(cache.buffer, "cache.buffer"),
                         as_kernel_array(block_table), int(layer), flat(slots32), c.KV_DIM,
                         c.BLOCK_SIZE, c.BLOCK_ELEMS, c.V_OFFSET_ELEMS)
            return
        qa, q_rs = rows(q, "q")
        ka, k_rs = rows(k, "k")
        va, v_rs = rows(v, "v")
        n = n_tokens * (n_q_heads + c.num_kv_heads) * (head_dim // 2)
        self._launch(rope_write_kv.rope_write_kv_kernel(dtype), launch.elemwise_grid(n),
                launch.ELEMWISE_THREADS, qa, q_rs, n_q_heads, ka, k_rs, va, v_rs,
                c.num_kv_heads, head_dim, flat(pos32), flat(cos), flat(sin), n_tokens,
                flat(cache.buffer, "cache.buffer"),
                as_kernel_array(block_table), int(layer), flat(slots32), c.KV_DIM,
                c.BLOCK_SIZE, c.BLOCK_ELEMS, c.V_OFFSET_ELEMS)

    def _rope_vec_ok(self, q, k, v, cos, sin, cache) -> bool:
        """May ``rope_write_kv`` take the 16-byte kernel?  Only for the 2-byte dtypes a GPU
        runs (bfloat16, float16), whose products are rounded to the dtype before they are
        added: in float32 the GPU compiler may fuse a product and the sum into one FMA, and it
        does so differently in the two kernels, so float32 keeps the scalar kernel and its
        bits.  Every access must be a whole aligned chunk of E = 8 elements: D / 2 a multiple
        of E, the rows of q, k and v contiguous with strides that are multiples of E, and q,
        k, v, the cache buffer, cos and sin (contiguous) starting on 16 bytes."""
        if not self.options.vector or q.element_size() != 2:
            return False
        elems = chunk_elems(q.element_size())
        c = cache.config
        if c.head_dim % (2 * elems) or c.BLOCK_ELEMS % elems or c.V_OFFSET_ELEMS % elems:
            return False
        for t in (q, k, v):
            if t.data_ptr() % CHUNK_BYTES or t.stride(-1) != 1 or t.stride(0) % elems:
                return False
        return all(t.data_ptr() % CHUNK_BYTES == 0 for t in (cache.buffer, cos, sin))

    @staticmethod
    def _word_rows(t, name):
        """``rows`` as int32 words: two elements of a 2-byte dtype per word, or one float32."""
        if t.element_size() == 4:
            return rows(t.view(torch.int32), name)
        return rows(t, name, words=True)

    @staticmethod
    def _words(t, name):
        """``words`` for a contiguous tensor of any dtype the 16-byte kernels take: two
        elements of a 2-byte dtype per int32 word, or one float32."""
        if t.element_size() == 4:
            return flat(t.view(torch.int32), name)
        return words(t, name)

    def _tiles(self, inputs, tile: int) -> torch.Tensor:
        """(seq_start, seq_end, q_start) per query tile of the prefill kernel, built from the
        host ``cu_seqlens`` once per step (every layer reads the same tiles)."""
        def build():
            b = inputs.cu_seqlens_host
            info = [(s, e, q0) for s, e in zip(b[:-1], b[1:]) for q0 in range(s, e, tile)]
            return torch.tensor(info, dtype=torch.int32).reshape(-1, 3).to(self.device)
        return inputs.derived(("numba.prefill_tiles", tile), build)

    def prefill_attention(self, q, k, v, inputs, scale):
        dtype = self._same_dtype(q, k, v)
        n_tokens, n_q_heads, head_dim = q.shape
        n_kv_heads = k.shape[1]
        if n_q_heads % n_kv_heads:
            raise ValueError(f"prefill_attention: {n_q_heads} q heads are not a multiple of "
                             f"{n_kv_heads} kv heads")
        if self.prefill == "sdpa":
            if prefill_sdpa.varlen_supported(q):
                return prefill_sdpa.prefill_attention_varlen(q, k, v, inputs.cu_seqlens,
                                                             inputs.max_query_len, scale)
            return prefill_sdpa.prefill_attention_sdpa(q, k, v, inputs.cu_seqlens_host, scale)
        out = torch.empty(n_tokens, n_q_heads, head_dim, dtype=q.dtype, device=q.device)
        tile = prefill.tile_for(head_dim, SIMULATING)
        tiles = self._tiles(inputs, tile)
        if tiles.shape[0] == 0:
            return out
        kernel = prefill.make_prefill_kernel(dtype, head_dim, tile)
        qa, q_rs = rows(q, "q")
        ka, k_rs = rows(k, "k")
        va, v_rs = rows(v, "v")
        self._launch(kernel, (tiles.shape[0], n_q_heads), tile, qa, q_rs, ka, k_rs, va, v_rs,
                flat(out), as_kernel_array(tiles), n_q_heads // n_kv_heads, float(scale))
        return out

    def checked_decode_inputs(self, q, cache, block_table, layer, seq_lens, active_slots):
        """``decode_attention``'s input checks, shared by every decode attention kernel
        (``TritonAttentionBackend`` too); returns seq_lens and active_slots as int32."""
        self._same_dtype(q, cache.buffer)
        self._table_ok(cache, block_table)
        c = cache.config
        n_seqs, n_q_heads, head_dim = q.shape
        if head_dim != c.head_dim:
            raise ValueError(f"decode_attention: q head_dim {head_dim} != cache head_dim "
                             f"{c.head_dim}")
        if n_q_heads % c.num_kv_heads:
            raise ValueError(f"decode_attention: {n_q_heads} q heads are not a multiple of "
                             f"{c.num_kv_heads} kv heads")
        lens32, slots32 = self._int32(seq_lens), self._int32(active_slots)
        if self.check_inputs and n_seqs:
            table = block_table.cpu().numpy()
            for slot, n in zip(slots32.tolist(), lens32.tolist()):
                if n < 1 or n > c.max_seq_len:
                    raise ValueError(f"decode_attention: seq_len {n} outside [1, "
                                     f"{c.max_seq_len}]")
                check_block_entries(cache, table, slot, layer, n, "decode_attention")
        return lens32, slots32

    def decode_kernel_for(self, cache, n_q_heads: int, batch: int) -> str:
        """The decode attention kernel for this layout and batch: the options' choice, with
        "auto" as "tensor_core" from ``attention_tc.MIN_BATCH`` sequences where it can run and
        "fast" otherwise; "tensor_core" where it cannot run is "fast" (the reason,
        ``attention_tc.unsupported_reason``, kept in ``attention_fallback`` and warned about
        once per reason)."""
        kind = self.options.attention
        if kind not in ("auto", "tensor_core"):
            return kind
        c = cache.config
        layout = (c.dtype, c.head_dim, n_q_heads // max(1, c.num_kv_heads), c.BLOCK_SIZE)
        if layout not in self._tensor_core_refusals:        # the GPU's answer, asked once
            self._tensor_core_refusals[layout] = attention_tc.unsupported_reason(*layout)
        why = self._tensor_core_refusals[layout]
        if kind == "auto":
            return "tensor_core" if why is None and batch >= attention_tc.MIN_BATCH else "fast"
        if why is None:
            return kind
        if why != self.attention_fallback:
            warnings.warn(f"KernelOptions(attention='tensor_core'): {why}; running the "
                          "'fast' kernel instead", RuntimeWarning, stacklevel=3)
            self.attention_fallback = why
        return "fast"

    def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                         max_seq_len=None):
        c = cache.config
        kind = self.decode_kernel_for(cache, q.shape[1], q.shape[0])
        use_fast = kind == "fast" and attention_fast.supports(c.head_dim)
        kernel = None
        if not use_fast and kind != "tensor_core":   # (the factory checks head_dim)
            kernel = attention.make_paged_attention_kernel(
                ops_for(q.dtype).name, c.head_dim, c.BLOCK_SIZE, c.num_layers,
                c.MAX_BLOCKS_PER_SEQ, c.KV_DIM, c.BLOCK_ELEMS, c.V_OFFSET_ELEMS)
        lens32, slots32 = self.checked_decode_inputs(q, cache, block_table, layer,
                                                     seq_lens, active_slots)
        if q.shape[0] == 0:
            return q
        if kind == "tensor_core":
            return attention_tc.decode_attention_tc(q, cache, block_table, layer, lens32,
                                                    slots32, scale, overlap=self.overlap)
        if use_fast:
            return attention_fast.decode_attention_fast(q, cache, block_table, layer, lens32,
                                                        slots32, scale, overlap=self.overlap)
        return attention.launch_decode(kernel, q, cache, block_table, layer, lens32, slots32,
                                       scale)

    # --- sampling --------------------------------------------------------------------
    def sample(self, logits, temperature, top_p, uniforms):
        if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            logits = logits.float()
        n_rows, vocab = logits.shape
        out = torch.empty(n_rows, dtype=torch.int64, device=logits.device)
        if n_rows == 0:
            return out

        def f32(t):
            if t.dtype == torch.float32 and t.device == logits.device and t.is_contiguous():
                return t
            return t.to(device=logits.device, dtype=torch.float32).reshape(-1).contiguous()

        dev = logits.device
        parts = sampling.greedy_parts(n_rows)
        probs = launch.persistent_buffer(dev, "sample.probs", n_rows * vocab)
        part_v = launch.persistent_buffer(dev, "sample.part_v", n_rows * parts)
        part_i = launch.persistent_buffer(dev, "sample.part_i", n_rows * parts, torch.int32)
        tickets = launch.persistent_buffer(dev, "sample.tickets", n_rows, torch.int32,
                                           zero=True)
        vector = self._vec_rows(logits)            # bf16 rows for 16-byte loads
        if vector:
            la, l_words = rows(logits, "logits", words=True)
            l_rs = 2 * l_words                     # the kernel counts the stride in logits
        else:
            la, l_rs = rows(logits, "logits")
        self._launch(sampling.sample_kernel_for(ops_for(logits.dtype).name, vector),
                     (n_rows, parts), launch.SAMPLE_THREADS, la, l_rs, vocab,
                     flat(f32(temperature)), flat(f32(top_p)), flat(f32(uniforms)),
                     flat(probs), flat(out), flat(part_v), flat(part_i), flat(tickets))
        return out
