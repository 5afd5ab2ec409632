"""A batch's ``LogitsControls`` (``backends/logits_controls.py``), built from its requests.

Only a batch in which some request needs more than temperature and top_p gets controls
(``SamplingParams.needs_sampling_controls``); the others are sampled by the backend's own
sampler (and, at decode, replayed in CUDA graphs).  The tensors are built on the host from each
request's parameters and tokens and copied to the device once per step:

- top-k / min-p per row, when a sampling request of the batch narrows its draw;
- penalties per row, with ``seen`` (prompt and answer tokens) and ``output_counts`` (answer
  tokens counted), when some request sets one;
- ``banned``: the end-of-sequence ids of each request that has generated fewer than its
  ``min_tokens`` (and does not ignore end-of-sequence);
- each request's logits processors with the tokens it generated so far;
- ``num_logprobs``: the most any request of the batch asks for (each keeps its own count).
"""

from __future__ import annotations

import torch

from paged_tutorial.backends.logits_controls import LogitsControls, RowProcessors
from paged_tutorial.engine.request import Request


def sampling_controls(requests: list[Request], device: torch.device, vocab_size: int,
                      eos_token_ids) -> LogitsControls | None:
    """The controls of a batch of ``requests`` (row i is request i), or None when none of
    them needs any."""
    params = [r.params for r in requests]
    if not any(p.needs_sampling_controls for p in params):
        return None
    controls = LogitsControls()
    if any(p.filters_vocabulary for p in params):
        controls.top_k = torch.tensor([p.top_k for p in params], device=device)
        controls.min_p = torch.tensor([p.min_p for p in params], device=device,
                                      dtype=torch.float32)
    penalized = [p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty
                 for p in params]
    if any(penalized):
        _add_penalties(controls, requests, penalized, device, vocab_size)
    eos = sorted(int(t) for t in eos_token_ids if 0 <= int(t) < vocab_size)
    short = [len(r.output_ids) < r.params.min_tokens and not r.params.ignore_eos
             for r in requests]
    if eos and any(short):
        banned = torch.zeros(len(requests), vocab_size, dtype=torch.bool)
        banned[torch.tensor([i for i, s in enumerate(short) if s])[:, None],
               torch.tensor(eos)[None, :]] = True
        controls.banned = banned.to(device)
    controls.processors = [RowProcessors(i, r.params.logits_processors, r.output_ids)
                           for i, r in enumerate(requests) if r.params.logits_processors]
    asked = [p.logprobs for p in params if p.logprobs is not None]
    controls.num_logprobs = max(asked) if asked else None
    return controls


def _add_penalties(controls: LogitsControls, requests: list[Request], penalized: list[bool],
                   device: torch.device, vocab_size: int) -> None:
    """Penalty factors per row ([B, 1]) and the token statistics they read ([B, V])."""
    def column(name):
        return torch.tensor([[getattr(r.params, name)] for r in requests],
                            dtype=torch.float32, device=device)
    counts = torch.zeros(len(requests), vocab_size, dtype=torch.float32)
    seen = torch.zeros(len(requests), vocab_size, dtype=torch.bool)
    for i, (request, on) in enumerate(zip(requests, penalized)):
        if not on:
            continue
        output = torch.tensor(request.output_ids, dtype=torch.int64)
        counts[i] = torch.bincount(output, minlength=vocab_size)[:vocab_size].float()
        seen[i, torch.tensor(request.prompt_ids, dtype=torch.int64)] = True
        seen[i, output] = True
    controls.output_counts, controls.seen = counts.to(device), seen.to(device)
    if any(r.params.repetition_penalty != 1.0 for r in requests):
        controls.repetition_penalty = column("repetition_penalty")
    if any(r.params.frequency_penalty for r in requests):
        controls.frequency_penalty = column("frequency_penalty")
    if any(r.params.presence_penalty for r in requests):
        controls.presence_penalty = column("presence_penalty")
