"""What a caller submits, checked before anything is queued: prompts encoded to token ids,
the arguments of ``add_request`` / ``generate`` / ``stream`` validated, and a request refused
if it could not fit even in an empty cache.  Every refusal names the problem and the fix."""

from __future__ import annotations

import inspect

import numpy as np
import torch

from paged_tutorial.config import CacheConfig
from paged_tutorial.engine.sampling_params import SamplingParams, is_integer


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


class PromptChecker:
    """Encodes prompts for one engine and refuses those it could never serve."""

    def __init__(self, tokenizer, vocab_size: int, source, cache_config: CacheConfig):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.source = source
        self.cache_config = cache_config

    def encode(self, prompt, chat: bool = True) -> list[int]:
        """A string (chat-templated unless chat=False) or token ids -> a list of token ids.

        Token ids must be integers: a list/tuple of ints (numpy integers are fine), or an
        integer numpy array or torch tensor.  Floats, strings and bools are refused rather
        than rounded."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("empty prompt: give some text or token ids")
            if self.tokenizer is None:
                raise ValueError(f"model {self.source!r} has no tokenizer files: pass "
                                 "prompts as lists of token ids")
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
            raise ValueError("empty prompt: a token-id list needs at least one id")
        bad = [(i, t) for i, t in enumerate(ids) if not 0 <= t < self.vocab_size]
        if bad:
            i, t = bad[0]
            raise ValueError(f"token id {t} at position {i} is outside the vocabulary "
                             f"[0, {self.vocab_size}) ({len(bad)} bad id(s) in this prompt)")
        return ids

    def check_fits(self, ids: list[int], params: SamplingParams) -> None:
        """Refuse a request that could not fit even in an empty cache."""
        c = self.cache_config
        if len(ids) >= c.max_seq_len:
            return                                   # finished at once: prompt_too_long
        worst = min(len(ids) + params.max_tokens, c.max_seq_len)
        blocks = c.blocks_for_tokens(worst) * c.num_layers
        if blocks > c.NUM_BLOCKS:
            raise ValueError(
                f"request needs up to {blocks} KV blocks ({worst} tokens x "
                f"{c.num_layers} layers) but the whole cache holds "
                f"{c.NUM_BLOCKS}: raise kv_cache_bytes (now "
                f"{c.kv_cache_bytes}) or lower max_tokens / the prompt")


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
