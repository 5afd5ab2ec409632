"""Stop strings over a stream of text pieces: what may be shown now, and where the answer ends.

``StopText(stop)`` receives an answer's text piece by piece (``add``) and returns the part that
can be released: text is held back while it could still be the start of a stop string
(``len(longest stop) - 1`` characters at most), and when a stop string appears the answer's
text ends just before it.  The pieces come from the engine's incremental detokenizer, which
only ever hands out whole characters, so a stop string is matched on characters: one whose
UTF-8 bytes are spread over several tokens is found once its last character is complete, and
nothing released ever ends inside a character.
"""

from __future__ import annotations


class StopText:
    def __init__(self, stop: list[str]):
        self.stop = list(stop)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""                          # the answer so far (ends before a stop string)
        self.released = 0                       # characters of ``text`` handed out
        self.stop_reason: str | None = None     # the stop string found, once found

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def add(self, piece: str, look: bool = True) -> str:
        """Take the next piece; return the text that can be shown now.  ``look=False``: the
        piece cannot end the answer (``min_tokens`` not reached); a stop string may still begin
        in its last characters and end in a later piece."""
        if self.stopped:
            return ""
        start = max(0, len(self.text) - self.hold)    # a match may begin in the held text
        self.text += piece
        if not look:
            return self._release(len(self.text) - self.hold)
        found = [(self.text.find(s, start), s) for s in self.stop]
        found = [(at, s) for at, s in found if at >= 0]
        if found:
            at, self.stop_reason = min(found, key=lambda hit: hit[0])
            self.text = self.text[:at]
            return self.flush()
        return self._release(len(self.text) - self.hold)

    def flush(self) -> str:
        """The answer has ended: release what was held back."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        upto = max(upto, self.released)
        out = self.text[self.released:upto]
        self.released = upto
        return out
