"""The OpenAI API's request and response bodies as pydantic types.

Requests are read strictly: a field this server does not know is refused (``extra="forbid"``),
and no value is coerced (``"3"`` is not a number, ``true`` is not an integer).  The types say
only what shape a field has; the ranges (``max_tokens >= 1``, ``0 < top_p <= 1``, a prompt that
fits the model) are checked where the engine's requests are made (``SamplingParams``), once for
every frontend.

Fields the API defines but this server does not implement (``echo``, ``logit_bias``, tools,
``best_of``, ``suffix``) are accepted only at the value that means "off" (``OFF_VALUES``):
anything else is a 400 naming the field, never silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """``{"type": "text"}``, ``{"type": "json_object"}`` (any JSON object) or
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class _SamplingFields(_Strict):
    """What both endpoints take: sampling, stopping, streaming (vLLM's extensions included)."""
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: Any = None               # its rule is SamplingParams' (the one admission's words)
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # vLLM's extensions (the openai client sends them through extra_body)
    top_k: int | None = None
    min_p: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    # defined by the API, accepted only when off (OFF_VALUES)
    logit_bias: Any = None
    best_of: Any = None
    echo: Any = None
    suffix: Any = None
    tools: Any = None
    tool_choice: Any = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None          # how many most likely tokens to report per position


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A message; fields besides ``role`` and ``content`` (``name``, ...) are read and unused."""
    model_config = ConfigDict(extra="ignore", strict=True)
    role: str
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None         # report each answer token's logprob
    top_logprobs: int | None = None      # and the most likely tokens' at each position


#: fields accepted only at the value that means "off"
OFF_VALUES = {"logit_bias": (None, {}), "best_of": (None, 1), "echo": (None, False),
              "suffix": (None, ""), "tools": (None, []), "tool_choice": (None, "none")}


# --- responses --------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions' logprobs: per generated token its text, its logprob, the most
    likely tokens' logprobs, and where it begins in the answer's text."""
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaMessage(BaseModel):
    """What a chunk adds to the message; fields it does not add are left out, as OpenAI's."""
    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _only_what_is_added(self, handler):
        return {name: value for name, value in handler(self).items() if value is not None}


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Any = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One Server-Sent Event of a streamed chat answer."""
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunk(BaseModel):
    """One Server-Sent Event of a streamed completion (OpenAI names it as the whole answer)."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "paged-tutorial"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
