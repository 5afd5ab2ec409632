"""The OpenAI API's requests checked and turned into engine terms; its response and error bodies.

``completion_request(body, ...)`` and ``chat_request(body, ...)`` read a decoded JSON body and
return a ``ParsedRequest`` (prompts as token ids, one ``SamplingParams``, whether to stream), or
raise ``APIError`` with the HTTP status and the OpenAI-style error body the client shows.

What is accepted (as OpenAI and vLLM's server): ``model``, ``prompt`` (a string, a list of
strings, token ids, or a list of token-id lists) or ``messages``, ``max_tokens``
(``max_completion_tokens`` for chat), ``temperature`` (default 1), ``top_p``, ``n``, ``stop``,
``seed``, ``stream``, ``stream_options.include_usage``, ``user`` (a label, unused), and vLLM's
extensions ``top_k``, ``min_p``, ``ignore_eos``, ``stop_token_ids``.  A field this server does
not implement (``logprobs``, ``echo``, penalties, ``logit_bias``, tools, ...) is refused with a
400 naming it, never ignored: its answer would not be what the client asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paged_tutorial.engine.limits import MAX_ANSWERS_PER_REQUEST, AdmissionError
from paged_tutorial.engine.sampling_params import SamplingParams, is_integer
from paged_tutorial.serving.prompts import encode_conversation, encode_prompt

#: max_tokens of /v1/completions when the client gives none (OpenAI's default)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_SAMPLING = ("temperature", "top_p", "n", "stop", "seed", "top_k", "min_p", "ignore_eos",
             "stop_token_ids")
_COMMON = {"model", "stream", "stream_options", "user", "max_tokens", *_SAMPLING}
COMPLETION_FIELDS = _COMMON | {"prompt"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens"}
#: fields accepted only at the value that means "off"
_OFF_VALUES = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
               "logit_bias": (None, {}), "best_of": (None, 1), "suffix": (None, ""),
               "tools": (None, []), "tool_choice": (None, "none"),
               "response_format": (None, {"type": "text"}), "repetition_penalty": (None, 1, 1.0)}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = \
            status, message, param, kind, code

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class ParsedRequest:
    prompts: list[list[int]]         # token ids, one list per prompt
    params: list[SamplingParams]     # one per prompt (max_tokens fitted to its length)
    stream: bool
    include_usage: bool


def _check_fields(body, allowed: set[str]) -> None:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name, value in body.items():
        if name in allowed:
            continue
        if name in _OFF_VALUES:
            if value in _OFF_VALUES[name]:
                continue
            raise APIError(400, f"{name}={value!r} is not supported by this server", name)
        raise APIError(400, f"unknown field {name!r}", name)


def _check_model(body, served: str) -> None:
    model = body.get("model")
    if not isinstance(model, str):
        raise APIError(400, "'model' is required: the name /v1/models lists", "model")
    if model != served:
        raise APIError(404, f"The model `{model}` does not exist: this server serves "
                            f"`{served}`", "model", code="model_not_found")


def _bool(body, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be true or false, got {value!r}", name)
    return value


def _include_usage(body, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise APIError(400, "stream_options is only allowed with stream=true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise APIError(400, "stream_options takes only include_usage", "stream_options")
    value = options.get("include_usage", False)
    if not isinstance(value, bool):
        raise APIError(400, "stream_options.include_usage must be true or false",
                       "stream_options")
    return value


def _sampling(body, max_tokens, default_temperature: float = 1.0) -> SamplingParams:
    """The body's sampling fields as SamplingParams: its ranges are the engine's own
    (``sampling_params.py``), a refusal a 400 naming the field."""
    given = {name: body[name] for name in _SAMPLING if body.get(name) is not None}
    given.setdefault("temperature", default_temperature)
    if max_tokens is not None:
        given["max_tokens"] = max_tokens
    try:
        return SamplingParams(**given)
    except (ValueError, TypeError) as exc:          # an AdmissionError names its field
        raise APIError(400, str(exc), getattr(exc, "field", None)) from None


def _fit(engine, prompt_ids: list[int], max_tokens: int | None) -> int:
    """max_tokens for this prompt: as asked, or all the room left when not given.  As in
    OpenAI's API (and vLLM's server), an answer asked to run past the model's length is a 400
    here, where the Python API stops it there (finish_reason "length")."""
    room = engine.admission.room(prompt_ids)
    if max_tokens is None or room < 1:          # no room: the admission refuses the prompt
        return max(room, 1)
    if max_tokens > room:
        raise APIError(400, f"max_tokens={max_tokens} with a prompt of {len(prompt_ids)} tokens "
                            f"exceeds this model's maximum context length "
                            f"({engine.max_seq_len}): ask for at most {room}", "max_tokens",
                       code="context_length_exceeded")
    return max_tokens


def completion_request(body, engine, served_model: str) -> ParsedRequest:
    _check_fields(body, COMPLETION_FIELDS)
    _check_model(body, served_model)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and all(is_integer(t) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise APIError(400, "'prompt' must be a string, a list of strings, a list of token ids "
                            "or a list of token-id lists", "prompt")
    if len(prompt) > MAX_ANSWERS_PER_REQUEST:
        raise APIError(400, f"at most {MAX_ANSWERS_PER_REQUEST} prompts per request, got "
                            f"{len(prompt)}", "prompt")
    try:
        ids = [encode_prompt(engine, p if isinstance(p, str) else {"prompt_token_ids": p}).token_ids
               for p in prompt]
    except (ValueError, TypeError) as exc:
        raise APIError(400, f"prompt: {exc}", "prompt") from None
    return _parsed(body, engine, ids, body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS),
                   "prompt")


def _message_text(message) -> dict:
    """A message whose content may be a list of text parts -> content as one string."""
    if not isinstance(message, dict):
        raise APIError(400, "each message must be an object with 'role' and 'content'",
                       "messages")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise APIError(400, "this server takes text content parts only "
                                "({'type': 'text', 'text': ...})", "messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(message.get("role"), str) or not isinstance(content, str):
        raise APIError(400, "each message needs a string 'role' and a string 'content'",
                       "messages")
    return {"role": message["role"], "content": content}


def chat_request(body, engine, served_model: str) -> ParsedRequest:
    _check_fields(body, CHAT_FIELDS)
    _check_model(body, served_model)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list of messages", "messages")
    messages = [_message_text(m) for m in messages]
    try:
        ids = encode_conversation(engine, messages).token_ids
    except (ValueError, TypeError) as exc:
        raise APIError(400, f"messages: {exc}", "messages") from None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return _parsed(body, engine, [ids], max_tokens, "messages")


def _parsed(body, engine, prompts: list[list[int]], max_tokens, param: str) -> ParsedRequest:
    stream = _bool(body, "stream")
    include_usage = _include_usage(body, stream)
    base = _sampling(body, max_tokens)
    params = []
    for ids in prompts:
        fitted = replace(base, max_tokens=_fit(engine, ids, max_tokens))
        try:
            engine.admission.check(ids, fitted)
        except AdmissionError as exc:
            raise APIError(400, str(exc), param if exc.field == "prompt" else exc.field,
                           code=exc.code) from None
        params.append(fitted)
    return ParsedRequest(prompts, params, stream, include_usage)
