"""The sampling rule of ``backends/sampling_rule.py`` for every row at once, in torch ops on the device.

``sample_reference`` (``backends/sampling_rule.py``) is the rule one row at a time: it reads each row's
temperature on the host, so on a GPU every row costs a device-to-host sync.  ``sample_batched``
computes the same token for every row with a fixed number of tensor ops and no host reads
(so a CUDA graph can capture it): greedy rows take the argmax, the others the top-p draw, and
a ``torch.where`` picks per row.  The torch backend uses it on a GPU; the tests check it
against ``sample_reference`` row for row.
"""

from __future__ import annotations

import torch


def sample_batched(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                   uniforms: torch.Tensor, top_k: torch.Tensor | None = None,
                   min_p: torch.Tensor | None = None) -> torch.Tensor:
    """float32 logits [B, V] -> int64 [B], the token ``sample_reference`` picks per row
    (``top_k`` int and ``min_p`` float per row are optional; 0 keeps every token)."""
    logits = logits.float()
    vocab = logits.shape[1]
    greedy = temperature == 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    p = torch.softmax(logits / t[:, None], dim=-1)
    sorted_p, _ = torch.sort(p, dim=-1, descending=True)
    limit = top_p[:, None]
    if top_k is not None or min_p is not None:    # top-k and min-p first, top-p over the rest
        top_k = torch.zeros_like(temperature, dtype=torch.int64) if top_k is None \
            else top_k.to(torch.int64)
        min_p = torch.zeros_like(temperature) if min_p is None else min_p.float()
        filtered = (top_k > 0) | (min_p > 0)
        kth = torch.where(top_k > 0, top_k.clamp(max=vocab) - 1, vocab - 1)
        floor = torch.maximum(sorted_p.gather(1, kth[:, None]), min_p[:, None] * sorted_p[:, :1])
        sorted_p = torch.where(sorted_p >= floor, sorted_p, torch.zeros_like(sorted_p))
        limit = torch.where(filtered[:, None], limit * sorted_p.sum(dim=-1, keepdim=True), limit)
    mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p        # exclusive prefix sums
    n_keep = ((mass_before < limit) & (sorted_p > 0)).sum(dim=-1)
    threshold = sorted_p.gather(1, (n_keep - 1).clamp(min=0)[:, None])
    kept = torch.where(p >= threshold, p, torch.zeros_like(p))
    cdf = torch.cumsum(kept, dim=-1)
    target = uniforms[:, None] * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target).clamp(max=vocab - 1)      # [B, 1]
    # from idx on, the first id with kept mass (cdf ties at zero-probability ids), else the last
    ids = torch.arange(vocab, device=logits.device)
    candidates = torch.where((kept > 0) & (ids >= idx), ids, vocab - 1)
    drawn = candidates.min(dim=-1).values
    return torch.where(greedy, torch.argmax(logits, dim=-1), drawn)
