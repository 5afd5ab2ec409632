"""The Llama forward pass over one engine step, written once against the Backend contract.

A step is either a *prefill* of newly admitted sequences (their prompts packed into one token
batch, causal attention inside each, K/V scattered into their blocks; a sequence whose prompt
prefix was found in the cache attends to it there) or a *decode* of every
running sequence (one token each, attention read from the paged cache through the block
table).  Per layer (article parts 1-6): RMSNorm, QKV projection, RoPE, K/V written to the
paged cache, attention, O projection + residual, RMSNorm, SwiGLU MLP + residual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.config import ModelConfig
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.loading.models import Model
from paged_tutorial.model.rope import rope_cos_sin
from paged_tutorial.step_inputs import StepInputs
from paged_tutorial.loading.weights import EMBED, FINAL_NORM, LAYER_PREFIX, LM_HEAD


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor          # [q_dim + 2*kv_dim, hidden]: q, k and v rows stacked
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor      # [2*intermediate, hidden]: gate rows, then up rows
    down: torch.Tensor


class Llama:
    """The network, ready to run: the model's weights on the backend's device (the packed
    q/k/v and gate/up tensors of ``Model.packed``, not copies) and the RoPE tables."""

    def __init__(self, model: Model, backend: Backend, max_positions: int):
        if model.device.type != backend.device.type:
            raise ValueError(f"the model's weights are on {model.device}, the backend runs on "
                             f"{backend.device}: pass model.to(backend.device)")
        cfg = model.config
        self.config: ModelConfig = cfg
        self.backend = backend
        w, packed = model.weights, model.packed
        self.embed = w[EMBED]
        self.lm_head = w.get(LM_HEAD, self.embed)
        self.final_norm = w[FINAL_NORM]
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = LAYER_PREFIX.format(i=i)
            self.layers.append(LayerWeights(
                input_norm=w[p + "input_layernorm.weight"],
                qkv=packed[p + "self_attn.qkv_proj.weight"],
                o=w[p + "self_attn.o_proj.weight"],
                post_norm=w[p + "post_attention_layernorm.weight"],
                gate_up=packed[p + "mlp.gate_up_proj.weight"],
                down=w[p + "mlp.down_proj.weight"],
            ))
        self.cos, self.sin = rope_cos_sin(cfg, max_positions, device=backend.device)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.dtype = self.embed.dtype

    # ------------------------------------------------------------------------------------
    def _layer_prologue(self, layer: LayerWeights, h, residual, first: bool, index: int,
                        inputs: StepInputs, cache):
        b, cfg = self.backend, self.config
        if first:
            x = b.rms_norm(residual, layer.input_norm, cfg.rms_norm_eps)
        else:
            x = b.add_rms_norm(h, residual, layer.input_norm, cfg.rms_norm_eps)
        # QKV projection, RoPE, K/V into the paged cache (one op: a backend may fuse it).
        # q, k, v are views into the projection (rows strided, each row contiguous): every
        # backend op accepts them, and three copy kernels per layer are saved
        return b.qkv_rope_write_kv(x, layer.qkv, cfg.n_heads, inputs.positions, self.cos,
                                   self.sin, cache, inputs.block_table, index, inputs.slots)

    def _layer_epilogue(self, layer: LayerWeights, attn, residual):
        b, cfg = self.backend, self.config
        attn_out = b.linear(attn.reshape(attn.shape[0], -1), layer.o)
        x = b.add_rms_norm(attn_out, residual, layer.post_norm, cfg.rms_norm_eps)
        mlp = b.linear(b.linear_silu_mul(x, layer.gate_up), layer.down)
        return mlp

    def _logits(self, h, residual, rows: torch.Tensor | None):
        b, cfg = self.backend, self.config
        if rows is not None:            # only the rows that need logits (prefill: last tokens)
            h, residual = h[rows], residual[rows]
        # the last residual add fused with the final norm: one kernel, as in every layer
        x = b.add_rms_norm(h, residual, self.final_norm, cfg.rms_norm_eps)
        # in the model's dtype: the samplers read it as it is (a float32 copy of a [B, vocab]
        # row costs as much as reading it), and a caller who keeps logits widens them
        return b.linear(x, self.lm_head)

    # ------------------------------------------------------------------------------------
    def _attention(self, q, k, v, index: int, inputs: StepInputs, cache):
        b = self.backend
        if inputs.reads_cached_context:         # a prefix found in the cache: read it there
            return b.prefill_attention_from_cache(q, cache, inputs.block_table, index, inputs,
                                                  self.scale)
        if inputs.is_prefill:
            return b.prefill_attention(q, k, v, inputs, self.scale)
        return b.decode_attention(q, cache, inputs.block_table, index, inputs.seq_lens,
                                  inputs.seq_slots, self.scale, inputs.max_seq_len)

    def forward(self, inputs: StepInputs, cache: PagedKVCache) -> torch.Tensor:
        """Run all layers for one step and return the logits (model dtype) for ``inputs.logit_rows``
        (all rows when None).  ``inputs`` (``step_inputs.py``) says whether the step is a
        prefill or a decode; ``cache`` holds the K/V the layers write and read."""
        b = self.backend
        residual = b.embed(self.embed, inputs.token_ids)
        h = None
        for i, layer in enumerate(self.layers):
            q, k, v = self._layer_prologue(layer, h, residual, i == 0, i, inputs, cache)
            attn = self._attention(q, k, v, i, inputs, cache)
            h = self._layer_epilogue(layer, attn, residual)
        return self._logits(h, residual, inputs.logit_rows)
