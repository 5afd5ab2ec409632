"""The Llama family (``LlamaForCausalLM``, GGUF ``llama``): the layout the other families start
from.  Per layer: RMSNorm, q/k/v projections without bias, RoPE, attention, o projection,
RMSNorm, SwiGLU MLP (gate, up, down).  llama.cpp's converter interleaves each head's Q and K
rows for its own RoPE; the loader puts them back."""

from __future__ import annotations

from paged_tutorial.families.family import ModelFamily

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
LAYER_PREFIX = "model.layers.{i}."

#: per-layer HF name -> shape for a config
LAYER_TENSORS = {
    "self_attn.q_proj.weight": lambda c: (c.q_dim, c.hidden_size),
    "self_attn.k_proj.weight": lambda c: (c.kv_dim, c.hidden_size),
    "self_attn.v_proj.weight": lambda c: (c.kv_dim, c.hidden_size),
    "self_attn.o_proj.weight": lambda c: (c.hidden_size, c.q_dim),
    "mlp.gate_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "mlp.up_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "mlp.down_proj.weight": lambda c: (c.hidden_size, c.intermediate_size),
    "input_layernorm.weight": lambda c: (c.hidden_size,),
    "post_attention_layernorm.weight": lambda c: (c.hidden_size,),
}

GGUF_GLOBAL_NAMES = {
    "token_embd.weight": EMBED,
    "output_norm.weight": FINAL_NORM,
    "output.weight": LM_HEAD,
}
GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

PACKED_MODULES = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}

LAYER_ROLES = {
    "input_norm": "input_layernorm.weight",
    "qkv": "self_attn.qkv_proj.weight",
    "o": "self_attn.o_proj.weight",
    "post_norm": "post_attention_layernorm.weight",
    "gate_up": "mlp.gate_up_proj.weight",
    "down": "mlp.down_proj.weight",
}

LLAMA = ModelFamily(
    name="llama", hf_architecture="LlamaForCausalLM", model_type="llama",
    gguf_architecture="llama", embed=EMBED, final_norm=FINAL_NORM, lm_head=LM_HEAD,
    layer_tensors=LAYER_TENSORS, layer_prefix=LAYER_PREFIX,
    gguf_global_names=GGUF_GLOBAL_NAMES, gguf_layer_names=GGUF_LAYER_NAMES,
    gguf_rope_rows_interleaved=True, packed_modules=PACKED_MODULES, layer_roles=LAYER_ROLES)
