"""What changes a batch's logits before the draw: penalties, ``min_tokens``, logits processors.

The engine builds one ``LogitsControls`` for a batch in which some request asks for more than
temperature and top_p (``engine/sampling_controls.py``); ``adjust`` turns the model's logits
into the float32 logits the sampling rule draws from, in vLLM's order:

1. logits processors, row by row: ``fn(output_token_ids, logits_row) -> logits_row`` on the
   row's float32 logits (vocab,), each processor given what the one before returned;
2. ``min_tokens``: the tokens in ``banned`` (end-of-sequence, while too few tokens were
   generated) set to -inf;
3. ``repetition_penalty`` (HF's and vLLM's rule) over the tokens of the prompt and the answer
   so far (``seen``): a positive logit divided by it, a negative one multiplied by it;
4. ``frequency_penalty`` times the number of times a token was generated (``output_counts``),
   then ``presence_penalty`` once for each token generated at least once, subtracted (OpenAI's
   rule: the prompt does not count).

Top-k and min-p (``top_k``, ``min_p``) are applied by the sampling rule itself
(``batched_sampling.py``) after this; logprobs (``num_logprobs``) are read from the logits
before any of it (``logprobs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


class LogitsProcessorError(Exception):
    """A logits processor of row ``row`` raised or returned something that is not a row of
    logits; the engine finishes that row's request alone."""

    def __init__(self, row: int, message: str):
        super().__init__(message)
        self.row = row


@dataclass
class RowProcessors:
    """One row's logits processors and the tokens its request generated so far."""
    row: int
    processors: list[Callable]
    output_token_ids: list[int]


@dataclass
class LogitsControls:
    """Per row tensors on the logits' device (None where no row of the batch uses them)."""
    top_k: torch.Tensor | None = None            # int64 [B]: 0 keeps every token
    min_p: torch.Tensor | None = None            # float32 [B]: 0 keeps every token
    repetition_penalty: torch.Tensor | None = None   # float32 [B, 1]: 1 changes nothing
    frequency_penalty: torch.Tensor | None = None    # float32 [B, 1]
    presence_penalty: torch.Tensor | None = None     # float32 [B, 1]
    seen: torch.Tensor | None = None             # bool [B, V]: in the prompt or the answer
    output_counts: torch.Tensor | None = None    # float32 [B, V]: times generated
    banned: torch.Tensor | None = None           # bool [B, V]: cannot be drawn now
    processors: list[RowProcessors] = field(default_factory=list)
    num_logprobs: int | None = None              # top tokens reported per row; None: none

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.processors) or any(t is not None for t in (
            self.banned, self.repetition_penalty, self.frequency_penalty,
            self.presence_penalty))

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        """The float32 logits [B, V] to draw from (a new tensor: ``logits`` is left as the
        model gave it, for the logprobs and the finite check)."""
        x = logits.float().clone() if self.adjusts_logits else logits.float()
        for entry in self.processors:
            x[entry.row] = run_processors(entry, x[entry.row])
        if self.banned is not None:
            x.masked_fill_(self.banned, float("-inf"))
        if self.repetition_penalty is not None:
            penalty = self.repetition_penalty
            penalized = torch.where(x > 0, x / penalty, x * penalty)
            x = torch.where(self.seen, penalized, x)
        if self.frequency_penalty is not None:
            x = x - self.frequency_penalty * self.output_counts
        if self.presence_penalty is not None:
            x = x - self.presence_penalty * (self.output_counts > 0).float()
        return x


def run_processors(entry: RowProcessors, row: torch.Tensor) -> torch.Tensor:
    """One row through its processors, in order; a processor that raises or returns anything
    but a tensor of the row's shape is named in a ``LogitsProcessorError``."""
    for fn in entry.processors:
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            out = fn(list(entry.output_token_ids), row)
        except Exception as exc:            # the request's own code: its request alone fails
            raise LogitsProcessorError(entry.row, f"logits processor {name} raised "
                                       f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(out, torch.Tensor) or out.shape != row.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise LogitsProcessorError(entry.row, f"logits processor {name} must return the "
                                       f"logits, a tensor of shape {tuple(row.shape)}; it "
                                       f"returned {got}")
        row = out.to(device=row.device, dtype=torch.float32)
    return row
