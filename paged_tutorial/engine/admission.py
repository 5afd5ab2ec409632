"""Admission: what a caller submits turned into a ``Request`` the engine can queue, or refused.

Every frontend goes through here: ``Engine.add_request`` / ``generate`` / ``stream``, ``LLM``
(``serving/llm.py``), the OpenAI server (``serving/openai_protocol.py``) and the command line
(``cli/``).  Each rule is written once, in this file or in ``SamplingParams`` (the sampling
ranges, ``sampling_params.py``), with its limit from ``limits.py``; a refusal is one
``AdmissionError`` naming the field, the value and the fix, so the four frontends say the same
thing about the same mistake.

    Admission.request(prompt, params, chat=..., on_token=..., sample_key=...)
      -> encode   a string (chat-templated unless chat=False) or token ids -> token ids
      -> check    the prompt leaves room for an answer; the request fits an empty cache
      -> Request  with its detokenizer
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from paged_tutorial.config import CacheConfig
from paged_tutorial.engine.limits import AdmissionError
from paged_tutorial.engine.request import Request
from paged_tutorial.engine.sampling_params import SamplingParams, check_sample_key, is_integer

__all__ = ["Admission", "AdmissionError", "check_chat", "check_on_step", "check_on_token",
           "positive_int", "sampling_params"]


def positive_int(name: str, value) -> int:
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_chat(chat) -> None:
    if not isinstance(chat, bool):
        raise TypeError(f"chat must be True or False, got {chat!r}")


def check_on_token(on_token) -> None:
    """on_token(index_or_id, token_id, text_piece): refuse what cannot be called that way now,
    rather than at the first token."""
    if on_token is None:
        return
    if not callable(on_token):
        raise TypeError(f"on_token must be callable, got {type(on_token).__name__}")
    try:
        inspect.signature(on_token).bind(0, 0, "")
    except TypeError as exc:
        raise TypeError(f"on_token is called as on_token(request, token_id, text_piece): "
                        f"{exc}") from None
    except ValueError:          # builtins without a signature: trust them
        pass


def check_on_step(on_step) -> None:
    if on_step is not None and not callable(on_step):
        raise TypeError(f"on_step must be callable, got {type(on_step).__name__}")


def sampling_params(params: SamplingParams | None, keywords: dict) -> SamplingParams:
    """``params``, or a SamplingParams made of the sampling keywords given (not both)."""
    given = {k: v for k, v in keywords.items() if v is not None}
    if params is not None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        if given:
            raise TypeError(f"pass either params= or {', '.join(sorted(given))}=, not both")
        return params
    return SamplingParams(**given)


def prompt_too_long(prompt_tokens: int, max_seq_len: int) -> AdmissionError:
    """The refusal of a prompt that leaves no room for an answer (every frontend's words)."""
    return AdmissionError(
        "prompt", f"the prompt has {prompt_tokens} tokens but max_seq_len is {max_seq_len}: "
        f"prompt and answer share max_seq_len, so a prompt may have at most {max_seq_len - 1} "
        f"tokens.  Shorten the prompt or raise max_seq_len (--max-seq-len on the command line, "
        f"max_model_len for LLM)", code="context_length_exceeded")


class Admission:
    """Encodes and checks the requests of one engine (its tokenizer, vocabulary and cache)."""

    def __init__(self, tokenizer, vocab_size: int, source, cache_config: CacheConfig):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.source = source
        self.cache_config = cache_config

    @property
    def max_seq_len(self) -> int:
        return self.cache_config.max_seq_len

    def request(self, prompt, params: SamplingParams, request_id: int, *, chat: bool = True,
                on_token=None, sample_key: int | None = None) -> Request:
        """The one call: a validated ``Request`` (not queued yet), or an ``AdmissionError`` /
        ``TypeError`` naming what is wrong.  Its random stream is keyed by (seed, sample_key),
        sample_key defaulting to ``request_id``."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        check_sample_key(sample_key)
        check_chat(chat)
        check_on_token(on_token)
        ids = self.encode(prompt, chat=chat)
        self.check(ids, params)
        request = Request(request_id, ids, params,
                          sample_key=request_id if sample_key is None else sample_key,
                          on_token=on_token)
        if self.tokenizer is not None:
            request.detokenizer = self.tokenizer.stream()
        return request

    def encode(self, prompt, chat: bool = True) -> list[int]:
        """A string (chat-templated unless chat=False) or token ids -> a list of token ids.

        Token ids must be integers: a list/tuple of ints (numpy integers are fine), or an
        integer numpy array or torch tensor.  Floats, strings and bools are refused rather
        than rounded."""
        if isinstance(prompt, str):
            if not prompt:
                raise AdmissionError("prompt", "empty prompt: give some text or token ids")
            if self.tokenizer is None:
                raise AdmissionError("prompt", f"model {self.source!r} has no tokenizer files: "
                                               "pass prompts as lists of token ids")
            ids = self.tokenizer.apply_chat_template(prompt) if chat else \
                self.tokenizer.encode(prompt)
        elif isinstance(prompt, (np.ndarray, torch.Tensor)):
            ids = token_ids_of_array(prompt)
        elif isinstance(prompt, (list, tuple)):
            bad = [(i, t) for i, t in enumerate(prompt) if not is_integer(t)]
            if bad:
                i, t = bad[0]
                raise TypeError(f"token ids must be integers; position {i} holds {t!r} "
                                f"({type(t).__name__})")
            ids = [int(t) for t in prompt]
        else:
            raise TypeError(f"a prompt is a string or a list of token ids, got "
                            f"{type(prompt).__name__}")
        if not ids:
            raise AdmissionError("prompt", "empty prompt: give some text or token ids")
        bad = [(i, t) for i, t in enumerate(ids) if not 0 <= t < self.vocab_size]
        if bad:
            i, t = bad[0]
            raise AdmissionError("prompt", f"token id {t} at position {i} is outside the "
                                 f"vocabulary [0, {self.vocab_size}) ({len(bad)} bad id(s) in "
                                 f"this prompt)")
        return ids

    def check(self, ids: list[int], params: SamplingParams) -> None:
        """Refuse a prompt that leaves no room for an answer, and a request that could not
        fit even in an empty cache."""
        c = self.cache_config
        if len(ids) >= c.max_seq_len:
            raise prompt_too_long(len(ids), c.max_seq_len)
        worst = min(len(ids) + params.max_tokens, c.max_seq_len)
        blocks = c.blocks_for_tokens(worst) * c.num_layers
        if blocks > c.NUM_BLOCKS:
            raise AdmissionError(
                "max_tokens", f"request needs up to {blocks} KV blocks ({worst} tokens x "
                f"{c.num_layers} layers) but the whole cache holds {c.NUM_BLOCKS}: raise "
                f"kv_cache_bytes (now {c.kv_cache_bytes}) or lower max_tokens / the prompt")

    def room(self, ids: list[int]) -> int:
        """How many tokens an answer to ``ids`` can have before max_seq_len ends it."""
        return self.cache_config.max_seq_len - len(ids)


def token_ids_of_array(prompt: np.ndarray | torch.Tensor) -> list[int]:
    """A 1-D integer array or tensor of token ids as a list of ints."""
    if prompt.ndim != 1:
        raise ValueError(f"a token-id array must be 1-D, got shape {tuple(prompt.shape)}")
    if isinstance(prompt, torch.Tensor):
        ok = not prompt.dtype.is_floating_point and not prompt.dtype.is_complex \
            and prompt.dtype != torch.bool
    else:
        ok = prompt.dtype.kind in ("i", "u")
    if not ok:
        raise TypeError(f"token ids must be integers, got an array of {prompt.dtype}: "
                        "convert it with .astype(int) only if the values are ids")
    return [int(t) for t in prompt.tolist()]
