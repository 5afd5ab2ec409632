"""The batched sampler (every row at once, no host reads) against the one-row-at-a-time rule."""

from __future__ import annotations

import torch

from paged_tutorial.backends.batched_sampling import sample_batched
from paged_tutorial.backends.sampling_rule import sample_reference


def test_every_row_picks_the_reference_token():
    g = torch.Generator().manual_seed(0)
    batch, vocab = 64, 300
    logits = torch.randn(batch, vocab, generator=g) * 3
    logits[3, 10] = logits[3, 20] = logits[3].max() + 1       # a tie for the maximum
    logits[5, :150] = float("-inf")                            # zero-probability ids
    logits[6] = 0.0                                            # all equal
    temperature = torch.rand(batch, generator=g) * 1.5
    temperature[::3] = 0.0                                     # greedy rows among sampled ones
    top_p = torch.rand(batch, generator=g) * 0.95 + 0.05
    top_p[::4] = 1.0
    uniforms = torch.rand(batch, generator=g)
    uniforms[7], uniforms[8] = 0.0, 1.0 - 2 ** -24             # the two ends
    for rows in (slice(None), slice(0, 1), slice(3, 9)):
        args = (logits[rows], temperature[rows], top_p[rows], uniforms[rows])
        assert torch.equal(sample_batched(*args), sample_reference(*args))
    assert sample_batched(logits, temperature, top_p, uniforms).dtype == torch.int64


def test_top_p_keeps_only_the_likely_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    picks = {int(sample_batched(logits, torch.ones(1), torch.tensor([0.7]), torch.tensor([u])))
             for u in torch.linspace(0, 0.999, 50).tolist()}
    assert picks == {0, 1}
