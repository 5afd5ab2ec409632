"""How far a result is from its reference."""

from __future__ import annotations


def rel_err(a, b) -> float:
    """||a - b|| / ||b||, both taken as float32 tensors."""
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())
