"""One sampled answer on the engine: its request, its stop rules, the text released so far.

``Answer`` is the output-processing layer shared by ``LLM`` and the server.  It queues one
request with ``Engine.add_request`` and receives its tokens through the engine's ``on_token``
callback, which runs in the thread stepping the engine, after each step has committed:

- a token in ``stop_token_ids`` ends the answer (its own text is not shown);
- the text goes through ``StopText``, which holds back what may begin a stop string and cuts
  the answer before the first stop string found;
- an answer that stops is cancelled at once (``Engine.cancel``: allowed inside a callback), so
  its blocks go back to ``free_blocks`` before the next step, and its ``finish_reason`` is
  ``"stop"``;
- ``min_tokens``: until that many tokens were generated, the ``stop_token_ids`` cannot be
  sampled (a logits processor masks them; the engine masks end-of-sequence itself) and stop
  strings are not looked for (vLLM's rule).

``on_delta(answer, text)`` is told about every piece of text that can be shown; ``finish()``
takes the engine's result once the request has ended and builds the ``CompletionOutput``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from paged_tutorial.engine.sampling_params import SamplingParams
from paged_tutorial.serving.outputs import FINISH_REASON_OF_ENGINE, CompletionOutput, \
    position_logprobs
from paged_tutorial.serving.stop_text import StopText


class Answer:
    def __init__(self, engine, index: int, params: SamplingParams,
                 on_delta: Callable[["Answer", str], None] | None = None):
        self.engine = engine
        self.index = index
        self.params = params
        self.on_delta = on_delta
        self.stop_text = StopText(params.stop)
        self.stop_token_ids = frozenset(params.stop_token_ids)
        self.token_ids: list[int] = []
        self.stop_reason: int | str | None = None
        self.stopped = False
        self.request = None                      # the engine's Request, once submitted
        self.output: CompletionOutput | None = None   # once finished
        self.num_cached_tokens = 0               # prompt tokens found in the prefix cache
        self.result = None                       # the engine's GenerationResult, once finished

    def submit(self, prompt_ids: list[int], sample_key: int) -> None:
        """Queue the request; the engine samples, this answer applies the stop rules (and the
        caller makes one Answer per each of the n answers)."""
        processors = list(self.params.logits_processors or [])
        if self.params.min_tokens and self.stop_token_ids:
            processors.append(StopTokensBeforeMinTokens(self.stop_token_ids,
                                                        self.params.min_tokens))
        engine_params = replace(self.params, stop=None, stop_token_ids=None, n=1,
                                logits_processors=processors or None)
        self.request = self.engine.add_request(prompt_ids, engine_params, chat=False,
                                               on_token=self._on_token, sample_key=sample_key)

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def done(self) -> bool:
        """The engine has finished the request (its result is ready for ``finish``)."""
        return self.request is not None and self.request.finished

    def _on_token(self, request_id: int, token_id: int, piece: str) -> None:
        if self.stopped:
            return
        self.token_ids.append(token_id)
        if token_id in self.stop_token_ids:
            self.stopped, self.stop_reason = True, token_id
            shown = self.stop_text.flush()
        else:
            shown = self.stop_text.add(piece,
                                       look=len(self.token_ids) > self.params.min_tokens)
            if self.stop_text.stopped:
                self.stopped, self.stop_reason = True, self.stop_text.stop_reason
        if self.stopped:
            self.engine.cancel(request_id)
        if shown and self.on_delta is not None:
            self.on_delta(self, shown)

    def cancel(self) -> None:
        """Stop generating (a client went away); ``finish`` then says ``"abort"``."""
        if self.request is not None and not self.request.finished:
            self.engine.cancel(self.request_id)

    def finish(self) -> CompletionOutput:
        """Take the engine's result (the engine forgets the request) and build the output."""
        result = self.engine.pop_result(self.request_id)
        error = getattr(self.request, "callback_error", None)
        if error is not None:
            raise error
        if self.stopped:
            reason = "stop"
        else:
            reason = FINISH_REASON_OF_ENGINE[result.finish_reason]
            tail = self.stop_text.flush()
            if tail and self.on_delta is not None:
                self.on_delta(self, tail)
        logprobs = cumulative = None
        if result.logprobs is not None:       # those of this answer's tokens (a stop cuts it)
            rows = result.logprobs[:len(self.token_ids)]
            logprobs = position_logprobs(rows, self.engine.tokenizer)
            cumulative = float(sum(row[0][1] for row in rows))
        self.output = CompletionOutput(index=self.index, text=self.stop_text.text,
                                       token_ids=list(self.token_ids),
                                       cumulative_logprob=cumulative, logprobs=logprobs,
                                       finish_reason=reason, stop_reason=self.stop_reason,
                                       error=result.error)
        self.num_cached_tokens = result.num_cached_tokens
        self.result = result
        return self.output


class StopTokensBeforeMinTokens:
    """A logits processor: the stop token ids cannot be drawn before ``min_tokens`` tokens."""

    def __init__(self, stop_token_ids, min_tokens: int):
        self.stop_token_ids = sorted(stop_token_ids)
        self.min_tokens = min_tokens

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if len(output_token_ids) < self.min_tokens:
            ids = [t for t in self.stop_token_ids if t < logits.shape[-1]]
            logits[ids] = float("-inf")
        return logits
