"""The OpenAI-compatible HTTP server: a FastAPI application over one engine loop, an
``EngineLoop`` on a thread of this process or an ``EngineProcess`` (the same loop in a process
of its own, ``engine_process.py``; ``serve``'s default).

    GET  /health                 200 while the engine loop runs, 503 once it has failed
    GET  /metrics                Prometheus text (``metrics.py``)
    GET  /v1/models              the one model served
    POST /v1/completions         text completion, JSON or Server-Sent Events (stream=true)
    POST /v1/chat/completions    chat completion, JSON or Server-Sent Events

A handler reads the body (at most ``max_body_bytes``, within ``body_timeout_s``: 413 and 408
otherwise), checks it (``openai_protocol.py``: a 4xx with an OpenAI-style error body when it is
malformed or out of range), hands one job per prompt to the engine loop and reads the job's
events.  The engine loop hands each step's events for every client to the event loop in one
call (``start(deliver)``); each handler then wakes once per step, whatever number of
tokens arrived.  A client that goes away (the connection closes mid-stream, or before a JSON
answer is ready) has its jobs cancelled: their requests leave their slots and their blocks
return to the free list at the next step.  With ``api_key`` set, every ``/v1`` route wants
``Authorization: Bearer <api_key>`` (401 otherwise); ``/health`` and ``/metrics`` stay open.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections import deque
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from paged_tutorial.serving.api_models import (AssistantMessage, ChatChoice,
                                               ChatCompletionChunk, ChatCompletionResponse,
                                               ChatChunkChoice, CompletionChoice,
                                               CompletionChunk, CompletionResponse,
                                               DeltaMessage, ModelCard, ModelList,
                                               PromptTokensDetails, Usage)
from paged_tutorial.serving import structured_output
from paged_tutorial.serving.api_logprobs import chat_logprobs, completion_logprobs
from paged_tutorial.serving.engine_loop import EngineLoop
from paged_tutorial.serving.metrics import CONTENT_TYPE, ServerMetrics
from paged_tutorial.serving.openai_protocol import (APIError, ParsedRequest, chat_request,
                                                     completion_request, error_body)

#: how often a handler waiting for a JSON answer checks whether its client is still there
DISCONNECT_POLL_S = 0.25
#: the largest request body taken (bytes), and how long a client may take to send it
MAX_BODY_BYTES = 1 << 20
BODY_TIMEOUT_S = 30.0


class ClientSession:
    """One HTTP request's jobs and the events that arrived for them."""

    def __init__(self, loop: EngineLoop, parsed: ParsedRequest, received_at: float):
        self.loop = loop
        self.parsed = parsed
        self.received_at = received_at
        self.first_token_at: float | None = None
        self.pending: deque = deque()
        self.ready = asyncio.Event()
        self.n = parsed.params[0].n
        self.jobs = []
        self.outputs = {}                 # choice index -> CompletionOutput
        self.cached = {}                  # choice index -> prompt tokens found in the cache
        self.prompt_tokens = sum(len(ids) for ids in parsed.prompts)

        def forward(prompt_index: int):
            def on_event(event: tuple) -> None:          # runs in the event loop
                self.pending.append((prompt_index, event))
                self.ready.set()
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

    async def next_events(self, request: Request | None) -> list | None:
        """The events that arrived since the last call, each as (choice index, event), or
        (None, event) for a failure of the whole job; None when the client has gone away.
        With ``request`` given, checks every ``DISCONNECT_POLL_S`` that its client is there."""
        while not self.pending:
            self.ready.clear()
            if request is None:
                await self.ready.wait()
                continue
            try:
                await asyncio.wait_for(self.ready.wait(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return None
        batch = []
        while self.pending:
            prompt_index, event = self.pending.popleft()
            if event[0] in ("delta", "finish"):
                choice = prompt_index * self.n + event[1]
                if event[0] == "finish":
                    self.outputs[choice] = event[2]
                    self.cached[choice] = event[3]
                elif self.first_token_at is None:
                    self.first_token_at = time.monotonic()
                batch.append((choice, event))
            else:
                batch.append((None, event))
        return batch

    @property
    def usage(self) -> Usage:
        completion = sum(len(o.token_ids) for o in self.outputs.values())
        # a prompt's tokens that every one of its answers found in the prefix cache
        cached = sum(min(self.cached.get(p * self.n + j, 0) for j in range(self.n))
                     for p in range(len(self.jobs)))
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=completion,
                     total_tokens=self.prompt_tokens + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def _failure(event: tuple) -> APIError:
    if event[0] == "rejected":
        return APIError(400, event[1])
    return APIError(500, event[1], kind="server_error")


class ChunkWriter:
    """A streamed answer's Server-Sent Events.  The chunks that carry text (one per token) are
    written from a template made once per request; the rarer ones (the role, the finish, the
    usage) from the pydantic types the template matches."""

    def __init__(self, head: dict, chat: bool):
        self.head, self.chat = head, chat
        model = ChatCompletionChunk if chat else CompletionChunk
        prefix = model(**head, choices=[]).model_dump_json()[:-len('"choices":[],"usage":null}')]
        self.prefix = "data: " + prefix + '"choices":[{"index":'
        self.middle = (',"delta":{"content":' if chat else ',"text":')
        self.end = ('},"logprobs":null,"finish_reason":null}]}\n\n' if chat
                    else ',"logprobs":null,"finish_reason":null}]}\n\n')

    def text(self, index: int, text: str) -> str:
        return (f"{self.prefix}{index}{self.middle}{json.dumps(text, ensure_ascii=False)}"
                f"{self.end}")

    def event(self, choices: list, usage: Usage | None = None) -> str:
        model = ChatCompletionChunk if self.chat else CompletionChunk
        return ("data: " + model(**self.head, choices=choices, usage=usage).model_dump_json()
                + "\n\n")

    def role(self, count: int) -> str:
        return self.event([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant",
                                                                       content=""))
                           for i in range(count)])

    def finish(self, index: int, finish_reason: str) -> str:
        if self.chat:
            return self.event([ChatChunkChoice(index=index, delta=DeltaMessage(),
                                               finish_reason=finish_reason)])
        return self.event([CompletionChoice(index=index, text="",
                                            finish_reason=finish_reason)])

    @staticmethod
    def error(body: dict) -> str:
        return "data: " + json.dumps(body) + "\n\n"


def build_app(engine, served_model_name: str, engine_loop=None, *,
              api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
              body_timeout_s: float = BODY_TIMEOUT_S) -> FastAPI:
    """The ASGI application serving ``engine`` under the name ``served_model_name``.  The
    engine loop (``engine_loop``: an ``EngineProcess``, whose ``frontend`` is then ``engine``;
    by default an ``EngineLoop`` over ``engine`` on a thread) starts with the application (its
    lifespan) and is stopped, after serving everything queued, when the application shuts down;
    the application then lets go of the engine (one lifespan per application).

    ``api_key``: when set, ``/v1`` routes answer 401 without ``Authorization: Bearer <key>``.
    ``max_body_bytes``: a larger request body is a 413.  ``body_timeout_s``: a body not fully
    received this long after its request began is a 408."""
    loop = engine_loop or EngineLoop(engine)
    structured_output.preload()            # not inside the first request asking for JSON
    created = int(time.time())
    metrics = ServerMetrics(loop.stats, served_model_name)
    expected_authorization = None if api_key is None else f"Bearer {api_key}".encode()

    @asynccontextmanager
    async def lifespan(app):
        nonlocal engine, loop, metrics
        if loop is None:
            raise RuntimeError("this application has shut down and let go of its engine: "
                               "build a new one with build_app(engine, ...) to serve again")
        aio = asyncio.get_running_loop()

        def run_all(calls) -> None:                    # in the event loop, once per step
            for on_event, event in calls:
                on_event(event)

        def deliver(calls) -> None:                    # in the engine thread
            try:
                aio.call_soon_threadsafe(run_all, calls)
            except RuntimeError:                       # the event loop has closed
                pass

        loop.start(deliver)
        try:
            yield
        finally:
            await asyncio.to_thread(loop.stop)
            # FastAPI keeps every endpoint it has seen in process-wide caches; the endpoints
            # below reach the engine through these names, so a stopped application lets go
            # of them, and its engine (and its KV cache) can be freed
            engine = loop = metrics = None
            app.state.engine_loop = app.state.metrics = None

    app = FastAPI(title="paged-tutorial", lifespan=lifespan)
    app.state.engine_loop = loop
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}",
                                       kind), status_code=exc.status_code)

    def authorize(request: Request) -> None:
        if expected_authorization is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected_authorization):
            raise APIError(401, "Incorrect or missing API key: send the header "
                                "'Authorization: Bearer <key>' with the key the server was "
                                "started with", code="invalid_api_key")

    @app.get("/health")
    async def health():
        if loop.failure is not None or not loop.alive:
            return JSONResponse(error_body("the engine loop has stopped", "server_error"),
                                status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics_text():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return ModelList(data=[ModelCard(id=served_model_name, created=created,
                                         max_model_len=engine.max_seq_len)]).model_dump()

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise _too_large()
        chunks, size = [], 0

        async def receive_all() -> None:
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body_bytes:
                    raise _too_large()
                chunks.append(chunk)

        try:
            await asyncio.wait_for(receive_all(), body_timeout_s)
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body was not received within {body_timeout_s} s "
                                "(the server's body timeout)") from None
        return b"".join(chunks)

    def _too_large() -> APIError:
        return APIError(413, f"the request body is larger than {max_body_bytes} bytes, the "
                             "largest this server takes (its max_body_bytes)")

    @app.post("/v1/completions")
    async def completions(request: Request):
        received_at = time.monotonic()
        authorize(request)
        parsed = completion_request(await read_body(request), engine, served_model_name)
        return await respond(request, parsed, chat=False, received_at=received_at)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        received_at = time.monotonic()
        authorize(request)
        parsed = chat_request(await read_body(request), engine, served_model_name)
        return await respond(request, parsed, chat=True, received_at=received_at)

    def observe(session: ClientSession) -> None:
        if session.first_token_at is not None:
            metrics.time_to_first_token.observe(session.first_token_at - session.received_at)
        metrics.e2e_latency.observe(time.monotonic() - session.received_at)

    async def respond(request: Request, parsed: ParsedRequest, chat: bool,
                      received_at: float) -> Response:
        try:
            session = ClientSession(loop, parsed, received_at)
        except RuntimeError as exc:                      # shutting down
            raise APIError(503, str(exc), kind="server_error") from None
        head = dict(id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
                    created=int(time.time()), model=served_model_name)
        try:
            first = await session.next_events(request)
        except BaseException:
            session.cancel()
            raise
        if first is None:
            session.cancel()
            return Response(status_code=499)
        if first[0][0] is None:
            session.cancel()
            raise _failure(first[0][1])
        if parsed.stream:
            return StreamingResponse(stream(session, ChunkWriter(head, chat), chat, first),
                                     media_type="text/event-stream")
        return await whole(request, session, head, chat, first)

    async def whole(request, session: ClientSession, head: dict, chat: bool,
                    batch: list) -> Response:
        texts: dict[int, list[str]] = {}
        try:
            while True:
                for choice, ev in batch:
                    if choice is None:
                        raise _failure(ev)
                    if ev[0] == "delta":
                        texts.setdefault(choice, []).append(ev[2])
                if session.done:
                    break
                batch = await session.next_events(request)
                if batch is None:
                    session.cancel()
                    return Response(status_code=499)
        except BaseException:
            session.cancel()
            raise
        observe(session)
        errors = [o.error for o in session.outputs.values() if o.finish_reason == "error"]
        if errors:
            raise APIError(500, errors[0], kind="server_error")
        outputs = [(index, session.outputs[index], "".join(texts.get(index, [])))
                   for index in range(session.expected)]
        top = session.parsed.top_logprobs

        def logprobs(output, shape):
            return None if top is None or output.logprobs is None else shape(output.logprobs, top)

        if chat:
            body = ChatCompletionResponse(**head, usage=session.usage, choices=[
                ChatChoice(index=index, message=AssistantMessage(content=text),
                           logprobs=logprobs(output, chat_logprobs),
                           finish_reason=output.finish_reason)
                for index, output, text in outputs])
        else:
            body = CompletionResponse(**head, usage=session.usage, choices=[
                CompletionChoice(index=index, text=text, finish_reason=output.finish_reason,
                                 logprobs=logprobs(output, completion_logprobs))
                for index, output, text in outputs])
        return Response(body.model_dump_json(), media_type="application/json")

    async def stream(session: ClientSession, writer: ChunkWriter, chat: bool, batch: list):
        # A client that hangs up cancels this generator (Starlette listens for the
        # disconnect while it streams); ``finally`` then cancels its jobs.
        try:
            if chat:
                yield writer.role(session.expected)
            while True:
                out = []
                for index, ev in batch:
                    if index is None:
                        out.append(writer.error(_failure(ev).body()))
                        yield "".join(out)
                        return
                    if ev[0] == "delta":
                        out.append(writer.text(index, ev[2]))
                        continue
                    output = ev[2]
                    if output.finish_reason == "error":
                        out.append(writer.error(error_body(output.error or "error",
                                                           "server_error")))
                        yield "".join(out)
                        return
                    out.append(writer.finish(index, output.finish_reason))
                if session.done:
                    observe(session)
                    if session.parsed.include_usage:
                        out.append(writer.event([], usage=session.usage))
                    out.append("data: [DONE]\n\n")
                    yield "".join(out)
                    return
                if out:
                    yield "".join(out)
                batch = await session.next_events(None)
        finally:
            if not session.done:
                session.cancel()

    return app
