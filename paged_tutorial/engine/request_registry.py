"""The requests an engine holds and their results.

A request is registered when it is queued and kept until its result is taken: ``generate``
and streams take theirs; a caller of ``add_request`` takes it with ``pop_result``.  So a
long-lived engine's memory stays bounded by what is running plus what is not collected yet.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from paged_tutorial.engine.interrupts import SIGNALS
from paged_tutorial.engine.request import Request
from paged_tutorial.engine.sampling_params import is_integer


@dataclass
class GenerationResult:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]                 # generated ids only (an EOS that ended it included)
    text: str                            # exactly the concatenation of the streamed pieces
    finish_reason: str                   # eos | length | max_seq_len | cancelled | error |
    #                                      non_finite (see ``error``)
    num_preemptions: int = 0
    seed: int | None = None
    time_to_first_token_s: float | None = None
    total_time_s: float | None = None
    decode_tokens_per_s: float | None = None
    num_cached_tokens: int = 0           # prompt tokens served from shared prefix blocks
    error: str | None = None             # what went wrong (finish_reason error / non_finite)
    #: with params.logprobs: per generated token, (token id, logprob, rank) of that token, then
    #: of the most likely ones (``backends/logprobs.py``); and their sum
    logprobs: list | None = None
    cumulative_logprob: float | None = None
    prompt_logprobs: list | None = None  # with params.prompt_logprobs: None, then per token
    #: host clock (time.perf_counter) instants: queued, first admitted, first token, finished
    arrival_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

    @classmethod
    def of(cls, r: Request) -> "GenerationResult":
        """The result of ``r`` so far (finish_reason "running" while it runs)."""
        decode_tps = None
        if r.first_token_time and r.finish_time and len(r.output_ids) > 1:
            span = r.finish_time - r.first_token_time
            decode_tps = (len(r.output_ids) - 1) / span if span > 0 else None
        return cls(
            request_id=r.request_id, prompt_token_ids=list(r.prompt_ids),
            token_ids=list(r.output_ids), text=r.text,
            finish_reason=r.finish_reason or "running", num_preemptions=r.num_preemptions,
            seed=r.params.seed,
            time_to_first_token_s=(r.first_token_time - r.arrival_time)
            if r.first_token_time else None,
            total_time_s=(r.finish_time - r.arrival_time) if r.finish_time else None,
            decode_tokens_per_s=decode_tps, num_cached_tokens=r.num_cached_tokens or 0,
            error=r.error, logprobs=None if r.logprobs is None else list(r.logprobs),
            cumulative_logprob=r.cumulative_logprob, prompt_logprobs=r.prompt_logprobs,
            arrival_time=r.arrival_time, first_scheduled_time=r.first_scheduled_time,
            first_token_time=r.first_token_time, finish_time=r.finish_time)


class RequestRegistry:
    """request id -> Request, for the requests whose result has not been taken."""

    def __init__(self):
        self.requests: dict[int, Request] = {}
        self.ids = itertools.count()

    def new_id(self) -> int:
        return next(self.ids)

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request

    def get(self, request_id: int) -> Request:
        request = self.requests.get(request_id) if is_integer(request_id) else None
        if request is None:
            raise ValueError(f"no request with id {request_id!r} here (ids are given by "
                             "add_request; generate() and finished streams forget theirs)")
        return request

    def holds(self, request: Request) -> bool:
        return self.requests.get(request.request_id) is request

    def forget(self, requests: list[Request]) -> None:
        with SIGNALS.critical():
            for request in requests:
                self.requests.pop(request.request_id, None)

    def __len__(self) -> int:
        return len(self.requests)

    def result(self, request_id: int) -> GenerationResult:
        return GenerationResult.of(self.get(request_id))

    def pop_result(self, request_id: int) -> GenerationResult:
        request = self.get(request_id)
        if not request.finished:
            raise ValueError(f"request {request_id} is still {request.status.value}: step the "
                             "engine until it finishes, or cancel() it, before pop_result()")
        self.forget([request])
        return GenerationResult.of(request)
