"""Tokens to text, and to the callers' callbacks.

``detokenize`` runs inside the step's commit: each new token's text piece is appended to its
request (``Request.text_pieces``), and a request that finishes also gets whatever bytes the
incremental detokenizer still held, so the pieces add up to ``tokenizer.decode(output_ids)``.
``dispatch`` runs after the commit: each request's ``on_token`` callback, whose exception
cancels that request and is kept for the call that submitted it to re-raise.
"""

from __future__ import annotations

from typing import Callable

from paged_tutorial.engine.interrupts import SIGNALS, from_signal
from paged_tutorial.engine.request import Request, RequestError, Status


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def detokenize(self, requests: list[Request], token_ids: list[int],
                   fail: Callable[[Request, str], None]) -> None:
        """Append each new token's text piece; a detokenizer that fails is that request's own
        fault: ``fail(request, message)`` finishes it, the others go on."""
        for request, token in zip(requests, token_ids):
            if request.detokenizer is None:
                request.text_pieces.append("")
                continue
            try:
                piece = request.detokenizer.step(int(token))
                if request.status is Status.FINISHED:
                    piece += self.held_back(request, piece)
            except Exception as exc:             # noqa: BLE001 - this request's own fault
                request.text_pieces.append("")
                fail(request, str(RequestError(request, exc)))
                continue
            request.text_pieces.append(piece)

    def held_back(self, request: Request, piece: str = "") -> str:
        """The text the detokenizer has not emitted yet for a finished request (the bytes of
        a character its last token cut in half), so that the pieces add up to the decode."""
        emitted = request.text + piece
        full = self.tokenizer.decode(request.output_ids)
        return full[len(emitted):] if full.startswith(emitted) else ""

    def flush(self, request: Request) -> None:
        """A request that finished without a new token: its last piece is what was held."""
        if request.detokenizer is None or not request.output_ids:
            return
        try:
            rest = self.held_back(request)
        except Exception:                        # noqa: BLE001 - nothing more to show
            return
        if rest:
            request.text_pieces.append(rest)

    @staticmethod
    def dispatch(requests: list[Request], token_ids: list[int],
                 cancel: Callable[[Request], None]) -> None:
        """Run on_token callbacks after the step has committed.  A callback's exception
        (KeyboardInterrupt included: it was raised by that caller's code) cancels its
        request (``cancel(request)``) and is kept for the call that submitted it to re-raise,
        in its own thread; Ctrl-C itself propagates at once."""
        for request, token in zip(requests, token_ids):
            if request.on_token is None or request.callback_error is not None:
                continue
            try:
                request.on_token(request.request_id, int(token), request.text_pieces[-1])
            except BaseException as exc:      # noqa: BLE001 - handed to the caller
                if from_signal(exc):              # Ctrl-C: the stepping thread's
                    raise
                request.callback_error = exc
                with SIGNALS.critical():
                    cancel(request)
