"""TokenStream: one request's text, piece by piece, as the engine produces it."""

from __future__ import annotations

from paged_tutorial.engine.request import Request
from paged_tutorial.engine.request_registry import GenerationResult


class TokenStream:
    """The text of one request, piece by piece, as the engine produces it.

    Iterating steps the engine (other requests in it advance too).  ``close()`` -- or leaving
    a ``for`` loop early and dropping the stream, or a ``with`` block -- cancels the request if
    it is still running and frees its blocks.  ``result`` is the GenerationResult once the
    request has ended; its ``text`` is exactly what was streamed."""

    def __init__(self, engine, request: Request):
        """``engine``: the Engine that runs ``request`` (its public step, cancel and
        pop_result are all a stream uses)."""
        self.engine = engine
        self.request = request
        self.cursor = 0
        self.result: GenerationResult | None = None
        if request.finished:
            self.end()

    @property
    def request_id(self) -> int:
        return self.request.request_id

    def __iter__(self) -> "TokenStream":
        return self

    def __next__(self) -> str:
        request = self.request
        while True:
            if self.cursor < len(request.text_pieces):
                piece = request.text_pieces[self.cursor]
                self.cursor += 1
                if piece:
                    return piece
                continue
            if request.finished:
                self.end()
                raise StopIteration
            try:
                self.engine.step()
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Cancel the request if it has not finished; keep the result (the engine forgets the
        request: now, or at its next step when this runs inside one)."""
        if self.result is None:
            if not self.request.finished:
                self.engine.cancel(self.request_id, forget=True)
                if self.request.finished:
                    self.result = GenerationResult.of(self.request)
            else:
                self.end()

    def end(self) -> None:
        """The request has finished: take its result (the engine forgets it)."""
        if self.result is None:
            self.result = self.engine.pop_result(self.request_id)

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:           # interpreter shutdown: nothing left to free
            pass
