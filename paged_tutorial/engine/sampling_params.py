"""How one request is sampled and when it stops: ``SamplingParams``, validated when it is made.

The field names and meanings are vLLM's, so a vLLM snippet's ``SamplingParams(...)`` runs here
unchanged.  Two defaults differ: ``temperature`` is 0 (greedy) and ``max_tokens`` 64.

Everything a caller can get wrong is refused here, before a request is queued, with a message
that names the argument, the value and the accepted range:

- ``max_tokens``: an integer from 1 to ``MAX_TOKENS_LIMIT`` (numpy integers are fine; floats,
  strings and bools are not: ``max_tokens=2.5`` would otherwise be silently truncated).
- ``temperature``: a finite number >= 0.  0 means greedy.  A positive temperature below
  ``GREEDY_BELOW`` is treated as greedy too: ``logits / 1e-39`` overflows to inf and the softmax
  to NaN, and a NaN distribution has no defined sample (vLLM uses the same cut-off).
- ``top_p``: in (0, 1].
- ``top_k``: an integer >= 1 keeps the k most likely tokens (ties at the k-th probability kept
  together); 0 or -1 keeps all.
- ``min_p``: in [0, 1]: keeps the tokens at least ``min_p`` times as likely as the most likely
  one; 0 keeps all.
- ``seed``: None (drawn from the OS once, and reported in the result) or an integer in
  [0, 2**64); the random stream of a request is keyed by (seed, request key, token index).
- ``ignore_eos``: keep generating past end-of-sequence tokens (benchmarks use it to decode a
  fixed number of tokens).
- ``stop``: a string or a list of strings; the answer ends before the first one that appears
  in the text (finish_reason "stop"; the stop string is not part of the text).
- ``stop_token_ids``: token ids that end the answer like an end-of-sequence token.
- ``n``: how many answers to sample for each prompt (an integer from 1 to
  ``MAX_ANSWERS_PER_REQUEST``).
- ``presence_penalty``, ``frequency_penalty``: in [-2, 2] (OpenAI's): subtracted from the logit
  of each token already generated, once (presence) or once per time it was generated
  (frequency).  Positive values push the answer towards new tokens.
- ``repetition_penalty``: > 0 (HF's and vLLM's): the logit of each token in the prompt or the
  answer so far is divided by it when positive, multiplied by it when negative; 1 changes
  nothing.
- ``min_tokens``: an integer in [0, max_tokens]: end-of-sequence tokens (and ``stop_token_ids``)
  cannot be sampled before this many tokens were generated.
- ``logprobs``: None, or how many of the most likely tokens to report at each generated
  position (0 to ``MAX_LOGPROBS``), besides the sampled token itself.
- ``prompt_logprobs``: the same for every prompt position after the first.
- ``logits_processors``: a list of functions ``fn(output_token_ids, logits) -> logits`` called
  on the request's row of float32 logits (vocab,) before it is sampled; each may return a new
  tensor or change the one it was given (setting -inf masks a token).

Logprobs are those of the model's own distribution (``log_softmax`` of its float32 logits),
before temperature, penalties, processors or top-k/top-p shape the draw: vLLM's default
``logprobs_mode="raw_logprobs"``.

A refusal is an ``AdmissionError`` (a ``ValueError``, ``limits.py``) whose ``field`` names the
argument.

``pt.LLM`` and the server apply ``stop``, ``stop_token_ids`` and ``n`` (``serving/``); the
sampler (``backends/sampling_rule.py``) applies ``temperature``, ``top_p``, ``top_k`` and
``min_p``, and ``backends/logits_controls.py`` the penalties, ``min_tokens`` and the logits
processors before it.

``check_sample_key`` does the same for ``Engine.add_request``'s ``sample_key`` (an integer in
[0, 2**64), like a seed: the two key the request's random stream together).
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, replace
from typing import Callable

from paged_tutorial.engine.limits import MAX_ANSWERS_PER_REQUEST, MAX_TOKENS_LIMIT, SEED_LIMIT, \
    AdmissionError

#: a positive temperature below this is greedy: logits / T would overflow float32
GREEDY_BELOW = 1e-5
#: the most top tokens ``logprobs`` / ``prompt_logprobs`` may ask for (vLLM's default
#: ``max_logprobs``)
MAX_LOGPROBS = 20
#: ``presence_penalty`` and ``frequency_penalty`` lie in [-PENALTY_LIMIT, PENALTY_LIMIT]
PENALTY_LIMIT = 2.0


def is_integer(value) -> bool:
    """An int or numpy integer, but not a bool (``True`` is no token count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def finite_float(value) -> float | None:
    """``value`` as a finite float, or None if it is not a real number or not finite (an int
    too large for a float included)."""
    if not is_real(value):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return number if math.isfinite(number) else None


def check_sample_key(sample_key) -> None:
    """``sample_key``: None (the request's id is used) or an integer in [0, 2**64)."""
    if sample_key is not None and (not is_integer(sample_key)
                                   or not 0 <= sample_key < SEED_LIMIT):
        raise AdmissionError("sample_key", f"sample_key must be None or an integer in "
                             f"[0, 2**64), got {sample_key!r}")


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logits_processors: list[Callable] | None = None

    def __post_init__(self):
        if not is_integer(self.max_tokens) or not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            raise AdmissionError("max_tokens", f"max_tokens must be an integer from 1 to "
                                 f"{MAX_TOKENS_LIMIT}, got {self.max_tokens!r}")
        if not is_integer(self.n) or not 1 <= self.n <= MAX_ANSWERS_PER_REQUEST:
            raise AdmissionError("n", f"n must be an integer from 1 to {MAX_ANSWERS_PER_REQUEST} "
                                 f"(answers per prompt), got {self.n!r}")
        self._check_controls()
        if not is_integer(self.top_k) or self.top_k < -1:
            raise AdmissionError("top_k", f"top_k must be an integer >= 1, or 0 or -1 for all "
                                 f"tokens, got {self.top_k!r}")
        min_p = finite_float(self.min_p)
        if min_p is None or not 0.0 <= min_p <= 1.0:
            raise AdmissionError("min_p", f"min_p must be in [0, 1] (0 keeps all tokens), got "
                                 f"{self.min_p!r}")
        object.__setattr__(self, "top_k", max(int(self.top_k), 0))
        object.__setattr__(self, "min_p", min_p)
        object.__setattr__(self, "stop", _stop_strings(self.stop))
        object.__setattr__(self, "stop_token_ids", _stop_token_ids(self.stop_token_ids))
        temperature, top_p = finite_float(self.temperature), finite_float(self.top_p)
        if temperature is None or temperature < 0:
            raise AdmissionError("temperature", f"temperature must be >= 0 (0 means greedy) "
                                 f"and finite, got {self.temperature!r}")
        if top_p is None or not 0.0 < top_p <= 1.0:
            raise AdmissionError("top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not is_integer(self.seed)
                                      or not 0 <= self.seed < SEED_LIMIT):
            raise AdmissionError("seed", f"seed must be None or an integer in [0, 2**64), got "
                                 f"{self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise AdmissionError("ignore_eos", f"ignore_eos must be True or False, got "
                                 f"{self.ignore_eos!r}")
        # store plain Python numbers (numpy scalars would leak into results)
        object.__setattr__(self, "max_tokens", int(self.max_tokens))
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", top_p)
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        # what the engine reads at every step, derived once (the fields are frozen)
        greedy = self.temperature < GREEDY_BELOW
        #: the request samples nothing: it takes the most likely token
        object.__setattr__(self, "greedy", greedy)
        #: top_k or min_p narrows the draw (the sampler then needs those two per row)
        object.__setattr__(self, "filters_vocabulary",
                           not greedy and (self.top_k > 0 or self.min_p > 0.0))
        #: what the sampler receives: 0.0 for greedy requests
        object.__setattr__(self, "effective_temperature", 0.0 if greedy else self.temperature)
        #: the logits are changed before the draw (penalties, min_tokens, processors)
        object.__setattr__(self, "adjusts_logits", bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
            or self.min_tokens or self.logits_processors))
        #: the sampler needs more than temperature and top_p for this request, so its batch is
        #: sampled eagerly by the batched torch rule (no CUDA graph)
        object.__setattr__(self, "needs_sampling_controls", bool(
            self.filters_vocabulary or self.adjusts_logits or self.logprobs is not None))

    def _check_controls(self) -> None:
        """The penalties, min_tokens, logprobs and logits processors (stored as plain
        Python numbers and a list)."""
        for name in ("presence_penalty", "frequency_penalty"):
            value = finite_float(getattr(self, name))
            if value is None or not -PENALTY_LIMIT <= value <= PENALTY_LIMIT:
                raise AdmissionError(name, f"{name} must be in [-2, 2] (0 leaves the logits alone), got "
                                 f"{getattr(self, name)!r}")
            object.__setattr__(self, name, value)
        repetition = finite_float(self.repetition_penalty)
        if repetition is None or repetition <= 0:
            raise AdmissionError("repetition_penalty", f"repetition_penalty must be > 0 (1 leaves the logits alone), "
                             f"got {self.repetition_penalty!r}")
        object.__setattr__(self, "repetition_penalty", repetition)
        if not is_integer(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise AdmissionError("min_tokens", f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}]"
                             f", got {self.min_tokens!r}")
        object.__setattr__(self, "min_tokens", int(self.min_tokens))
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not is_integer(value)
                                      or not 0 <= value <= MAX_LOGPROBS):
                raise AdmissionError(name, f"{name} must be None or an integer in [0, {MAX_LOGPROBS}] "
                                 f"(how many top tokens to report besides the chosen one), "
                                 f"got {value!r}")
            if value is not None:
                object.__setattr__(self, name, int(value))
        processors = self.logits_processors
        if processors is not None:
            if callable(processors) or not isinstance(processors, (list, tuple)) or \
                    not all(callable(fn) for fn in processors):
                raise AdmissionError("logits_processors", "logits_processors must be a list of functions "
                                 "fn(output_token_ids, logits) -> logits, got "
                                 f"{processors!r}")
            object.__setattr__(self, "logits_processors", list(processors) or None)

    def with_seed(self, seed: int | None = None) -> "SamplingParams":
        """This, with ``seed`` (or one drawn from the OS) when it has none, so that a result
        can report the seed that reproduces it."""
        if self.seed is not None:
            return self
        return replace(self, seed=draw_seed() if seed is None else seed)


def _stop_strings(stop) -> list[str]:
    """``stop`` as a list of non-empty strings (a single string is one stop string)."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise AdmissionError("stop", f"stop must be a string or a list of strings, got "
                             f"{stop!r}")
    if any(not s for s in stop):
        raise AdmissionError("stop", "stop strings must not be empty: an empty string would "
                             "end every answer before its first token")
    return list(stop)


def _stop_token_ids(ids) -> list[int]:
    if ids is None:
        return []
    if not isinstance(ids, (list, tuple)) or not all(is_integer(t) and t >= 0 for t in ids):
        raise AdmissionError("stop_token_ids", f"stop_token_ids must be a list of token ids "
                             f"(integers >= 0), got {ids!r}")
    return [int(t) for t in ids]


def draw_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")
