"""Text a tokenizer can take: Python strings may hold lone surrogates (U+D800-U+DFFF), halves of
UTF-16 pairs that are not characters and have no UTF-8 encoding.  They usually come from bytes
decoded with ``errors="surrogateescape"`` -- which is how Python hands over a command-line
argument or a file name that is not valid in the locale's encoding: the byte 0xE9 becomes
U+DCE9.  The tokenizer library refuses them with a message about its own types; this module
finds the first one and says where it is and what to do."""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def find_lone_surrogate(text: str) -> tuple[int, str] | None:
    """(position, character) of the first lone surrogate in ``text``, or None."""
    match = _SURROGATE.search(text)
    return None if match is None else (match.start(), match.group())


def escaped_byte(char: str) -> int | None:
    """The byte a surrogate escape stands for (U+DC80-U+DCFF -> 0x80-0xFF), else None."""
    return ord(char) - 0xDC00 if 0xDC80 <= ord(char) <= 0xDCFF else None


def check_text(text: str, what: str = "text") -> str:
    """``text`` unchanged, or a ValueError naming the first lone surrogate, its position and
    the fix."""
    found = find_lone_surrogate(text)
    if found is None:
        return text
    position, char = found
    byte = escaped_byte(char)
    origin = (f"it stands for the byte 0x{byte:02X} of text decoded with "
              "errors='surrogateescape'" if byte is not None
              else "it is half of a UTF-16 surrogate pair")
    raise ValueError(
        f"{what} holds a lone surrogate {ascii(char)} (U+{ord(char):04X}) at position "
        f"{position}, which is not a character and cannot be tokenized ({origin}): decode the "
        "original bytes with their real encoding (for example bytes.decode('latin-1') or "
        "'cp1252'), or remove the character")
