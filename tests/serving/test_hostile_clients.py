"""Hostile HTTP clients against a server on 127.0.0.1 (bounded counts and times): slow bodies
(408), bodies past the size limit (413), 1000 connections opened and dropped, 200 streams
cancelled mid-answer at random instants, malformed JSON at volume (400).  Afterwards the
server's memory has not grown past a bound, ``/metrics`` shows every block free, and a normal
request gets the same tokens as before the storm."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import time

import httpx
import pytest

import paged_tutorial as pt

pytest.importorskip("fastapi")

from paged_tutorial.serving.app import build_app  # noqa: E402
from paged_tutorial.serving.metrics import parse_metrics  # noqa: E402
from paged_tutorial.serving.server import BackgroundServer  # noqa: E402

NAME = "tiny-chat"
MAX_BODY_BYTES = 4096
BODY_TIMEOUT_S = 1.0
#: what the server's process may grow by over a whole storm, after a small one warmed it
RSS_GROWTH_BOUND = 64 * 2 ** 20


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def raw_exchange(port: int, head: bytes, body: bytes = b"", stall_s: float = 0.0,
                       read_timeout_s: float = 10.0) -> int | None:
    """Send ``head`` and ``body``, stay silent ``stall_s``, return the status answered (None
    if the server closed the connection without one)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        await writer.drain()
        if stall_s:
            await asyncio.sleep(stall_s)
        line = await asyncio.wait_for(reader.readline(), read_timeout_s)
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1") else None
    except (ConnectionError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


def post_head(length: int | None, chunked: bool = False) -> bytes:
    lines = ["POST /v1/completions HTTP/1.1", "Host: 127.0.0.1",
             "Content-Type: application/json"]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def slow_bodies(port: int, count: int) -> list:
    body = json.dumps({"model": NAME, "prompt": "hi", "max_tokens": 2}).encode()
    started = time.monotonic()
    statuses = await asyncio.gather(*(
        raw_exchange(port, post_head(len(body)), body[:5], read_timeout_s=BODY_TIMEOUT_S + 20)
        for _ in range(count)))
    return [statuses, time.monotonic() - started]


async def huge_bodies(port: int, count: int) -> list:
    declared = [raw_exchange(port, post_head(10 * MAX_BODY_BYTES), b"{" * 100)
                for _ in range(count)]
    chunk = b"x" * 1024
    streamed = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk)
                        for _ in range(2 * MAX_BODY_BYTES // 1024 + 1))
    undeclared = [raw_exchange(port, post_head(None, chunked=True), streamed)
                  for _ in range(count)]
    return await asyncio.gather(*declared, *undeclared)


async def open_and_drop(port: int, count: int, at_once: int = 100) -> None:
    rng = random.Random(1)
    for start in range(0, count, at_once):
        async def one(i):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if rng.random() < 0.5:                  # half of them leave a request half-sent
                writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            writer.transport.abort()
        await asyncio.gather(*(one(i) for i in range(start, min(count, start + at_once))))


async def cancelled_streams(url: str, count: int, at_once: int = 40) -> int:
    rng = random.Random(2)
    limit = asyncio.Semaphore(at_once)
    got_tokens = 0

    async def one(http, i):
        nonlocal got_tokens
        body = {"model": NAME, "prompt": f"story {i}", "max_tokens": 60, "temperature": 0,
                "stream": True, "ignore_eos": True}
        chunks_to_read = rng.randrange(0, 12)
        delay = rng.random() * 0.2
        async with limit:
            try:
                async with http.stream("POST", url + "/v1/completions", json=body) as response:
                    read = 0
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            read += 1
                            got_tokens += 1
                        if read >= chunks_to_read:
                            break
                    await asyncio.sleep(delay)
            except httpx.HTTPError:
                pass

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=at_once)) \
            as http:
        await asyncio.gather(*(one(http, i) for i in range(count)))
    return got_tokens


async def malformed(url: str, count: int, at_once: int = 50) -> list[int]:
    rng = random.Random(3)
    shapes = [b"{not json", b"", b"[1, 2", b"\xff\xfe\x00", b'{"model": ', b"null", b"[]",
              b'{"model": "tiny-chat", "prompt": {"a": 1}}', b'"a string"',
              b'{"model": "tiny-chat", "prompt": "hi", "max_tokens": "ten"}']
    limit = asyncio.Semaphore(at_once)

    async def one(http):
        async with limit:
            body = rng.choice(shapes) + bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
            response = await http.post(url + "/v1/completions", content=body,
                                       headers={"content-type": "application/json"})
            assert "error" in response.json()
            return response.status_code

    # each body on a connection of its own: a pooled connection the server has just closed
    # for idling past its keep-alive (a client's race, not the server's answer) fails a send
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=no_reuse) as http:
        return await asyncio.gather(*(one(http) for _ in range(count)))


def storm(server, scale: float) -> dict:
    port, url = server.port, server.url

    async def everything():
        n = lambda count: max(1, int(count * scale))      # noqa: E731
        slow, huge, _, streamed, bad = await asyncio.gather(
            slow_bodies(port, n(20)), huge_bodies(port, n(10)), open_and_drop(port, n(1000)),
            cancelled_streams(url, n(200)), malformed(url, n(500)))
        return {"slow": slow, "huge": huge, "streamed": streamed, "malformed": bad}

    return asyncio.run(asyncio.wait_for(everything(), 150))


def wait_idle(url: str, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        m = parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
        if m["num_requests_running"] == 0 and m["num_requests_waiting"] == 0:
            return m
        assert time.monotonic() < deadline, f"the server did not go idle: {m}"
        time.sleep(0.05)


def test_a_storm_of_hostile_clients_leaves_the_server_serving_with_every_block_free(tiny_model):
    engine = pt.Engine(tiny_model, backend="torch", max_slots=8, max_seq_len=128)
    app = build_app(engine, NAME, max_body_bytes=MAX_BODY_BYTES, body_timeout_s=BODY_TIMEOUT_S)
    normal = {"model": NAME, "prompt": "The block table maps", "max_tokens": 12,
              "temperature": 0, "ignore_eos": True}
    with BackgroundServer(app, limit_concurrency=512, timeout_keep_alive_s=2.0) as server:
        before = httpx.post(server.url + "/v1/completions", json=normal, timeout=60).json()
        storm(server, scale=0.1)                     # warms every path's allocations
        wait_idle(server.url)
        gc.collect()
        rss_warm = rss_bytes()
        started = time.monotonic()
        seen = storm(server, scale=1.0)
        storm_s = time.monotonic() - started
        after_metrics = wait_idle(server.url)
        gc.collect()
        rss_after = rss_bytes()
        after = httpx.post(server.url + "/v1/completions", json=normal, timeout=60).json()
        assert httpx.get(server.url + "/health").status_code == 200

    slow_statuses, slow_s = seen["slow"]
    assert slow_statuses == [408] * 20
    assert slow_s < BODY_TIMEOUT_S + 15
    assert seen["huge"] == [413] * 20
    assert seen["streamed"] > 0
    assert set(seen["malformed"]) == {400} and len(seen["malformed"]) == 500
    assert after_metrics["num_free_blocks"] == after_metrics["num_blocks"]
    assert after_metrics["requests_cancelled_total"] > 0
    assert engine.num_requests == 0
    assert after["choices"][0]["text"] == before["choices"][0]["text"]
    assert rss_after - rss_warm < RSS_GROWTH_BOUND, (rss_warm, rss_after)
    assert storm_s < 150
