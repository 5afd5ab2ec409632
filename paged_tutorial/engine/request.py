"""One request: its prompt, its sampling parameters and everything that changes as it runs.

A request moves WAITING -> RUNNING (admitted into a slot, prefilled) -> FINISHED, and back from
RUNNING to WAITING when it is preempted (its blocks are freed and it is recomputed later, prompt
plus the tokens it has generated).  Only the scheduler changes ``status``, ``slot`` and
``num_computed_tokens``; only the scheduler's ``postprocess`` appends tokens.

Text: the engine feeds every generated id through an incremental detokenizer and keeps the
pieces in ``text_pieces``; when the request finishes, whatever the detokenizer still holds (the
bytes of a character cut in half by the last token) is flushed as one last piece.  The streamed
text and ``GenerationResult.text`` are both ``"".join(text_pieces)``, so they cannot differ.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable

from paged_tutorial.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


#: the finish_reason of a request whose logits went non-finite (NaN or inf): no token is
#: appended from them, and ``error`` names the layer where its activations first went
#: non-finite (``numerical_faults.py``)
NON_FINITE = "non_finite"
#: every finish_reason a result can carry ("running" while it is not finished)
FINISH_REASONS = ("eos", "length", "max_seq_len", "cancelled", "error", NON_FINITE)


class RequestError(Exception):
    """One request cannot go on for a reason of its own (its random stream cannot be drawn, its
    tokens cannot be detokenized): the engine finishes that request with ``finish_reason
    "error"`` (the message in ``GenerationResult.error``) and serves the others."""

    def __init__(self, request: "Request", cause: BaseException):
        super().__init__(f"request {request.request_id}: {type(cause).__name__}: {cause}")
        self.request = request


@dataclass(eq=False)
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    sample_key: int = 0                  # keys the random stream together with params.seed
    on_token: Callable | None = None     # on_token(request_id, token_id, text_piece)
    # --- state -------------------------------------------------------------------------
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    slot: int | None = None
    num_computed_tokens: int = 0         # tokens whose K/V are in the cache (computed or hit)
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache at its
                                          # first admission (None until admitted)
    block_hashes: list[int] | None = None  # keys of the prompt's full blocks, hashed once by
                                           # the prefix cache at the first admission check
    finish_reason: str | None = None
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_scheduled_time: float | None = None   # its first admission into a slot
    first_token_time: float | None = None
    finish_time: float | None = None
    detokenizer: object | None = None    # incremental detokenizer, None without a tokenizer
    text_pieces: list[str] = field(default_factory=list)
    callback_error: BaseException | None = None   # raised by on_token; re-raised by its caller
    error: str | None = None             # why it finished with finish_reason "error"
    # --- logprobs (params.logprobs / prompt_logprobs; ``backends/logprobs.py``) ------------
    #: per generated token: (token id, logprob, rank) of that token, then of the top ones
    logprobs: list[list[tuple[int, float, int]]] | None = None
    cumulative_logprob: float | None = None   # the sum of the generated tokens' logprobs
    #: None for the first prompt token, then one entry like ``logprobs``'s per prompt token
    prompt_logprobs: list | None = None

    def __post_init__(self):
        # stop strings, stop tokens and n answers are applied by pt.LLM and the server
        # (serving/answers.py), around the engine: refused here rather than ignored
        params = self.params
        if params.stop or params.stop_token_ids or params.n != 1:
            raise ValueError("stop, stop_token_ids and n are applied by pt.LLM (and the "
                             "server), not by Engine: use pt.LLM(model).generate(...), or "
                             "leave them out of the SamplingParams given to the Engine")
        if params.logprobs is not None:
            self.logprobs, self.cumulative_logprob = [], 0.0
        if params.prompt_logprobs is not None:
            # every prompt token's logits are needed: none of its blocks is taken from (or
            # given to) the prefix cache, which keys them by these hashes
            self.block_hashes = []

    def record_logprobs(self, sampled: list[tuple[int, float, int]] | None,
                        prompt: list | None) -> None:
        """Keep the logprobs of the token just appended (``sampled``: the chosen token first,
        then the batch's top ones, cut to this request's count) and, after its first prefill,
        of its prompt."""
        if prompt is not None and self.prompt_logprobs is None:
            k = self.params.prompt_logprobs
            self.prompt_logprobs = [None if row is None else row[:1 + k] for row in prompt]
        if sampled is not None and self.logprobs is not None:
            self.logprobs.append(sampled[:1 + self.params.logprobs])
            self.cumulative_logprob += sampled[0][1]

    # --- read-only views -----------------------------------------------------------------
    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def text(self) -> str:
        return "".join(self.text_pieces)

    def __repr__(self) -> str:
        return (f"Request(id={self.request_id}, {self.status.value}, slot={self.slot}, "
                f"prompt={len(self.prompt_ids)} tokens, generated={len(self.output_ids)}, "
                f"computed={self.num_computed_tokens}, finish_reason={self.finish_reason})")
