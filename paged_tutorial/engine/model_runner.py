"""ModelRunner: turns a scheduled batch into device inputs, runs the network, samples.

For a prefill it packs the new tokens of every admitted request into one batch (positions from
each request's ``num_computed_tokens``, the slot of every token, ``cu_seqlens`` boundaries) and asks for
logits at each sequence's last row only.  A request admitted with part of its prompt found in
the prefix cache starts at that ``num_computed_tokens``; its attention reads the cached part from the
paged cache.  For a decode it takes each running request's last
token and replays a captured CUDA graph when the engine has them (``cuda_graphs.py``), else runs
the layers eagerly.  Sampling follows ``sampling.py``'s rule with each request's own random
stream, so a request gets the same tokens whatever batch it shares.

The runner changes nothing but the cache's K/V contents: tokens are appended and requests
finished by the scheduler, after the step has succeeded.
"""

from __future__ import annotations

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.model.llama import Llama
from paged_tutorial.loading.models import Model
from paged_tutorial.engine.request import Request
from paged_tutorial.model.sampling import request_uniform
from paged_tutorial.engine.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model: Model, backend: Backend, cache: PagedKVCache, max_slots: int,
                 max_seq_len: int, cuda_graphs: bool = False):
        self.backend = backend
        self.cache = cache
        self.device = backend.device
        self.llama = Llama(model, backend, max_positions=max_seq_len)
        self.graphs = None
        if cuda_graphs:
            from paged_tutorial.engine.cuda_graphs import DecodeGraphs
            self.graphs = DecodeGraphs(self.llama, cache, max_slots)

    # --- inputs ----------------------------------------------------------------------------
    def _ints(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(self.device)

    @staticmethod
    def sampling_inputs(requests: list[Request]):
        """Host lists (temperature, top_p, uniform) per request.  Greedy requests get
        temperature 0 and never use their uniform, so it is not drawn for them."""
        temperature = [r.params.effective_temperature for r in requests]
        return (temperature, [r.params.top_p for r in requests],
                [request_uniform(r.params.seed, r.sample_key, len(r.output_ids)) if t > 0
                 else 0.0 for r, t in zip(requests, temperature)])

    def prepare_prefill(self, requests: list[Request]):
        """(token ids, positions, slots, cu_seqlens, last rows) of the tokens whose K/V are
        not cached yet: a recomputed (preempted) request replays what it generated."""
        tokens, positions, slots, cu_seqlens, last_rows = [], [], [], [0], []
        for r in requests:
            new = r.all_ids[r.num_computed_tokens:]
            tokens += new
            positions += range(r.num_computed_tokens, r.total_len)
            slots += [r.slot] * len(new)
            cu_seqlens.append(cu_seqlens[-1] + len(new))
            last_rows.append(cu_seqlens[-1] - 1)
        return tokens, positions, slots, cu_seqlens, last_rows

    # --- one step --------------------------------------------------------------------------
    def run(self, batch: ScheduledBatch) -> tuple[list[int], torch.Tensor]:
        """Run the batch; return (one sampled token id per request, float32 logits [B, V])."""
        requests = batch.requests
        if batch.kind == "prefill":
            logits = self._prefill(requests)
            next_ids = None
        else:
            logits, next_ids = self._decode(requests)
        if next_ids is None:
            temperature, top_p, uniforms = (torch.tensor(x, dtype=torch.float32).to(self.device)
                                            for x in self.sampling_inputs(requests))
            next_ids = self.backend.sample(logits, temperature, top_p, uniforms).tolist()
        return [int(t) for t in next_ids], logits

    def _prefill(self, requests: list[Request]) -> torch.Tensor:
        tokens, positions, slots, cu_seqlens, last_rows = self.prepare_prefill(requests)
        block_table = self.cache.device_block_table()
        context = None
        if any(r.num_computed_tokens for r in requests):       # a prefix found in the cache
            context = ([r.num_computed_tokens for r in requests], [r.slot for r in requests])
        return self.llama.forward(
            self._ints(tokens), self._ints(positions), self._ints(slots), self.cache,
            block_table, prefill_cu_seqlens=cu_seqlens,
            logit_rows=torch.tensor(last_rows, device=self.device), prefill_context=context)

    def _decode(self, requests: list[Request]):
        """Returns (logits, sampled ids or None when the caller still has to sample)."""
        last_tokens = [r.output_ids[-1] for r in requests]
        positions = [r.num_computed_tokens for r in requests]
        slots = [r.slot for r in requests]
        if self.graphs is not None:
            return self.graphs.run(last_tokens, positions, slots,
                                   *self.sampling_inputs(requests))
        block_table = self.cache.device_block_table()
        logits = self.llama.forward(
            self._ints(last_tokens), self._ints(positions), self._ints(slots), self.cache,
            block_table, decode_seq_lens=self._ints([p + 1 for p in positions]))
        return logits, None
