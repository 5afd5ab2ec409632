"""A checkpoint's RoPE frequencies: default, linear and Llama-3 (``llama3``) scaling.

The inverse frequencies are computed the way HF ``transformers`` computes them (same float32
operations).  The forward pass builds its cos/sin tables from them (``model/rope.py``); the GGUF
loader recognises Llama 3's scaling in a file's ``rope_freqs`` tensor with
``llama3_rope_factors``.  Only config attributes are read (``head_dim``, ``rope_theta``,
``rope_type``, ``rope_scaling``).
"""

from __future__ import annotations

import math
from typing import Mapping

import torch


def inverse_frequencies(config) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (
        torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    rope_type = config.rope_type
    if rope_type == "default":
        return inv_freq
    params = dict(config.rope_scaling)
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        return llama3_inverse_frequencies(inv_freq, params)
    raise ValueError(f"unsupported RoPE type {rope_type!r}")


def llama3_inverse_frequencies(inv_freq: torch.Tensor, scaling: Mapping) -> torch.Tensor:
    """Llama 3's scaling of the inverse frequencies: wavelengths longer than the original
    context / ``low_freq_factor`` are stretched by ``factor``, those shorter than the original
    context / ``high_freq_factor`` are kept, and the band between is blended."""
    try:
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context = scaling["original_max_position_embeddings"]
    except KeyError as e:
        raise ValueError(f"rope_scaling of type llama3 lacks {e.args[0]!r}: it needs factor, "
                         "low_freq_factor, high_freq_factor and "
                         "original_max_position_embeddings") from None
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def llama3_rope_factors(theta: float, head_dim: int, scaling: Mapping) -> torch.Tensor:
    """How much Llama 3's scaling divides each inverse frequency by: the per-frequency factors
    llama.cpp's converter writes to a GGUF's ``rope_freqs.weight``, float64
    [head_dim / 2]."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return inv_freq / llama3_inverse_frequencies(inv_freq, scaling)
