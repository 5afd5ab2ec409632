"""What ``LLM.generate`` / ``LLM.chat`` return: vLLM's ``RequestOutput`` and ``CompletionOutput``.

One ``RequestOutput`` per prompt, with one ``CompletionOutput`` per sampled answer
(``SamplingParams.n``).  ``finish_reason`` takes vLLM's values:

- ``"stop"``: an end-of-sequence token, a ``stop_token_ids`` token or a ``stop`` string ended
  the answer (``stop_reason`` says which: None for end-of-sequence, the token id, or the
  string);
- ``"length"``: ``max_tokens`` reached, or the engine's ``max_seq_len``;
- ``"abort"``: the request was cancelled before it finished (a server client went away);
- ``"error"``: the engine could not go on with this request (``error`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: the engine's finish reasons (``engine/request.py``) in vLLM's words
FINISH_REASON_OF_ENGINE = {"eos": "stop", "length": "length", "max_seq_len": "length",
                           "cancelled": "abort", "error": "error", "non_finite": "error"}


@dataclass
class CompletionOutput:
    index: int                          # which of the prompt's n answers
    text: str
    token_ids: list[int]                # every generated id (the one that stopped it included)
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
