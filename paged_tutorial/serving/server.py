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
    """uvicorn's server, keeping the signals it drained for instead of raising them again."""

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

    @property
    def stopped_by(self) -> int | None:
        return self._captured_signals[0] if self._captured_signals else None


def _config(app, host: str, port: int, drain_timeout_s: float, log_level: str,
            limit_concurrency: int | None = None, timeout_keep_alive_s: float = 5.0):
    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          timeout_graceful_shutdown=drain_timeout_s, lifespan="on",
                          limit_concurrency=limit_concurrency,
                          timeout_keep_alive=timeout_keep_alive_s)


def serve(app, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = 30.0,
          log_level: str = "info", *, limit_concurrency: int | None = None,
          timeout_keep_alive_s: float = 5.0) -> int | None:
    """Serve until Ctrl-C or SIGTERM, then drain; return the signal's number.
    ``limit_concurrency``: connections served at once (more get 503);
    ``timeout_keep_alive_s``: an idle keep-alive connection is closed after this."""
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
                 log_level: str = "warning", start_timeout_s: float = 60.0):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        self.host, self.port = self._socket.getsockname()[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._server = _Server(_config(app, host, self.port, drain_timeout_s, log_level))
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._socket]},
                                        name="uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
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
