"""An answer's logprobs (vLLM's list of ``{token_id: Logprob}``, the chosen token first) in the
OpenAI API's two shapes:

- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}, ...]}, ...]}``, ``top_logprobs`` the k most likely tokens by rank;
- completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}, ...],
  "text_offset"}``, offsets counted in characters from the answer's start.
"""

from __future__ import annotations

from paged_tutorial.serving.api_models import (ChatLogprobs, CompletionLogprobs, TokenLogprob,
                                               TopLogprob)


def _text(entry) -> str:
    return entry.decoded_token if entry.decoded_token is not None else ""


def _most_likely(position: dict, k: int) -> list:
    ranked = sorted((e for e in position.values() if e.rank is not None), key=lambda e: e.rank)
    return ranked[:k]


def chat_logprobs(positions: list[dict], top: int) -> ChatLogprobs:
    content = []
    for position in positions:
        chosen = next(iter(position.values()))
        content.append(TokenLogprob(
            token=_text(chosen), logprob=chosen.logprob, bytes=list(_text(chosen).encode()),
            top_logprobs=[TopLogprob(token=_text(e), logprob=e.logprob,
                                     bytes=list(_text(e).encode()))
                          for e in _most_likely(position, top)]))
    return ChatLogprobs(content=content)


def completion_logprobs(positions: list[dict], top: int) -> CompletionLogprobs:
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = 0
    for position in positions:
        chosen = next(iter(position.values()))
        tokens.append(_text(chosen))
        token_logprobs.append(chosen.logprob)
        tops.append({_text(e): e.logprob for e in _most_likely(position, top)})
        offsets.append(offset)
        offset += len(_text(chosen))
    return CompletionLogprobs(tokens=tokens, token_logprobs=token_logprobs, top_logprobs=tops,
                              text_offset=offsets)
