"""The OpenAI-compatible HTTP server: a FastAPI application over one ``EngineLoop``.

    GET  /health                 200 while the engine thread runs, 503 once it has failed
    GET  /metrics                Prometheus text (``metrics.py``)
    GET  /v1/models              the one model served
    POST /v1/completions         text completion, JSON or Server-Sent Events (stream=true)
    POST /v1/chat/completions    chat completion, JSON or Server-Sent Events

A handler checks the body (``openai_protocol.py``: a 4xx with an OpenAI-style error body when it
is malformed or out of range), hands one job per prompt to the engine thread and reads the
job's events from an asyncio queue that the engine thread feeds with ``call_soon_threadsafe``.
A client that goes away (the connection closes mid-stream, or before a JSON answer is ready)
has its jobs cancelled: their requests leave their slots and their blocks return to the free
list at the next step.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from paged_tutorial.serving.engine_loop import EngineLoop
from paged_tutorial.serving.metrics import CONTENT_TYPE, render_metrics
from paged_tutorial.serving.openai_protocol import (APIError, ParsedRequest, chat_request,
                                                     completion_request, error_body)

#: how often a handler waiting for tokens checks whether its client is still there
DISCONNECT_POLL_S = 0.25


class ClientSession:
    """One HTTP request's jobs and the queue their events arrive on."""

    def __init__(self, loop: EngineLoop, parsed: ParsedRequest):
        self.loop = loop
        self.parsed = parsed
        self.events: asyncio.Queue = asyncio.Queue()
        self.n = parsed.params[0].n
        self.jobs = []
        self.outputs = {}                 # choice index -> CompletionOutput
        self.prompt_tokens = sum(len(ids) for ids in parsed.prompts)
        aio = asyncio.get_running_loop()

        def forward(prompt_index: int):
            def on_event(event: tuple) -> None:          # runs in the engine thread
                try:
                    aio.call_soon_threadsafe(self.events.put_nowait, (prompt_index, event))
                except RuntimeError:                      # the event loop has closed
                    pass
            return on_event

        for i, (ids, params) in enumerate(zip(parsed.prompts, parsed.params)):
            self.jobs.append(loop.submit(ids, params, forward(i)))

    @property
    def expected(self) -> int:
        return len(self.jobs) * self.n

    @property
    def done(self) -> bool:
        return len(self.outputs) == self.expected

    def cancel(self) -> None:
        for job in self.jobs:
            self.loop.cancel(job)

    async def next_event(self, request: Request):
        """(choice index, event) or None when the client has gone away."""
        while True:
            try:
                prompt_index, event = await asyncio.wait_for(self.events.get(),
                                                             DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return None
                continue
            if event[0] in ("delta", "finish"):
                choice = prompt_index * self.n + event[1]
                if event[0] == "finish":
                    self.outputs[choice] = event[2]
                return choice, event
            return None, event

    @property
    def usage(self) -> dict:
        completion = sum(len(o.token_ids) for o in self.outputs.values())
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}


def _failure(event: tuple) -> APIError:
    if event[0] == "rejected":
        return APIError(400, event[1])
    return APIError(500, event[1], kind="server_error")


def build_app(engine, served_model_name: str, engine_loop: EngineLoop | None = None, *,
              api_key: str | None = None, max_body_bytes: int = 2 ** 20,
              body_timeout_s: float = 30.0) -> FastAPI:
    """The ASGI application serving ``engine`` under the name ``served_model_name``.  The
    engine thread starts with the application (its lifespan) and is stopped, after serving
    everything queued, when the application shuts down.  ``api_key``, ``max_body_bytes`` and
    ``body_timeout_s`` (the serve command's --api-key, --max-body-bytes, --body-timeout) are
    kept in ``app.state``."""
    loop = engine_loop or EngineLoop(engine)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        loop.start()
        try:
            yield
        finally:
            await asyncio.to_thread(loop.stop)

    app = FastAPI(title="paged-tutorial", lifespan=lifespan)
    app.state.engine_loop = loop
    app.state.api_key = api_key
    app.state.max_body_bytes = max_body_bytes
    app.state.body_timeout_s = body_timeout_s

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}",
                                       kind), status_code=exc.status_code)

    @app.get("/health")
    async def health():
        if loop.failure is not None or not loop.alive:
            return JSONResponse(error_body("the engine thread has stopped", "server_error"),
                                status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(render_metrics(loop.stats()), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": served_model_name, "object": "model", "created": created,
            "owned_by": "paged-tutorial", "max_model_len": engine.max_seq_len}]}

    async def read_json(request: Request):
        raw = await request.body()
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON: {exc}") from None

    @app.post("/v1/completions")
    async def completions(request: Request):
        parsed = completion_request(await read_json(request), engine, served_model_name)
        return await respond(request, parsed, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        parsed = chat_request(await read_json(request), engine, served_model_name)
        return await respond(request, parsed, chat=True)

    async def respond(request: Request, parsed: ParsedRequest, chat: bool) -> Response:
        try:
            session = ClientSession(loop, parsed)
        except RuntimeError as exc:                      # shutting down
            raise APIError(503, str(exc), kind="server_error") from None
        head = dict(id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, created=int(
            time.time()), model=served_model_name)
        try:
            first = await session.next_event(request)
        except BaseException:
            session.cancel()
            raise
        if first is None:
            session.cancel()
            return Response(status_code=499)
        if first[0] is None:
            session.cancel()
            raise _failure(first[1])
        if parsed.stream:
            return StreamingResponse(stream(request, session, head, chat, first),
                                     media_type="text/event-stream")
        return await whole(request, session, head, chat, first)

    async def whole(request, session: ClientSession, head: dict, chat: bool,
                    event) -> Response:
        texts: dict[int, list[str]] = {}
        try:
            while True:
                choice, ev = event
                if choice is None:
                    raise _failure(ev)
                if ev[0] == "delta":
                    texts.setdefault(choice, []).append(ev[2])
                if session.done:
                    break
                event = await session.next_event(request)
                if event is None:
                    session.cancel()
                    return Response(status_code=499)
        except BaseException:
            session.cancel()
            raise
        errors = [o.error for o in session.outputs.values() if o.finish_reason == "error"]
        if errors:
            raise APIError(500, errors[0], kind="server_error")
        choices = []
        for index in range(session.expected):
            output = session.outputs[index]
            text = "".join(texts.get(index, []))
            if chat:
                choices.append({"index": index, "logprobs": None,
                                "message": {"role": "assistant", "content": text},
                                "finish_reason": output.finish_reason})
            else:
                choices.append({"index": index, "text": text, "logprobs": None,
                                "finish_reason": output.finish_reason})
        return JSONResponse({**head, "object": "chat.completion" if chat else "text_completion",
                             "choices": choices, "usage": session.usage})

    async def stream(request, session: ClientSession, head: dict, chat: bool, event):
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices, **extra) -> str:
            return "data: " + json.dumps({**head, "object": kind, "choices": choices,
                                          **extra}) + "\n\n"

        def choice(index: int, text: str | None, finish_reason: str | None) -> dict:
            if chat:
                delta = {} if text is None else {"content": text}
                return {"index": index, "delta": delta, "logprobs": None,
                        "finish_reason": finish_reason}
            return {"index": index, "text": text or "", "logprobs": None,
                    "finish_reason": finish_reason}

        try:
            if chat:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}
                             for i in range(session.expected)])
            while True:
                index, ev = event
                if index is None:
                    failure = _failure(ev)
                    yield "data: " + json.dumps(failure.body()) + "\n\n"
                    return
                if ev[0] == "delta":
                    yield chunk([choice(index, ev[2], None)])
                else:
                    output = ev[2]
                    if output.finish_reason == "error":
                        yield "data: " + json.dumps(error_body(output.error or "error",
                                                               "server_error")) + "\n\n"
                        return
                    yield chunk([choice(index, None, output.finish_reason)])
                if session.done:
                    break
                event = await session.next_event(request)
                if event is None:
                    return
            if session.parsed.include_usage:
                yield chunk([], usage=session.usage)
            yield "data: [DONE]\n\n"
        finally:
            if not session.done:
                session.cancel()

    return app
