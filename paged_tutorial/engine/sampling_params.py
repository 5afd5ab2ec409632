"""How one request is sampled and when it stops: ``SamplingParams``, validated when it is made.

Everything a caller can get wrong is refused here, before a request is queued, with a message
that names the argument, the value and the accepted range:

- ``max_new_tokens``: an integer >= 0 (numpy integers are fine; floats, strings and bools are
  not: ``max_new_tokens=2.5`` would otherwise be silently truncated).
- ``temperature``: a finite number >= 0.  0 means greedy.  A positive temperature below
  ``GREEDY_BELOW`` is treated as greedy too: ``logits / 1e-39`` overflows to inf and the softmax
  to NaN, and a NaN distribution has no defined sample (vLLM uses the same cut-off).
- ``top_p``: in (0, 1].
- ``seed``: None (drawn from the OS once, and reported in the result) or an integer in
  [0, 2**64); the random stream of a request is keyed by (seed, request key, token index).
- ``ignore_eos``: keep generating past end-of-sequence tokens (benchmarks use it to decode a
  fixed number of tokens).

``check_sample_key`` does the same for ``Engine.add_request``'s ``sample_key`` (an integer in
[0, 2**64), like a seed: the two key the request's random stream together).
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, replace

#: a positive temperature below this is greedy: logits / T would overflow float32
GREEDY_BELOW = 1e-5
SEED_LIMIT = 2 ** 64


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
        raise ValueError(f"sample_key must be None or an integer in [0, 2**64), got "
                         f"{sample_key!r}")


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if not is_integer(self.max_new_tokens) or self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got "
                             f"{self.max_new_tokens!r}")
        temperature, top_p = finite_float(self.temperature), finite_float(self.top_p)
        if temperature is None or temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy) and finite, got "
                             f"{self.temperature!r}")
        if top_p is None or not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not is_integer(self.seed)
                                      or not 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be None or an integer in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        # store plain Python numbers (numpy scalars would leak into results)
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", top_p)
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def effective_temperature(self) -> float:
        """What the sampler receives: 0.0 for greedy requests."""
        return 0.0 if self.greedy else self.temperature

    def with_seed(self, seed: int | None = None) -> "SamplingParams":
        """This, with ``seed`` (or one drawn from the OS) when it has none, so that a result
        can report the seed that reproduces it."""
        if self.seed is not None:
            return self
        return replace(self, seed=draw_seed() if seed is None else seed)


def draw_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")
