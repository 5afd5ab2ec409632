"""Tiny random Qwen2 and Qwen3 checkpoints built by HF transformers (the reference the engine's
Qwen families are held to), saved as a safetensors folder and rewritten as a llama.cpp GGUF."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.fixtures_loading import write_tiny_gguf

#: name -> (transformers class names, config kwargs).  Qwen3's head_dim is not
#: hidden_size / heads, as in the real Qwen3 checkpoints.
TINY_QWEN = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                   rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   tie_word_embeddings=False, rope_theta=1000000.0)),
}
#: the GGUF writer's tokenizer has 256 byte tokens, so the vocabulary is at least that
VOCAB = 320


def build_tiny_qwen(name: str, folder: Path, seed: int = 0, **changes):
    """A random HF ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` saved as safetensors in
    ``folder``; returns it (float32, eval mode).  Biases and norm weights are drawn away from
    HF's zeros and ones, so a missing bias or norm changes the tokens."""
    import transformers

    config_class, model_class, kwargs = TINY_QWEN[name]
    kwargs = {**kwargs, **changes}
    theta = kwargs.pop("rope_theta")
    kwargs.setdefault("initializer_range", 0.2)
    config = getattr(transformers, config_class)(
        vocab_size=VOCAB, max_position_embeddings=256, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, **kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif n.endswith(".bias"):
                p.uniform_(-0.1, 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def write_qwen_gguf(path: Path, folder: Path, name: str) -> Path:
    """The folder's checkpoint as a GGUF of architecture ``name`` (llama.cpp's tensor names:
    ``blk.N.attn_q.bias``, ``blk.N.attn_q_norm.weight``, ...; F32)."""
    import paged_tutorial as pt

    return write_tiny_gguf(path, pt.load_model(str(folder), dtype="float32"),
                           architecture=name)


def hf_greedy(hf_model, ids: list[int], n: int) -> list[int]:
    device = next(hf_model.parameters()).device
    x = torch.tensor([ids], device=device)
    out = hf_model.generate(x, max_new_tokens=n, do_sample=False,
                            attention_mask=torch.ones_like(x), pad_token_id=0)
    return out[0, len(ids):].tolist()
