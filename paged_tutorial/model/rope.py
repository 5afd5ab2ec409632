"""Rotary position embedding tables: cos and sin of position x inverse frequency.

The tables are float32 [max_positions, head_dim / 2]; every backend's ``rope`` op indexes them by
position.  The frequencies (default, linear and Llama-3 scaling) come from
``families/rope_scaling.py``, computed the way HF ``transformers`` computes them, so the engine
reproduces its rotations bit for bit on the CPU.
"""

from __future__ import annotations

import torch

from paged_tutorial.config import ModelConfig
from paged_tutorial.families.rope_scaling import inverse_frequencies


def rope_cos_sin(config: ModelConfig, max_positions: int, device="cpu"):
    """cos and sin of position * inverse frequency, float32 [max_positions, head_dim / 2]."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inverse_frequencies(config)[None, :]
    return freqs.cos().to(device), freqs.sin().to(device)
