"""The contract every backend fulfils: the engine's non-GEMM operations.

The forward pass (``model/decoder.py``) calls only these methods, so a backend is a drop-in
replacement for another.  ``TorchBackend`` (``torch_ref.py``) is the oracle; the Numba
backends implement the same methods with CUDA kernels.  Shapes below use T = tokens in the step, B = sequences in a
decode step, H = hidden size, nH / nKV = query / key-value heads, D = head_dim.

Conventions shared by all backends
- Activations and weights are torch tensors in the model dtype on ``backend.device``.
  Arithmetic inside an op is float32; results are rounded to the storage dtype once.
- The paged cache is ``cache.buffer``: one flat tensor of ``NUM_BLOCKS * BLOCK_ELEMS`` elements
  in the model dtype.  Element offsets (``cache.config``):
      K(phys, t, h, d) = phys * BLOCK_ELEMS + t * KV_DIM + h * D + d
      V(phys, t, h, d) = K(phys, t, h, d) + V_OFFSET_ELEMS
- ``block_table`` is the device copy of ``cache.block_table``: int32 [max_slots, n_layers,
  MAX_BLOCKS_PER_SEQ], -1 = unassigned.  Kernels find a token's block themselves, as the
  article's kernel does (``kernels.cu:480``).
- Integer index tensors (token ids, slots, positions, seq_lens) are int32 on the device.
  The prefill attention ops take the step's ``StepInputs`` (``step_inputs.py``): its
  device tensors, and the host ints (``cu_seqlens_host``, ``max_seq_len``, ...) an op may need
  to size its work.  No op reads a device tensor back to the host (except input checks a
  backend runs on request).
"""

from __future__ import annotations

import abc

import torch

from paged_tutorial.backends import paged_reads
from paged_tutorial.backends.batched_sampling import sample_batched
from paged_tutorial.backends.logprobs import top_logprobs
from paged_tutorial.backends.sampling_batch import SamplerOutput, SamplingBatch
from paged_tutorial.step_inputs import StepInputs


class Backend(abc.ABC):
    """Abstract base: see the module docstring for the conventions."""

    name: str = "abstract"
    device: torch.device

    # --- capabilities: what code that drives a backend may ask of it (never its name) ------
    #: its decode step reads nothing back to the host, so a CUDA graph can capture it
    graph_capturable: bool = False
    #: it checks token ids, positions and block-table entries on the host before using them
    #: (a host read: a CUDA graph cannot capture it)
    check_inputs: bool = False
    #: its kernels run in Numba's CUDA simulator on the CPU
    simulated: bool = False
    #: it compiles GPU kernels before it can run (worth doing before the first request)
    compiles_kernels: bool = False

    # --- GEMMs: cuBLAS (or the CPU BLAS) through torch, as the article's engine used cuBLAS.
    def linear(self, x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, in] @ weight[out, in].T (+ bias [out]) -> [T, out]."""
        return torch.nn.functional.linear(x, weight, bias)

    def use_quantized_rows(self, pairs: list) -> None:
        """``pairs`` of (weight tensor, ``gguf_rows.QuantizedRows`` holding the same values as
        the file's blocks): a backend whose ``linear`` can read the blocks instead keeps them;
        this one does not."""

    # --- per-token ops -----------------------------------------------------------------
    @abc.abstractmethod
    def embed(self, weight: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Gather rows: weight [V, H], token_ids int32 [T] -> [T, H]."""

    @abc.abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """y = weight * (x / sqrt(mean(x^2) + eps)); x [T, H] -> new [T, H]."""

    @abc.abstractmethod
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """residual += x (in place), then return rms_norm(residual) as a new tensor."""

    @abc.abstractmethod
    def rope(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
             cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate q [T, nH, D] and k [T, nKV, D] in place (HF's rotate-half convention).
        cos/sin: float32 [max_positions, D/2]; positions int32 [T]."""

    @abc.abstractmethod
    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] (gate first) -> silu(gate) * up, [T, I]."""

    def linear_silu_mul(self, x: torch.Tensor, gate_up_weight: torch.Tensor) -> torch.Tensor:
        """The MLP's first half: ``silu_mul(linear(x, gate_up_weight))`` ([T, I]).  A backend
        may fuse the two (the numba backend does at batch 1: the SwiGLU happens as the
        projection's rows are stored)."""
        return self.silu_mul(self.linear(x, gate_up_weight))

    # --- the paged cache ---------------------------------------------------------------
    def rope_write_kv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache,
                      block_table: torch.Tensor, layer: int, slots: torch.Tensor) -> None:
        """``rope(q, k, ...)`` then ``write_kv(cache, k, v, ...)``: what every layer does with
        a new token's q, k, v.  A backend may fuse the two (the numba backend does, in one
        kernel); the result must be the same."""
        self.rope(q, k, positions, cos, sin)
        self.write_kv(cache, k, v, block_table, layer, slots, positions)

    def qkv_rope_write_kv(self, x: torch.Tensor, qkv_weight: torch.Tensor, n_q_heads: int,
                          positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache,
                          block_table: torch.Tensor, layer: int, slots: torch.Tensor):
        """The start of every layer after its norm: ``linear(x, qkv_weight)`` (weight rows: the
        q heads, then the k heads, then the v heads), then ``rope_write_kv`` on the q, k, v
        views of that projection.  Returns (q [T, nH, D], k [T, nKV, D], v [T, nKV, D]), views
        of one [T, (nH + 2 nKV) D] tensor, q and k rotated.  A backend may fuse it (the numba
        backend does, for decode); the result must be the same."""
        qkv = self.linear(x, qkv_weight)
        c = cache.config
        t, d = qkv.shape[0], c.head_dim
        q_dim = n_q_heads * d
        q = qkv[:, :q_dim].view(t, n_q_heads, d)
        k = qkv[:, q_dim:q_dim + c.KV_DIM].view(t, c.num_kv_heads, d)
        v = qkv[:, q_dim + c.KV_DIM:].view(t, c.num_kv_heads, d)
        self.rope_write_kv(q, k, v, positions, cos, sin, cache, block_table, layer, slots)
        return q, k, v

    def norm_qkv_rope_write_kv(self, h: torch.Tensor | None, residual: torch.Tensor,
                               norm_weight: torch.Tensor, eps: float, qkv_weight: torch.Tensor,
                               n_q_heads: int, positions: torch.Tensor, cos: torch.Tensor,
                               sin: torch.Tensor, cache, block_table: torch.Tensor, layer: int,
                               slots: torch.Tensor):
        """The start of a layer: ``residual += h`` (in place; nothing when ``h`` is None), then
        ``qkv_rope_write_kv`` on ``rms_norm(residual)``.  Returns (q, k, v) as
        ``qkv_rope_write_kv`` does.  A backend may fuse it (the numba backend computes the norm
        in the QKV GEMV's prologue at decode); the result must be the same."""
        if h is None:
            x = self.rms_norm(residual, norm_weight, eps)
        else:
            x = self.add_rms_norm(h, residual, norm_weight, eps)
        return self.qkv_rope_write_kv(x, qkv_weight, n_q_heads, positions, cos, sin, cache,
                                      block_table, layer, slots)

    def o_proj_mlp(self, attn: torch.Tensor, residual: torch.Tensor, o_weight: torch.Tensor,
                   norm_weight: torch.Tensor, eps: float, gate_up_weight: torch.Tensor,
                   down_weight: torch.Tensor) -> torch.Tensor | None:
        """The rest of a layer after attention (attn [T, nH * D]): ``residual +=
        linear(attn, o_weight)`` (in place), then the MLP on ``rms_norm(residual)``.  Returns
        the MLP's output h, which the caller adds to the residual next (the next layer's
        ``norm_qkv_rope_write_kv``, or the final norm), or None when the backend has already
        added it into ``residual`` (the numba backend at decode: the residual adds happen in
        the projections' epilogues).  Either way ``residual + h`` is the same."""
        attn_out = self.linear(attn, o_weight)
        x = self.add_rms_norm(attn_out, residual, norm_weight, eps)
        return self.linear(self.linear_silu_mul(x, gate_up_weight), down_weight)

    @abc.abstractmethod
    def write_kv(self, cache, k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor,
                 layer: int, slots: torch.Tensor, positions: torch.Tensor) -> None:
        """Scatter k, v [T, nKV, D] into the paged cache: token i goes to slot slots[i] at
        position positions[i] of layer ``layer``, i.e. physical block
        block_table[slot, layer, pos // BLOCK_SIZE], row pos % BLOCK_SIZE."""

    @abc.abstractmethod
    def prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          inputs: StepInputs, scale: float) -> torch.Tensor:
        """Causal attention inside each sequence of a packed prompt batch.
        q [T, nH, D], k/v [T, nKV, D]; sequence i is rows cu_seqlens[i]:cu_seqlens[i+1]
        (``inputs.cu_seqlens`` on the device, ``inputs.cu_seqlens_host`` as ints).
        Returns [T, nH, D]."""

    def prefill_attention_from_cache(self, q: torch.Tensor, cache, block_table: torch.Tensor,
                                     layer: int, inputs: StepInputs,
                                     scale: float) -> torch.Tensor:
        """Causal attention of a prefill whose sequences continue tokens already in the cache
        (prefix caching: the shared prefix is not recomputed).  q [T, nH, D] holds the new
        tokens packed as in ``prefill_attention``: sequence i is rows cu_seqlens[i]:
        cu_seqlens[i+1], its tokens sit at positions context_lens[i], context_lens[i] + 1, ...
        of cache slot seq_slots[i] (all in ``inputs``), and their K/V have already been
        written there (``rope_write_kv``).  The query at position p attends to the slot's
        positions 0..p, all read through the block table.  Returns [T, nH, D].

        Default: the torch oracle's reading of the cache and attention (``paged_reads``),
        torch ops on the cache's device, so every backend has it; a backend may replace it
        with a kernel that gives the same result."""
        return paged_reads.prefill_attention_from_cache(q, cache, block_table, layer, inputs,
                                                        scale)

    @abc.abstractmethod
    def decode_attention(self, q: torch.Tensor, cache, block_table: torch.Tensor, layer: int,
                         seq_lens: torch.Tensor, active_slots: torch.Tensor,
                         scale: float, max_seq_len: int | None = None) -> torch.Tensor:
        """One query token per sequence against every cached token, read through the block
        table.  q [B, nH, D]; row b belongs to cache slot active_slots[b] and attends to its
        first seq_lens[b] tokens (which include the token just written).  ``max_seq_len``:
        the largest seq_lens entry when the caller knows it on the host (``StepInputs`` does;
        None: up to the cache's ``max_seq_len``), for a backend that sizes its work by it.
        The output is written over q, as the article's kernel does
        (``kernels.cu:469,522``); returns q."""

    # --- sampling ----------------------------------------------------------------------
    @abc.abstractmethod
    def sample(self, logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
               uniforms: torch.Tensor) -> torch.Tensor:
        """Pick one token per row of logits [B, V] (the model's dtype, compared as float32);
        see ``sampling.py`` for the exact rule (greedy when temperature == 0; otherwise top-p
        over softmax(logits / T), then the inverse CDF at uniforms[b] in token-id order).
        Returns int64 [B]."""

    def sample_batch(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        """The one sampling call the engine makes: a token per row of logits [B, V], and the
        logprobs the rows asked for.  A batch with no controls goes to ``sample`` (this
        backend's own sampler: a kernel, captured with the decode graphs); a batch with
        controls (``logits_controls.py``: penalties, min_tokens, logits processors, top-k,
        min-p, logprobs) has its logits adjusted and is drawn by the same rule in batched torch
        ops on this backend's device (``batched_sampling.py``), eagerly."""
        controls = batch.controls
        if controls is None:
            return SamplerOutput(self.sample(logits, batch.temperature, batch.top_p,
                                             batch.uniforms))
        token_ids = sample_batched(controls.adjust(logits), batch.temperature, batch.top_p,
                                   batch.uniforms, top_k=controls.top_k, min_p=controls.min_p)
        logprobs = None if controls.num_logprobs is None else \
            top_logprobs(logits, token_ids, controls.num_logprobs)
        return SamplerOutput(token_ids, logprobs)

    # --- housekeeping ------------------------------------------------------------------
    def begin_step(self, step_index: int) -> None:
        """Called by the engine before each step's ops (a recording backend tags its calls
        with it); nothing to do for a plain backend."""

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def describe(self) -> str:
        return f"{self.name} on {self.device}"
