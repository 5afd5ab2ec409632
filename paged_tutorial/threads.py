"""How many CPU threads torch uses: chosen once, before a model loads."""

from __future__ import annotations


def configure_threads(threads: int | None = None) -> int:
    """Use ``threads`` CPU threads for torch's operations when given; return the number in
    use."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
