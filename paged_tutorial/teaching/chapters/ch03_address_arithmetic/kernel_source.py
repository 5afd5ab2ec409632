"""Show the article's kernel as the package runs it: ``attention.py``'s decode kernel and its body
parts ``walk_blocks`` and ``token_score``, cut into pieces at their ``# --- kernels.cu:NNN-MMM``
annotations, each piece next to the article's lines and section, with the smaller device
functions it calls (``KernelParts``) below it.

    from paged_tutorial.teaching.chapters.ch03_address_arithmetic.kernel_source import (
        kernel_source, departures)
    kernel_source(480)          # the piece that holds kernels.cu:480, and block_table_index
    kernel_source("509-522")    # the online softmax and the in-place store
    departures()                # where the port differs from the article, and why
    departures("486-508")       # ... only where it concerns those kernels.cu lines

Both return objects that Jupyter shows syntax-highlighted (HTML, through Pygments when it is
installed) and that print as plain text anywhere else.  The source is read from the module
itself, so what is shown is the code that runs.
"""

from __future__ import annotations

import html
import inspect
import re
import textwrap
from dataclasses import dataclass

from paged_tutorial.backends.numba_cuda.kernels import attention

#: the article's sections that read the kernel, by kernels.cu line range (section titles are
#: the article's own, cited as they are)
_KERNEL = "pagedAttentionKernel: 네 상태를 함께 받는 유일한 커널"
_ADDRESSES = "논리 블록 → 물리 블록 → 바이트 주소"
_SCORE = "점수 하나: 워프 셔플 리덕션"
_SOFTMAX = "online softmax: 블록을 훑으며 가중 평균"
_IN_PLACE = "출력은 입력 자리에: in-place"
ARTICLE_SECTIONS = (
    (461, 469, _KERNEL), (470, 472, _ADDRESSES), (473, 477, _SOFTMAX), (478, 485, _ADDRESSES),
    (486, 508, _SCORE), (509, 521, _SOFTMAX), (522, 527, _IN_PLACE),
)
#: the device functions a piece may call, listed under it (the body parts walk_blocks and
#: token_score are cut into pieces of their own instead)
PART_NAMES = ("blocks_to_read", "block_table_index", "tokens_in_block", "k_index",
              "combine_warps", "softmax_update", "write_output")
#: the body parts whose source is cut into pieces at their own markers, after the kernel's
BODY_PARTS = ("walk_blocks", "token_score")
_MARKER = re.compile(r"^\s*# --- kernels\.cu:(\d+)(?:-(\d+))?(?:,\s*\d+)*: (.*?) -*\s*$")


@dataclass(frozen=True)
class SourcePiece:
    first: int                     # kernels.cu lines this piece ports
    last: int
    title: str
    section: str                   # the article's section that reads these lines
    code: str
    parts: tuple[str, ...]         # sources of the device functions the piece calls
    body: str = ""                 # the body part its source comes from ("" for the kernel's)

    @property
    def lines(self) -> str:
        return f"kernels.cu:{self.first}" + (f"-{self.last}" if self.last != self.first else "")


def section_of(line: int) -> str:
    return next((title for first, last, title in ARTICLE_SECTIONS if first <= line <= last), "")


def _kernel_text() -> str:
    source = inspect.getsource(attention.build_kernel)
    start = source.index("    @cached_kernel")
    end = source.index("    return paged_attention_kernel")
    return textwrap.dedent(source[start:end]).rstrip() + "\n"


def _split(lines: list[str], head: tuple) -> list:
    """(head, lines) per ``# --- kernels.cu`` marker; what comes before the first marker goes
    with ``head`` (None: into the first marked piece)."""
    pieces, current = [], []
    for line in lines:
        match = _MARKER.match(line)
        if match and (current and (head is not None or pieces)):
            pieces.append((head, current))
            current = []
        if match:
            first = int(match.group(1))
            head = (first, int(match.group(2) or first), match.group(3).strip())
        current.append(line)
    pieces.append((head, current))
    return pieces


def kernel_pieces(parts=attention.ARTICLE_PARTS) -> list[SourcePiece]:
    """The decode kernel's source and its body parts' (``walk_blocks``, ``token_score``, as
    ``parts`` has them), one piece per ``kernels.cu`` annotation, in kernels.cu order."""
    pieces = [(head, lines, "") for head, lines in
              _split(_kernel_text().splitlines(), (461, 461, "the signature: the kernel's arguments"))]
    for name in BODY_PARTS:
        source = textwrap.dedent(inspect.getsource(getattr(parts, name)))
        pieces += [(head, lines, name) for head, lines in
                   _split(source.rstrip().splitlines(), None)]
    out = []
    for (first, last, title), body, origin in pieces:
        code = "\n".join(body).strip("\n") + "\n"
        called = tuple(inspect.getsource(getattr(attention, name)) for name in PART_NAMES
                       if re.search(rf"\b{name}\(", code))
        out.append(SourcePiece(first, last, title, section_of(first), code, called, origin))
    return sorted(out, key=lambda p: p.first)


def _select(pieces, lines) -> list[SourcePiece]:
    if lines is None:
        return pieces
    if isinstance(lines, int):
        lo = hi = lines
    else:
        text = str(lines).replace("kernels.cu:", "")
        lo, _, hi = text.partition("-")
        lo, hi = int(lo), int(hi or lo)
    chosen = [p for p in pieces if p.first <= hi and lo <= p.last]
    if not chosen:
        known = ", ".join(p.lines for p in pieces)
        raise ValueError(f"no piece of the kernel ports kernels.cu:{lines}; pieces: {known}")
    return chosen


def _highlight(code: str) -> str:
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
    except ImportError:
        return f"<pre>{html.escape(code)}</pre>"
    return highlight(code, PythonLexer(), HtmlFormatter(noclasses=True, nowrap=False))


class KernelListing:
    """Pieces of the kernel; shown highlighted in Jupyter, as plain text elsewhere."""

    def __init__(self, pieces: list[SourcePiece]):
        self.pieces = pieces

    def __str__(self) -> str:
        blocks = []
        for p in self.pieces:
            head = f"== {p.lines}: {p.title}" + (f"  [article: {p.section}]" if p.section else "")
            body = p.code
            for part in p.parts:
                body += "\n# the device function it calls (attention.py):\n" + part
            blocks.append(f"{head}\n{body}")
        return "\n".join(blocks)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        out = []
        for p in self.pieces:
            section = f" &mdash; the article's section <i>{html.escape(p.section)}</i>" \
                if p.section else ""
            out.append(f"<p><b>{html.escape(p.lines)}</b>: {html.escape(p.title)}{section}</p>")
            out.append(_highlight(p.code))
            for part in p.parts:
                out.append("<p style='margin-left:2em'>the device function it calls "
                           "(<code>attention.py</code>):</p>")
                out.append(f"<div style='margin-left:2em'>{_highlight(part)}</div>")
        return "\n".join(out)


def kernel_source(lines: int | str | None = None, with_parts: bool = True,
                  parts=attention.ARTICLE_PARTS, solved=None) -> KernelListing:
    """The pieces of the decode kernel that port ``lines`` of kernels.cu (an int, "470-485",
    or None for the whole kernel), with the device functions they call (``with_parts``);
    ``parts`` (``attention.KernelParts``) chooses the body parts shown, e.g.
    ``attention.ARTICLE_LAYOUT_PARTS`` for the article's own score hand-off.

    What a puzzle she has not solved yet asks her to write is folded (``fold``): its part's
    body, and any line elsewhere that is one of its worked solution's lines.  ``solved``: the
    names of the puzzles solved (by default, those her progress record holds as solved)."""
    pieces = _select(kernel_pieces(parts), lines)
    if not with_parts:
        pieces = [SourcePiece(p.first, p.last, p.title, p.section, p.code, (), p.body)
                  for p in pieces]
    return KernelListing(fold(pieces, solved_puzzles() if solved is None else set(solved),
                              article_version=parts is not attention.ARTICLE_PARTS))


#: the body parts and device functions a puzzle asks her to write: name -> puzzle
PUZZLE_OF_PART = {"walk_blocks": "03.walk_blocks", "token_score": "04.token_score",
                  "block_table_index": "02.table_index", "k_index": "03.k_index",
                  "softmax_update": "05.softmax_update", "write_output": "05.write_output"}


def solved_puzzles() -> set[str]:
    """The puzzles her progress record holds as solved."""
    from paged_tutorial.teaching.exercises.progress import known

    return {name for name, entry in known().items() if entry.get("status") == "correct"}


def _folded_note(puzzle: str) -> str:
    from paged_tutorial.teaching.chapters import puzzle as puzzle_named

    return (f"folded until you solve {puzzle}: {puzzle_named(puzzle).title.en} "
            f"(pt.exercises.reveal({puzzle!r}) unfolds it)")


#: a function's docstring, right after its (possibly multi-line) signature
_DOCSTRING = re.compile(r'(def \w+\([^)]*\)[^:\n]*:\n)[ \t]*(?:"""|\'\'\')[\s\S]*?(?:"""|\'\'\')[ \t]*\n')


def _fold_lines(code: str, hidden: dict[str, set[str]]) -> str:
    from paged_tutorial.teaching.answer_lines import holds

    out, last = [], None
    for line in code.splitlines():
        owner = next((name for name, lines in hidden.items() if holds(line, lines)), None)
        if owner is None:
            out.append(line)
        elif owner != last or not out[-1].lstrip().startswith("..."):
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}...   # {_folded_note(owner)}")
        last = owner
    return "\n".join(out) + ("\n" if code.endswith("\n") else "")


def _fold_function(source: str, puzzle: str) -> str:
    """A device function's signature and what it must achieve, without its body."""
    lines = textwrap.dedent(source).splitlines()
    head = []
    for line in lines:
        head.append(line)
        if line.rstrip().endswith(":") and not line.lstrip().startswith("@"):
            break
    return "\n".join(head) + f"\n    ...   # {_folded_note(puzzle)}\n"


def fold(pieces: list[SourcePiece], solved: set[str],
         article_version: bool = False) -> list[SourcePiece]:
    """``pieces`` with what an unsolved puzzle asks for folded: a body part of the package's
    kernel to its marker line, a device function to its signature, and any line that is one of
    an unsolved puzzle's worked solution's lines to ``...`` with the puzzle named.  The
    article's own version of a body part (``article_version``) stays shown, as the puzzle asks
    what it gets wrong, except for those lines."""
    hidden = _hidden(solved)
    out = []
    for p in pieces:
        code = p.code
        owner = PUZZLE_OF_PART.get(p.body)
        if p.body:
            code = _DOCSTRING.sub(r"\1", code)
        if owner is not None and owner not in solved and not article_version:
            lines = code.splitlines()
            at = next((i for i, line in enumerate(lines) if _MARKER.match(line)), 0)
            marker = lines[at] if lines else ""
            indent = marker[:len(marker) - len(marker.lstrip())]
            code = "\n".join(lines[:at + 1]) + f"\n{indent}...   # {_folded_note(owner)}\n"
        else:
            code = _fold_lines(code, hidden)
        parts = []
        for source in p.parts:
            name = re.search(r"def (\w+)", source).group(1)
            owner = PUZZLE_OF_PART.get(name)
            parts.append(_fold_function(source, owner) if owner and owner not in solved
                         else _fold_lines(source, hidden))
        out.append(SourcePiece(p.first, p.last, p.title, p.section, code, tuple(parts), p.body))
    return out


def _told(d, hidden: dict[str, set[str]] | None = None) -> str:
    """A departure's text for the page: how the port does it, unless that is what the reader
    writes in a puzzle (then the puzzle is named and the fix stays hers to find), or its text
    holds a line of an unsolved puzzle's worked solution (``hidden``: then only the puzzle is
    named)."""
    from paged_tutorial.teaching.answer_lines import found_in

    if d.puzzle:
        return (f"{d.text}  How the port does it is yours to write in puzzle {d.puzzle} "
                f"(pt.exercises.reveal({d.puzzle!r}) shows it).")
    for name, lines in (hidden or {}).items():
        if found_in(f"{d.text}\n{d.fix}", lines):
            return (f"How the port does it is folded until you solve puzzle {name}, where you "
                    f"write it (pt.exercises.reveal({name!r}) shows it).")
    return f"{d.text}  {d.fix}" if d.fix else d.text


def _hidden(solved) -> dict[str, set[str]]:
    """The worked solutions' lines of the puzzles not in ``solved`` (None: her record's)."""
    from paged_tutorial.teaching.answer_lines import puzzle_answer_lines

    solved = solved_puzzles() if solved is None else set(solved)
    return {name: lines for name, lines in puzzle_answer_lines().items()
            if name not in solved and lines}


class DepartureList:
    """``attention.DEPARTURES`` as a numbered list (HTML in Jupyter, text elsewhere); a fix the
    reader writes in a puzzle is named, not shown."""

    def __init__(self, items=attention.DEPARTURES, solved=None):
        self.items = tuple(items)
        self.hidden = _hidden(solved)

    def __str__(self) -> str:
        return "\n".join(f"{i}. {d.title} ({d.article}): {_told(d, self.hidden)}"
                         for i, d in enumerate(self.items, start=1))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        rows = "".join(f"<li><b>{html.escape(d.title)}</b> (<code>{html.escape(d.article)}"
                       f"</code>): {html.escape(_told(d, self.hidden))}</li>"
                       for d in self.items)
        return f"<ol>{rows}</ol>"


def _line_ranges(article: str) -> list[tuple[int, int]]:
    """``"kernels.cu:6, 16-19, 484-485"`` -> [(6, 6), (16, 19), (484, 485)]."""
    text = article.replace("kernels.cu:", "")
    out = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.strip().isdigit():
            out.append((int(lo), int(hi or lo)))
    return out


def departures(lines: int | str | None = None, solved=None) -> DepartureList:
    """Where the port in ``attention.py`` departs from the article's kernel, and why: all of
    them, or those that concern ``lines`` of kernels.cu (an int or "486-508").  A departure
    whose words hold a line of a puzzle not yet ``solved`` (by default: her record's) names
    the puzzle instead."""
    if lines is None:
        return DepartureList(solved=solved)
    text = str(lines).replace("kernels.cu:", "")
    lo, _, hi = text.partition("-")
    lo, hi = int(lo), int(hi or lo)
    chosen = [d for d in attention.DEPARTURES
              if any(a <= hi and lo <= b for a, b in _line_ranges(d.article))]
    return DepartureList(chosen, solved=solved)
