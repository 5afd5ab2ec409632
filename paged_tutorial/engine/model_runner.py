"""ModelRunner: turns a scheduled batch into device inputs, runs the network, samples.

A step's inputs are one ``StepInputs`` (``step_inputs.py``), sent to the device in one
copy.  For a prefill it packs the new tokens of every admitted request into one batch
(positions from each request's ``num_computed_tokens``, the slot of every token, ``cu_seqlens``
boundaries) and asks for logits at each sequence's last row only.  A request admitted with part
of its prompt found in the prefix cache starts at that ``num_computed_tokens``; its attention
reads the cached part from the paged cache.  For a decode it takes each running request's last
token, position, slot and sampling parameters from the batch's ``DecodeRows`` (kept by the
scheduler from one step to the next, ``decode_rows.py``) and replays a captured CUDA graph
when the engine has them (``cuda_graphs.py``), else runs the layers eagerly.  Sampling follows ``backends/sampling_rule.py``'s rule with each request's own random
stream, so a request gets the same tokens whatever batch it shares.  A batch in which some
request narrows its draw with ``top_k`` or ``min_p`` runs eagerly and is sampled by
``backends/batched_sampling.py`` (the same rule in torch ops, on any device), whatever the
backend's own sampler supports.

The runner changes nothing but the cache's K/V contents: tokens are appended and requests
finished by the scheduler, after the step has succeeded.

``phase_seconds`` says where the last ``run`` spent its time, on the host's clock: ``inputs``
(packing the step and syncing the block table), ``forward`` (the layers; on a GPU, the time to
enqueue their kernels), ``sample`` (sampling and reading the tokens back: on a GPU, this is
where the host waits for the kernels still running), or ``graph`` for a replayed decode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.batched_sampling import sample_batched
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.model.decoder import build_network
from paged_tutorial.loading.models import Model
from paged_tutorial.engine.decode_rows import DecodeRows
from paged_tutorial.engine.request import Request, RequestError
from paged_tutorial.backends.sampling_rule import request_uniform
from paged_tutorial.step_inputs import StepInputPacker, StepInputs
from paged_tutorial.engine.scheduler import ScheduledBatch


class ModelRunner:
    def __init__(self, model: Model, backend: Backend, cache: PagedKVCache, max_slots: int,
                 max_seq_len: int, cuda_graphs: bool = False):
        self.model = model
        self.backend = backend
        self.cache = cache
        self.max_seq_len = max_seq_len
        self.device = backend.device
        self.network = build_network(model, backend, max_positions=max_seq_len)
        #: builds each step's ``StepInputs``; counts its packs and host-to-device copies
        self.packer = StepInputPacker(self.device)
        #: host seconds of the last ``run``, per phase (see the module docstring)
        self.phase_seconds: dict[str, float] = {}
        self.graphs = None
        if cuda_graphs:
            from paged_tutorial.engine.cuda_graphs import DecodeGraphs
            self.graphs = DecodeGraphs(self.network, cache, max_slots)

    # --- inputs ----------------------------------------------------------------------------
    @staticmethod
    def sampling_inputs(requests: list[Request]):
        """Host lists (temperature, top_p, uniform) per request.  Greedy requests get
        temperature 0 and never use their uniform, so it is not drawn for them."""
        temperature = [r.params.effective_temperature for r in requests]
        return (temperature, [r.params.top_p for r in requests],
                ModelRunner.uniforms(requests, temperature))

    @staticmethod
    def uniforms(requests: list[Request], temperature: list[float]) -> list[float]:
        """Each request's uniform for its next token, 0.0 for the greedy ones (temperature
        0), whose uniform is not drawn."""
        return [ModelRunner.uniform(r) if t > 0 else 0.0 for r, t in zip(requests, temperature)]

    @staticmethod
    def uniform(request: Request) -> float:
        """The request's uniform for its next token; a RequestError names the request if its
        stream cannot be drawn (its seed or sample_key was changed after validation)."""
        try:
            return request_uniform(request.params.seed, request.sample_key,
                                   len(request.output_ids))
        except Exception as exc:
            raise RequestError(request, exc) from exc

    def prefill_inputs(self, requests: list[Request]) -> StepInputs:
        """The tokens of each request whose K/V are not computed yet (a recomputed, preempted,
        request replays what it generated), after its ``num_computed_tokens``."""
        return self.packer.prefill([r.all_ids[r.num_computed_tokens:] for r in requests],
                                   [r.num_computed_tokens for r in requests],
                                   [r.slot for r in requests], self.cache.device_block_table(),
                                   self.sampling_inputs(requests))

    @staticmethod
    def decode_rows(requests: list[Request]) -> tuple[list[int], list[int], list[int]]:
        """Host lists (last token, its position, cache slot) per running request."""
        return ([r.output_ids[-1] for r in requests], [r.num_computed_tokens for r in requests],
                [r.slot for r in requests])

    def decode_inputs(self, requests: list[Request]) -> StepInputs:
        """Each running request's last token, at its next position."""
        return self.packer.decode(*self.decode_rows(requests), self.cache.device_block_table(),
                                  self.sampling_inputs(requests))

    # --- one step --------------------------------------------------------------------------
    def run(self, batch: ScheduledBatch) -> RunOutput:
        """Run the batch: one sampled token per request, the logits, and whether each row of
        logits is finite (read back with the tokens)."""
        requests = batch.requests
        t0 = time.perf_counter()
        if batch.kind == "decode":
            rows = batch.rows if batch.rows is not None else DecodeRows.of(requests)
            sampling = (rows.temperature, rows.top_p,
                        self.uniforms(requests, rows.temperature) if rows.samples
                        else [0.0] * len(requests))
            filtered = rows.filters
            if self.graphs is not None and not filtered:
                logits, next_ids, finite = self.graphs.run(rows.token_ids, rows.positions,
                                                           rows.slots, *sampling)
                self.phase_seconds = {"graph": time.perf_counter() - t0}
                return RunOutput(next_ids, logits, finite)
            inputs = self.packer.decode(rows.token_ids, rows.positions, rows.slots,
                                        self.cache.device_block_table(), sampling)
        else:
            filtered = any(r.params.filters_vocabulary for r in requests)
            inputs = self.prefill_inputs(requests)
        t1 = time.perf_counter()
        logits = self.network.forward(inputs, self.cache)
        t2 = time.perf_counter()
        if filtered:
            next_ids = sample_batched(
                logits, inputs.temperature, inputs.top_p, inputs.uniforms,
                top_k=torch.tensor([r.params.top_k for r in requests], device=logits.device),
                min_p=torch.tensor([r.params.min_p for r in requests], device=logits.device,
                                   dtype=torch.float32))
        else:
            next_ids = self.backend.sample(logits, inputs.temperature, inputs.top_p,
                                           inputs.uniforms)
        tokens, finite = read_back(next_ids, torch.isfinite(logits).all(dim=-1))
        self.phase_seconds = {"inputs": t1 - t0, "forward": t2 - t1,
                              "sample": time.perf_counter() - t2}
        return RunOutput(tokens, logits, finite)


@dataclass
class RunOutput:
    """What one model run gives the engine."""
    token_ids: list[int]                 # one sampled token per request
    logits: torch.Tensor                 # [B, V] in the model dtype
    finite: list[bool]                   # row b of logits holds no NaN or inf


def read_back(token_ids: torch.Tensor, finite: torch.Tensor) -> tuple[list[int], list[bool]]:
    """The sampled ids and the finite flags as host lists, in one device-to-host copy when
    both live on the same device (the flags ride along with the read the step makes anyway)."""
    if token_ids.device == finite.device:
        both = torch.cat([token_ids.reshape(-1).long(), finite.long()]).tolist()
        n = len(both) // 2
        return [int(t) for t in both[:n]], [bool(f) for f in both[n:]]
    return [int(t) for t in token_ids.tolist()], [bool(f) for f in finite.tolist()]
