"""What a request may ask for, and the one error that refuses it.

Every frontend (``Engine``, ``LLM``, the OpenAI server, the command line) refuses a request
through ``AdmissionError``: a ``ValueError`` whose message names the field, the value and the
fix, and whose ``field`` names the argument (the server's ``param``, the command line's
option).  The limits below are the only definitions of these numbers: the command line's
options and the server's checks import them.  This module imports nothing heavy, so the
command line reads it before torch loads.
"""

from __future__ import annotations

#: the most tokens one request may ask for (max_tokens) and the longest max_seq_len an engine
#: takes: beyond it a number is a typo, not a request
MAX_TOKENS_LIMIT = 2 ** 24
#: the most answers one request may ask for (n), and the most prompts one completion may carry
MAX_ANSWERS_PER_REQUEST = 128
#: seeds and sample keys are integers in [0, SEED_LIMIT)
SEED_LIMIT = 2 ** 64
#: the most requests an engine decodes together (max_slots)
MAX_SLOTS_LIMIT = 4096


class AdmissionError(ValueError):
    """A request refused before anything was queued.  ``field``: the argument at fault
    (``"prompt"``, ``"max_tokens"``, ...); ``code``: a short machine-readable reason where
    the OpenAI API has one (``"context_length_exceeded"``)."""

    def __init__(self, field: str, message: str, code: str | None = None):
        super().__init__(message)
        self.field = field
        self.code = code
