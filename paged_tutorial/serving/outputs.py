"""What ``LLM.generate`` / ``LLM.chat`` return: vLLM's ``RequestOutput`` and ``CompletionOutput``.

One ``RequestOutput`` per prompt, with one ``CompletionOutput`` per sampled answer
(``SamplingParams.n``).  ``finish_reason`` takes vLLM's values:

- ``"stop"``: an end-of-sequence token, a ``stop_token_ids`` token or a ``stop`` string ended
  the answer (``stop_reason`` says which: None for end-of-sequence, the token id, or the
  string);
- ``"length"``: ``max_tokens`` reached, or the engine's ``max_seq_len``;
- ``"abort"``: the request was cancelled before it finished (a server client went away);
- ``"error"``: the engine could not go on with this request (``error`` says why).

Logprobs (``SamplingParams(logprobs=k)`` / ``prompt_logprobs=k``) take vLLM's shape: a list with
one dict per position, ``{token_id: Logprob(logprob, rank, decoded_token)}``, the chosen token
first and then the k most likely in order (k + 1 entries, or k when the chosen token is among
them); a prompt's list starts with None (nothing predicts its first token).  They are the
model's raw distribution (``backends/logprobs.py``).  ``RequestOutput.metrics`` carries vLLM's
``RequestMetrics`` times, in seconds since the epoch (``time.time()``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: the engine's finish reasons (``engine/request.py``) in vLLM's words
FINISH_REASON_OF_ENGINE = {"eos": "stop", "length": "length", "max_seq_len": "length",
                           "cancelled": "abort", "error": "error", "non_finite": "error"}


@dataclass
class Logprob:
    """One token's logprob at one position, and its rank (1: the most likely)."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


#: per position, token id -> Logprob (vLLM's ``SampleLogprobs``; prompts: None first)
PositionLogprobs = dict[int, Logprob]


def position_logprobs(rows, tokenizer) -> list[PositionLogprobs | None]:
    """The engine's (token id, logprob, rank) rows (``GenerationResult.logprobs``) as vLLM's
    list of dicts, each token decoded on its own."""
    def decoded(token_id: int) -> str | None:
        return None if tokenizer is None else tokenizer.decode([token_id],
                                                               skip_special_tokens=False)
    return [None if row is None else
            {token_id: Logprob(logprob, rank, decoded(token_id))
             for token_id, logprob, rank in row} for row in rows]


@dataclass
class RequestMetrics:
    """vLLM's ``RequestMetrics``: when a prompt's requests arrived, were first scheduled, gave
    their first and last token and finished (seconds since the epoch), and the time between
    arrival and the first scheduling."""
    arrival_time: float
    last_token_time: float | None
    first_scheduled_time: float | None
    first_token_time: float | None
    time_in_queue: float | None
    finished_time: float | None = None

    @classmethod
    def of(cls, results) -> "RequestMetrics":
        """From the engine's results of one prompt's answers (``GenerationResult``: host
        clock instants): the earliest arrival, scheduling and first token, the last finish."""
        to_epoch = time.time() - time.perf_counter()

        def first(name):
            times = [getattr(r, name) for r in results if getattr(r, name) is not None]
            return min(times) + to_epoch if times else None

        finished = [r.finish_time for r in results if r.finish_time is not None]
        finished_time = max(finished) + to_epoch if len(finished) == len(results) else None
        arrival, scheduled = first("arrival_time"), first("first_scheduled_time")
        return cls(arrival_time=arrival, last_token_time=finished_time,
                   first_scheduled_time=scheduled, first_token_time=first("first_token_time"),
                   time_in_queue=None if scheduled is None else scheduled - arrival,
                   finished_time=finished_time)


@dataclass
class CompletionOutput:
    index: int                          # which of the prompt's n answers
    text: str
    token_ids: list[int]                # every generated id (the one that stopped it included)
    cumulative_logprob: float | None = None   # the sum of the logprobs (with logprobs=k)
    logprobs: list[PositionLogprobs] | None = None   # one per token_ids entry (logprobs=k)
    finish_reason: str | None = None    # None while the answer is still being generated
    stop_reason: int | str | None = None
    error: str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None                  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0          # prompt tokens served from shared prefix blocks
    prompt_logprobs: list[PositionLogprobs | None] | None = None   # prompt_logprobs=k
    metrics: RequestMetrics | None = None
