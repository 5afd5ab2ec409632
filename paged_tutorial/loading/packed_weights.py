"""Packed projections: q/k/v as one matrix, gate/up as one matrix, each weight held once.

The forward pass multiplies a token's hidden state by q, k and v (and by gate and up) with one
GEMM each, so it wants each group stacked row-wise in one tensor (nano-vllm calls this
``packed_modules_mapping``; vLLM's ``QKVParallelLinear`` does the same).  Which tensors are
stacked is the model family's to say (``ModelFamily.packed_modules``: a Qwen2 stacks its q/k/v
biases too).  ``pack_weights`` builds the stacked tensor layer by layer and replaces every part
in the HF-named dict by a row *view* of it: ``weights["model.layers.0.self_attn.k_proj.weight"]``
still reads as before, but there is one copy of the numbers, not two (keeping both costs 2.4 GiB
for Llama-3.2-1B in float32: ``benchmarks/engine_memory.py``).
"""

from __future__ import annotations

import torch

from paged_tutorial.config import ModelConfig


def _set_views(weights: dict, packed: torch.Tensor, prefix: str, parts, rows: dict) -> None:
    start = 0
    for part in parts:
        n = rows[part]
        weights[prefix + part] = packed[start:start + n]
        start += n


def pack_weights(weights: dict[str, torch.Tensor], config: ModelConfig,
                 packed: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Stack every layer's parts into packed tensors and make ``weights``' parts views of them
    (``weights`` is changed in place).  With ``packed`` given (tensors already stacked, e.g.
    moved to another device), only the views are rebuilt from it.  Returns the packed dict,
    keyed by full name (``model.layers.3.self_attn.qkv_proj.weight``)."""
    family = config.family
    rows = family.packed_part_rows(config)
    out = {}
    for layer in range(config.num_hidden_layers):
        prefix = family.layer_prefix.format(i=layer)
        for name, parts in family.packed_modules.items():
            full = prefix + name
            if packed is not None:
                tensor = packed[full]
            else:
                # one layer at a time: the parts are released as their views replace them
                tensor = torch.cat([weights[prefix + p] for p in parts], dim=0).contiguous()
            _set_views(weights, tensor, prefix, parts, rows)
            out[full] = tensor
    return out


def pack_quantized_rows(rows: dict, config: ModelConfig) -> dict:
    """``rows`` (HF name -> ``gguf_rows.QuantizedRows``) with each packed group's parts stacked
    as ``pack_weights`` stacks the float tensors, under the packed name; a group whose parts
    are not all kept as rows of one kind is left out (its float tensor serves it)."""
    family = config.family
    out = {name: r for name, r in rows.items() if not is_packed_part(config, name)}
    for layer in range(config.num_hidden_layers):
        prefix = family.layer_prefix.format(i=layer)
        for name, parts in family.packed_modules.items():
            found = [rows.get(prefix + p) for p in parts]
            if all(r is not None for r in found) and len({r.kind for r in found}) == 1:
                out[prefix + name] = type(found[0]).stack(found)
    return out


def is_packed_part(config: ModelConfig, name: str) -> bool:
    """Is ``name`` a view into one of ``config``'s family's packed tensors?"""
    return config.family.is_packed_part(name)
