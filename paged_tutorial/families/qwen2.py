"""The Qwen2 family (``Qwen2ForCausalLM``, GGUF ``qwen2``; Qwen2.5 is this architecture too):
Llama's layer plus a bias on each of the q, k and v projections.  The three biases are stacked
like their weights, so the QKV projection stays one GEMM (with a bias).  llama.cpp keeps Qwen's
Q/K rows in Hugging Face's order (its RoPE for Qwen rotates halves), so nothing is un-permuted."""

from __future__ import annotations

from paged_tutorial.families import llama
from paged_tutorial.families.family import ModelFamily

QKV_BIASES = {
    "self_attn.q_proj.bias": lambda c: (c.q_dim,),
    "self_attn.k_proj.bias": lambda c: (c.kv_dim,),
    "self_attn.v_proj.bias": lambda c: (c.kv_dim,),
}
PACKED_QKV_BIAS = {"self_attn.qkv_proj.bias": tuple(QKV_BIASES)}

QWEN2 = ModelFamily(
    name="qwen2", hf_architecture="Qwen2ForCausalLM", model_type="qwen2",
    gguf_architecture="qwen2", embed=llama.EMBED, final_norm=llama.FINAL_NORM,
    lm_head=llama.LM_HEAD, layer_tensors={**llama.LAYER_TENSORS, **QKV_BIASES},
    layer_prefix=llama.LAYER_PREFIX, gguf_global_names=llama.GGUF_GLOBAL_NAMES,
    gguf_layer_names=llama.GGUF_LAYER_NAMES, gguf_rope_rows_interleaved=False,
    packed_modules={**llama.PACKED_MODULES, **PACKED_QKV_BIAS},
    layer_roles={**llama.LAYER_ROLES, "qkv_bias": "self_attn.qkv_proj.bias"})
