"""The sampling rule, defined once, and the per-request random numbers it consumes.

Every backend picks the next token with the same rule, so that given the same logits and the
same uniform number it picks the same token:

1. ``temperature == 0``: greedy, the first index of the maximum logit (as ``torch.argmax``).
2. Otherwise ``p = softmax(logits / temperature)``.  Top-k (``top_k`` > 0) keeps token i when
   fewer than ``top_k`` tokens are strictly more likely; min-p (``min_p`` > 0) keeps it when
   ``p_i >= min_p * max(p)``.  Top-p then keeps token i of what is left when the mass of the
   kept tokens *strictly more likely* than i is below ``top_p`` times the kept mass (without
   top-k and min-p: below ``top_p``).  So ties are kept or dropped together, and the most
   likely token is always kept.  The kept probabilities are renormalised implicitly: the
   token is the smallest id i in the kept set whose cumulative kept mass (in token-id order)
   reaches ``u * kept_total``.

Walking the kept set in token-id order rather than sorted order is still exact sampling from
the top-p distribution, and it lets a GPU kernel avoid sorting the vocabulary.

The uniform ``u`` for a request's n-th generated token comes from a counter-based generator
keyed by (seed, request id, n): a request draws the same numbers whatever batch it shares,
whether or not it was preempted and recomputed, and on any backend.
"""

from __future__ import annotations

import numpy as np
import torch


def request_uniform(seed: int, request_id: int, token_index: int) -> float:
    """The uniform in [0, 1) for one request's token_index-th sampled token."""
    return float(np.random.default_rng([seed, request_id, token_index]).random())


def sample_reference(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                     uniforms: torch.Tensor, top_k: torch.Tensor | None = None,
                     min_p: torch.Tensor | None = None) -> torch.Tensor:
    """The rule above in plain torch (float32 math); logits [B, V] -> int64 [B].  ``top_k``
    (int) and ``min_p`` (float) per row are optional; 0 in a row keeps every token."""
    logits = logits.float()
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for b in range(logits.shape[0]):
        t = float(temperature[b])
        if t == 0.0:
            out[b] = torch.argmax(logits[b])
            continue
        p = torch.softmax(logits[b] / t, dim=-1)
        sorted_p, _ = torch.sort(p, descending=True)
        k = int(top_k[b]) if top_k is not None else 0
        m = float(min_p[b]) if min_p is not None else 0.0
        limit = float(top_p[b])
        if k > 0 or m > 0.0:                # top-k and min-p first, top-p over what they keep
            floor = sorted_p[min(k, sorted_p.numel()) - 1] if k > 0 else sorted_p[-1]
            floor = torch.maximum(floor, m * sorted_p[0])
            sorted_p = torch.where(sorted_p >= floor, sorted_p, torch.zeros_like(sorted_p))
            limit = limit * float(sorted_p.sum())
        mass_before = torch.cumsum(sorted_p, 0) - sorted_p          # exclusive prefix sums
        n_keep = int(((mass_before < limit) & (sorted_p > 0)).sum())
        threshold = sorted_p[max(n_keep - 1, 0)]
        kept = torch.where(p >= threshold, p, torch.zeros_like(p))
        cdf = torch.cumsum(kept, 0)
        target = float(uniforms[b]) * float(cdf[-1])
        idx = int(torch.searchsorted(cdf, torch.tensor([target], device=cdf.device)).item())
        # cdf[idx] >= target; step over zero-probability ids that share the same cdf value
        idx = min(idx, logits.shape[1] - 1)
        while kept[idx] == 0 and idx + 1 < logits.shape[1]:
            idx += 1
        out[b] = idx
    return out
