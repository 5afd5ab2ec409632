"""Running the application with uvicorn: in the foreground (``serve``, what the command line
does) or on a background thread (``BackgroundServer``: tests and the serving notebook).

In the foreground uvicorn handles Ctrl-C and SIGTERM: it stops accepting connections, lets the
requests in flight finish (for up to ``drain_timeout_s``; those still running then are
cancelled), and the application's shutdown stops the engine thread once it is idle.  ``serve``
then returns the signal that stopped it (uvicorn itself would raise it again, so that a drained
server still died of SIGTERM; the command line exits 0 after SIGTERM and 130 after Ctrl-C).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn's server, remembering the first signal that stopped it instead of raising it
    again after the drain (``handle_exit`` and ``capture_signals`` are uvicorn's documented
    hooks for subclasses; nothing private is read)."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.stopped_by: int | None = None

    def handle_exit(self, sig: int, frame) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit)
                     for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


#: what ``serve`` and ``BackgroundServer`` allow unless told otherwise: connections served at
#: once (more get a 503), and how long an idle keep-alive connection stays open
LIMIT_CONCURRENCY = 512
TIMEOUT_KEEP_ALIVE_S = 5.0


#: the event loop and HTTP parser under the server, by name: "auto" is uvicorn's choice
#: (uvloop and httptools, installed with the package, where the platform has them: every
#: streamed chunk costs the event loop less, and the engine thread shares the interpreter with
#: it), "python" the standard library's asyncio loop and the pure-Python h11
IO = {"auto": ("auto", "auto"), "python": ("asyncio", "h11")}


def _config(app, host: str, port: int, drain_timeout_s: float, log_level: str,
            limit_concurrency: int | None, timeout_keep_alive_s: float, io: str = "auto"):
    if io not in IO:
        raise ValueError(f"io={io!r}: choose one of {', '.join(IO)}")
    loop, http = IO[io]
    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          timeout_graceful_shutdown=drain_timeout_s, lifespan="on",
                          limit_concurrency=limit_concurrency,
                          timeout_keep_alive=timeout_keep_alive_s, loop=loop, http=http)


def io_in_use(io: str = "auto") -> str:
    """The event loop and HTTP parser that ``io`` gives here, in words ("uvloop + httptools")."""
    import importlib.util

    if io == "python":
        return "asyncio + h11"
    have = {name: importlib.util.find_spec(name) is not None for name in ("uvloop", "httptools")}
    return (("uvloop" if have["uvloop"] else "asyncio") + " + "
            + ("httptools" if have["httptools"] else "h11"))


def serve(app, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = 30.0,
          log_level: str = "info", limit_concurrency: int | None = LIMIT_CONCURRENCY,
          timeout_keep_alive_s: float = TIMEOUT_KEEP_ALIVE_S) -> int | None:
    """Serve until Ctrl-C or SIGTERM, then drain; return the signal's number.
    ``limit_concurrency``: connections (and requests) served at once, more are answered 503;
    ``timeout_keep_alive_s``: an idle keep-alive connection is closed after this long."""
    server = _Server(_config(app, host, port, drain_timeout_s, log_level, limit_concurrency,
                             timeout_keep_alive_s))
    server.run()
    return server.stopped_by


class BackgroundServer:
    """``app`` served on 127.0.0.1 at a free port, on a daemon thread.

        with BackgroundServer(app) as server:
            openai.OpenAI(base_url=server.url + "/v1", api_key="none")

    Leaving the block (or ``stop()``) shuts it down the way SIGTERM does."""

    def __init__(self, app, host: str = "127.0.0.1", drain_timeout_s: float = 10.0,
                 log_level: str = "warning", start_timeout_s: float = 60.0,
                 limit_concurrency: int | None = LIMIT_CONCURRENCY,
                 timeout_keep_alive_s: float = TIMEOUT_KEEP_ALIVE_S, io: str = "auto"):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.host, self.port = self._socket.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._server = _Server(_config(app, host, self.port, drain_timeout_s, log_level,
                                       limit_concurrency, timeout_keep_alive_s, io))
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                self.stop()
                raise RuntimeError("the server stopped while starting: its application's "
                                   "startup failed (uvicorn logged why above)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start within {start_timeout_s} s")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 60.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> "BackgroundServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
