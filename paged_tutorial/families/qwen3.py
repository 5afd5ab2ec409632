"""The Qwen3 family (``Qwen3ForCausalLM``, GGUF ``qwen3``): Llama's layer with no bias, an
explicit ``head_dim`` (not hidden_size / heads: 128 when config.json leaves it out, as
transformers assumes), and an RMSNorm over each head of q and of k (one weight of ``head_dim``
each, shared by the heads) between the projection and RoPE.  llama.cpp keeps Qwen's Q/K rows in
Hugging Face's order."""

from __future__ import annotations

from paged_tutorial.families import llama
from paged_tutorial.families.family import ModelFamily

QK_NORMS = {
    "self_attn.q_norm.weight": lambda c: (c.head_dim,),
    "self_attn.k_norm.weight": lambda c: (c.head_dim,),
}
GGUF_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}

QWEN3 = ModelFamily(
    name="qwen3", hf_architecture="Qwen3ForCausalLM", model_type="qwen3",
    gguf_architecture="qwen3", embed=llama.EMBED, final_norm=llama.FINAL_NORM,
    lm_head=llama.LM_HEAD, layer_tensors={**llama.LAYER_TENSORS, **QK_NORMS},
    layer_prefix=llama.LAYER_PREFIX, gguf_global_names=llama.GGUF_GLOBAL_NAMES,
    gguf_layer_names={**llama.GGUF_LAYER_NAMES, **GGUF_QK_NORMS},
    gguf_rope_rows_interleaved=False, packed_modules=llama.PACKED_MODULES,
    layer_roles={**llama.LAYER_ROLES, "q_norm": "self_attn.q_norm.weight",
                 "k_norm": "self_attn.k_norm.weight"},
    hf_defaults={"head_dim": 128})
