"""The decoder forward pass over one engine step, written once against the Backend contract and
shared by every model family (``families/``: Llama, Qwen2, Qwen3).

A step is either a *prefill* of newly admitted sequences (their prompts packed into one token
batch, causal attention inside each, K/V scattered into their blocks; a sequence whose prompt
prefix was found in the cache attends to it there) or a *decode* of every
running sequence (one token each, attention read from the paged cache through the block
table).  Per layer (article parts 1-6): RMSNorm, QKV projection, RoPE, K/V written to the
paged cache, attention, O projection + residual, RMSNorm, SwiGLU MLP + residual.

The families differ in the start of the layer only, and a layer's weights say which it is: a
``qkv_bias`` is added by the QKV projection (Qwen2), a ``q_norm`` / ``k_norm`` normalises each
head of q and k before RoPE (Qwen3).  A layer with neither (Llama) runs the backend's one
``norm_qkv_rope_write_kv`` op (the residual add, the norm, QKV, RoPE and the cache write),
which a backend may fuse.

``build_network`` is how the engine builds the network for a loaded model: the model's family,
found by its config's architecture, says which tensor fills each ``LayerWeights`` role.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from paged_tutorial.config import ModelConfig
from paged_tutorial.families import family_of
from paged_tutorial.families.family import OPTIONAL_ROLES
from paged_tutorial.model.rope import rope_cos_sin


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor          # [q_dim + 2*kv_dim, hidden]: q, k and v rows stacked
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor      # [2*intermediate, hidden]: gate rows, then up rows
    down: torch.Tensor
    qkv_bias: torch.Tensor | None = None   # [q_dim + 2*kv_dim]: stacked like qkv (Qwen2)
    q_norm: torch.Tensor | None = None     # [head_dim]: RMSNorm of each q head (Qwen3)
    k_norm: torch.Tensor | None = None     # [head_dim]: RMSNorm of each k head (Qwen3)

    @property
    def plain_qkv(self) -> bool:
        """No bias and no q/k norm: the projection, RoPE and cache write are one backend op."""
        return all(getattr(self, role) is None for role in OPTIONAL_ROLES)


class DecoderNetwork:
    """The network, ready to run: the weights on the backend's device and the RoPE tables.

    ``embed``, ``final_norm`` and ``lm_head`` are [V, H], [H] and [V, H] tensors (a tied model
    passes the embedding as its LM head); ``layers`` one ``LayerWeights`` per layer."""

    def __init__(self, config: ModelConfig, embed: torch.Tensor, final_norm: torch.Tensor,
                 lm_head: torch.Tensor, layers: list[LayerWeights], backend,
                 max_positions: int):
        if embed.device.type != backend.device.type:
            raise ValueError(f"the model's weights are on {embed.device}, the backend runs on "
                             f"{backend.device}: pass model.to(backend.device)")
        self.config = config
        self.backend = backend
        self.embed, self.final_norm, self.lm_head = embed, final_norm, lm_head
        self.layers = layers
        self.cos, self.sin = rope_cos_sin(config, max_positions, device=backend.device)
        self.scale = 1.0 / math.sqrt(config.head_dim)
        self.dtype = embed.dtype

    # ------------------------------------------------------------------------------------
    def _layer_prologue(self, layer: LayerWeights, h, residual, index: int, inputs, cache):
        b, cfg = self.backend, self.config
        if not layer.plain_qkv:
            if h is None:
                x = b.rms_norm(residual, layer.input_norm, cfg.rms_norm_eps)
            else:
                x = b.add_rms_norm(h, residual, layer.input_norm, cfg.rms_norm_eps)
            return self._qkv_with_bias_or_norm(layer, x, index, inputs, cache)
        # residual += h, norm, QKV projection, RoPE, K/V into the paged cache (one op: a
        # backend may fuse it).  q, k, v are views into the projection (rows strided, each row
        # contiguous): every backend op accepts them, and three copy kernels per layer are saved
        return b.norm_qkv_rope_write_kv(h, residual, layer.input_norm, cfg.rms_norm_eps,
                                        layer.qkv, cfg.n_heads, inputs.positions, self.cos,
                                        self.sin, cache, inputs.block_table, index,
                                        inputs.slots)

    def _qkv_with_bias_or_norm(self, layer: LayerWeights, x, index: int, inputs, cache):
        """The QKV projection with its bias, each q and k head normalised when the family has
        q/k norms, then RoPE and the cache write (``rope_write_kv``)."""
        b, cfg = self.backend, self.config
        qkv = b.linear(x, layer.qkv, layer.qkv_bias)
        t, d = qkv.shape[0], cfg.head_dim
        q = qkv[:, :cfg.q_dim].view(t, cfg.n_heads, d)
        k = qkv[:, cfg.q_dim:cfg.q_dim + cfg.kv_dim].view(t, cfg.n_kv_heads, d)
        v = qkv[:, cfg.q_dim + cfg.kv_dim:].view(t, cfg.n_kv_heads, d)
        if layer.q_norm is not None:
            q = self._head_norm(q, layer.q_norm)
        if layer.k_norm is not None:
            k = self._head_norm(k, layer.k_norm)
        b.rope_write_kv(q, k, v, inputs.positions, self.cos, self.sin, cache,
                        inputs.block_table, index, inputs.slots)
        return q, k, v

    def _head_norm(self, x, weight):
        """RMSNorm over each head of x [T, heads, D] (weight [D]): a new [T, heads, D]."""
        t, heads, d = x.shape
        return self.backend.rms_norm(x.reshape(t * heads, d), weight,
                                     self.config.rms_norm_eps).view(t, heads, d)

    def _layer_epilogue(self, layer: LayerWeights, attn, residual):
        """residual += o_proj(attn); returns the MLP's output (None: already added)."""
        b, cfg = self.backend, self.config
        return b.o_proj_mlp(attn.reshape(attn.shape[0], -1), residual, layer.o, layer.post_norm,
                            cfg.rms_norm_eps, layer.gate_up, layer.down)

    def _logits(self, h, residual, rows: torch.Tensor | None):
        b, cfg = self.backend, self.config
        if rows is not None:            # only the rows that need logits (prefill: last tokens)
            h = None if h is None else h[rows]
            residual = residual[rows]
        # the last residual add (if not added yet) fused with the final norm: one kernel
        if h is None:
            x = b.rms_norm(residual, self.final_norm, cfg.rms_norm_eps)
        else:
            x = b.add_rms_norm(h, residual, self.final_norm, cfg.rms_norm_eps)
        # in the model's dtype: the samplers read it as it is (a float32 copy of a [B, vocab]
        # row costs as much as reading it), and a caller who keeps logits widens them
        return b.linear(x, self.lm_head)

    # ------------------------------------------------------------------------------------
    def _attention(self, q, k, v, index: int, inputs, cache):
        b = self.backend
        if inputs.reads_cached_context:         # a prefix found in the cache: read it there
            return b.prefill_attention_from_cache(q, cache, inputs.block_table, index, inputs,
                                                  self.scale)
        if inputs.is_prefill:
            return b.prefill_attention(q, k, v, inputs, self.scale)
        return b.decode_attention(q, cache, inputs.block_table, index, inputs.seq_lens,
                                  inputs.seq_slots, self.scale, inputs.max_seq_len)

    def forward(self, inputs, cache) -> torch.Tensor:
        """Run all layers for one step and return the logits (model dtype) for ``inputs.logit_rows``
        (all rows when None).  ``inputs`` (a ``StepInputs``) says whether the step is a prefill
        or a decode; ``cache`` (a ``PagedKVCache``) holds the K/V the layers write and read."""
        b = self.backend
        residual = b.embed(self.embed, inputs.token_ids)
        h = None
        for i, layer in enumerate(self.layers):
            q, k, v = self._layer_prologue(layer, h, residual, i, inputs, cache)
            attn = self._attention(q, k, v, i, inputs, cache)
            h = self._layer_epilogue(layer, attn, residual)
        return self._logits(h, residual, inputs.logit_rows)


def build_network(model, backend, max_positions: int) -> DecoderNetwork:
    """The network of a loaded model (``loading.Model``: its ``config``, HF-named ``weights``
    and packed ``packed`` tensors), on ``backend``: the config's family (``families/``) says
    which tensor fills each ``LayerWeights`` role.  The tensors are the model's own, not copies."""
    config = model.config
    family = family_of(config)
    tensors = {**model.weights, **model.packed}
    layers = []
    for i in range(config.num_hidden_layers):
        roles = {role: tensors[family.layer_name(i, name)]
                 for role, name in family.layer_roles.items()}
        layers.append(LayerWeights(**roles))
    embed = tensors[family.embed]
    backend.use_quantized_rows([(tensors[name], rows)
                                for name, rows in getattr(model, "quantized", {}).items()
                                if name in tensors])
    return DecoderNetwork(config, embed, tensors[family.final_norm],
                          tensors.get(family.lm_head, embed), layers, backend, max_positions)


__all__ = ["DecoderNetwork", "LayerWeights", "build_network"]
