"""The OpenAI API's requests turned into engine terms; the error body every refusal carries.

``completion_request(raw, ...)`` and ``chat_request(raw, ...)`` read a request body (bytes of
JSON) through the pydantic types of ``api_models.py`` and return a ``ParsedRequest`` (prompts as
token ids, one ``SamplingParams`` per prompt, whether to stream), or raise ``APIError`` with the
HTTP status and the OpenAI-style error body the client shows: ``{"error": {"message", "type",
"param", "code"}}``, ``param`` naming the field (``messages.[0].content`` for a nested one).

The shape of each field is the pydantic type's business; every range (``max_tokens``,
``temperature``, ``top_p``, ``n``, ...) is ``SamplingParams``', and the prompt's length against
the model's is checked here, per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import ValidationError

from paged_tutorial.engine.sampling_params import SamplingParams
from paged_tutorial.serving.api_models import (OFF_VALUES, ChatCompletionRequest,
                                               CompletionRequest)
from paged_tutorial.engine.limits import MAX_ANSWERS_PER_REQUEST, AdmissionError
from paged_tutorial.serving.prompts import encode_conversation, encode_prompt
from paged_tutorial.serving.structured_output import json_processor

#: max_tokens of /v1/completions when the client gives none (OpenAI's default)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_SAMPLING = ("temperature", "top_p", "n", "stop", "seed", "top_k", "min_p", "ignore_eos",
             "stop_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty",
             "min_tokens")
_PROMPT_SHAPES = ("'prompt' must be a string, a list of strings, a list of token ids or a list "
                  "of token-id lists")


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
    top_logprobs: int | None = None  # logprobs asked for: how many most likely tokens each


def _param(loc: tuple) -> str | None:
    """pydantic's error location as OpenAI names a parameter: ``messages.[0].content``."""
    parts = [f"[{p}]" if isinstance(p, int) else str(p) for p in loc
             if not (isinstance(p, str) and ("[" in p or p in ("str", "list")))]
    return ".".join(parts) or None


def _refusal(exc: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field."""
    error = exc.errors(include_url=False)[0]
    loc, kind = error["loc"], error["type"]
    if kind == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {error['msg']}")
    if kind in ("model_type", "model_attributes_type") and not loc:
        return APIError(400, "the request body must be a JSON object")
    param = _param(loc)
    if loc and loc[0] == "prompt":
        return APIError(400, _PROMPT_SHAPES, "prompt")
    if kind == "missing":
        if param == "model":
            return APIError(400, "'model' is required: the name /v1/models lists", "model")
        return APIError(400, f"{param!r} is required", param)
    if kind == "extra_forbidden":
        return APIError(400, f"unknown field {param!r}", param)
    return APIError(400, f"{param}: {error['msg']}, got {error.get('input')!r}", param)


def _read(model_type, raw: bytes):
    try:
        request = model_type.model_validate_json(raw)
    except ValidationError as exc:
        raise _refusal(exc) from None
    for name, off in OFF_VALUES.items():
        value = getattr(request, name, None)
        if value not in off:
            raise APIError(400, f"{name}={value!r} is not supported by this server", name)
    return request


def _check_model(request, served: str) -> None:
    if request.model != served:
        raise APIError(404, f"The model `{request.model}` does not exist: this server serves "
                            f"`{served}`", "model", code="model_not_found")


def _include_usage(request) -> bool:
    if request.stream_options is None:
        return False
    if not request.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", "stream_options")
    return request.stream_options.include_usage


def _logprobs(request) -> int | None:
    """How many most likely tokens to report per position (None: no logprobs at all)."""
    if isinstance(request, CompletionRequest):
        top = request.logprobs
    elif request.logprobs:
        top = request.top_logprobs or 0
    elif request.top_logprobs is not None:
        raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    else:
        top = None
    if top is not None and request.stream:
        raise APIError(400, "logprobs with stream=true is not supported by this server: ask "
                            "without streaming", "logprobs")
    return top


def _grammar(request, engine) -> list | None:
    """``response_format`` as a logits processor holding the answer to JSON (None: free text)."""
    form = request.response_format
    if form is None or form.type == "text":
        return None
    if engine.tokenizer is None:
        raise APIError(400, "response_format needs the model's tokenizer, and this model has "
                            "none", "response_format")
    schema = None
    if form.type == "json_schema":
        if form.json_schema is None or form.json_schema.schema_ is None:
            raise APIError(400, "response_format of type json_schema needs "
                                "json_schema.schema: the JSON schema the answer must follow",
                           "response_format")
        schema = form.json_schema.schema_
    try:
        return [json_processor(engine.tokenizer, engine.config.vocab_size,
                               sorted(engine.eos_token_ids), schema)]
    except (ValueError, RuntimeError) as exc:      # a schema it cannot use; no llguidance
        raise APIError(400, str(exc), "response_format") from None


def _sampling(request, max_tokens, logprobs: int | None, grammar: list | None,
              default_temperature: float = 1.0) -> SamplingParams:
    """The request's sampling fields as SamplingParams: its ranges are the engine's own
    (``sampling_params.py``), a refusal a 400 naming the field."""
    given = {name: getattr(request, name) for name in _SAMPLING
             if getattr(request, name) is not None}
    if logprobs is not None:
        given["logprobs"] = logprobs
    if grammar is not None:
        given["logits_processors"] = grammar
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


def completion_request(raw: bytes, engine, served_model: str) -> ParsedRequest:
    request = _read(CompletionRequest, raw)
    _check_model(request, served_model)
    prompt = request.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise APIError(400, _PROMPT_SHAPES, "prompt")
    if len(prompt) > MAX_ANSWERS_PER_REQUEST:
        raise APIError(400, f"at most {MAX_ANSWERS_PER_REQUEST} prompts per request, got "
                            f"{len(prompt)}", "prompt")
    try:
        ids = [encode_prompt(engine, p if isinstance(p, str) else {"prompt_token_ids": p}).token_ids
               for p in prompt]
    except (ValueError, TypeError) as exc:
        raise APIError(400, f"prompt: {exc}", "prompt") from None
    max_tokens = (COMPLETIONS_DEFAULT_MAX_TOKENS if request.max_tokens is None
                  else request.max_tokens)
    return _parsed(request, engine, ids, max_tokens, "prompt")


def chat_request(raw: bytes, engine, served_model: str) -> ParsedRequest:
    request = _read(ChatCompletionRequest, raw)
    _check_model(request, served_model)
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    try:
        ids = encode_conversation(engine, messages).token_ids
    except (ValueError, TypeError) as exc:
        raise APIError(400, f"messages: {exc}", "messages") from None
    max_tokens = (request.max_completion_tokens if request.max_completion_tokens is not None
                  else request.max_tokens)
    return _parsed(request, engine, [ids], max_tokens, "messages")


def _parsed(request, engine, prompts: list[list[int]], max_tokens, param: str) -> ParsedRequest:
    include_usage = _include_usage(request)
    top_logprobs = _logprobs(request)
    base = _sampling(request, max_tokens, top_logprobs, _grammar(request, engine))
    params = []
    for ids in prompts:
        fitted = replace(base, max_tokens=_fit(engine, ids, max_tokens))
        try:
            engine.admission.check(ids, fitted)
        except AdmissionError as exc:
            raise APIError(400, str(exc), param if exc.field == "prompt" else exc.field,
                           code=exc.code) from None
        params.append(fitted)
    return ParsedRequest(prompts, params, bool(request.stream), include_usage, top_logprobs)
