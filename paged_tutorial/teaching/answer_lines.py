"""The lines a puzzle's worked solution is made of, in a form that spacing, comments and the
case of a name do not hide.

A line of code is reduced to its tokens, names in lower case, comments dropped, so
``kv_head = q_head // q_per_kv`` and ``kv_head  =  q_head//Q_PER_KV  # GQA`` read the same.  A
line too small to give anything away (``return acc``, ``k = float32(0.0)``, a line without
arithmetic or a comparison) is not kept.  ``kernel_source`` folds a line of the engine's source that is one of an unsolved
puzzle's lines; the page test looks for them in every notebook, docstring and hint.
"""

from __future__ import annotations

import inspect
import io
import keyword
import textwrap
import tokenize

#: a line is kept when its reduced form has at least this many tokens...
MIN_TOKENS = 5
#: ...and does some arithmetic or comparison (a bare call or assignment gives nothing away)
OPERATORS = {"+", "-", "*", "/", "//", "%", "+=", "-=", "*=", "/=", "<", ">", "<=", ">=", "==",
             "!="}


def tokens_of(line: str) -> list[str] | None:
    """``line``'s tokens, names in lower case, comments and spacing dropped; None when it is not
    one line of Python."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    out = []
    for token in tokens:
        if token.type == tokenize.NAME and not keyword.iskeyword(token.string):
            out.append(token.string.lower())
        elif token.type in (tokenize.OP, tokenize.NUMBER, tokenize.NAME):
            out.append(token.string)
    return out


def _telling(tokens: list[str]) -> str | None:
    if len(tokens) < MIN_TOKENS or not OPERATORS & set(tokens) or tokens[0] in ("def", "class"):
        return None
    return " ".join(tokens)


def reduced(line: str) -> str | None:
    """``line`` as tokens (``tokens_of``) joined by spaces; None when it is too small to give an
    answer away or is not one line of Python."""
    tokens = tokens_of(line)
    return None if tokens is None else _telling(tokens)


def fragments(line: str) -> set[str]:
    """``line``'s reduced form and that of every argument of a call in it that gives something
    away on its own (the address inside ``store(q, <address>, value)``)."""
    tokens = tokens_of(line)
    if tokens is None:
        return set()
    found = {_telling(tokens)}
    if tokens[0] == "return":
        found.add(_telling(tokens[1:]))
    for sign in ("=", "+=", "-=", "*=", "/="):
        if sign in tokens:
            found.add(_telling(tokens[tokens.index(sign) + 1:]))
    stack: list[list[list[str]]] = []
    for token in tokens:
        if token in "([":
            stack.append([[]])
            continue
        if token in ")]" and stack:
            arguments = stack.pop()
            found.update(_telling(a) for a in arguments)
            token_list = [t for a in arguments for t in a]
            if stack:
                stack[-1][-1] += ["("] + token_list + [")"]
            continue
        if token == "," and stack:
            stack[-1].append([])
        elif stack:
            stack[-1][-1].append(token)
    return {f for f in found if f is not None}


def code_lines(source: str) -> list[str]:
    """The lines of ``source`` outside docstrings and comments, as written."""
    source = textwrap.dedent(source)
    strings = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.STRING:
                strings.update(range(token.start[0], token.end[0] + 1))
    except (tokenize.TokenError, IndentationError):
        pass
    return [line for number, line in enumerate(source.splitlines(), start=1)
            if number not in strings and line.strip() and not line.strip().startswith("#")]


def answer_lines(code) -> set[str]:
    """The reduced lines of ``code`` (a function, a class, or their source)."""
    if not isinstance(code, str):
        code = getattr(code, "code", code)
        code = getattr(code, "py_func", code)
        code = inspect.getsource(code)
    return {f for line in code_lines(code) for f in fragments(line)}


def puzzle_answer_lines() -> dict[str, set[str]]:
    """Every puzzle's name -> the reduced lines of its worked solution."""
    from paged_tutorial.teaching import exercises
    from paged_tutorial.teaching.chapters import PUZZLES

    return {p.name: answer_lines(exercises.reveal(p.name)) for p in PUZZLES}


def found_in(text: str, lines: set[str]) -> list[str]:
    """The lines of ``text`` (code, or backticked code inside prose) that hold one of ``lines``
    (reduced lines or fragments, ``answer_lines``), token for token."""
    found = []
    for line in text.splitlines():
        pieces = line.split("`")[1::2] if "`" in line else [line]
        for piece in pieces:
            if holds(piece, lines):
                found.append(piece.strip())
    return found


def holds(line: str, lines: set[str]) -> bool:
    """Whether ``line`` holds one of ``lines`` (reduced lines or fragments), token for token."""
    tokens = tokens_of(line)
    if not tokens:
        return False
    text = f" {' '.join(tokens)} "
    return any(f" {fragment} " in text for fragment in lines)
