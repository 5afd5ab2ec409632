"""What every puzzle shares: the ``Puzzle`` record, how a reader's function is called on the
host (``host_call``), how its results are typed (``need_int``), and how it is compiled the way
the GPU will compile it (``check_compiles``).

A grader raises ``Wrong`` (with a message and, optionally, a figure) or ``Unsolved`` as soon as
it knows; ``Puzzle.grade`` turns either into a ``Verdict``.
"""

from __future__ import annotations

import inspect
import numbers
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from paged_tutorial.teaching.verdict import Verdict, unsolved


class Wrong(Exception):
    """The reader's function gave a wrong result; ``figure`` draws what went wrong."""

    def __init__(self, message: str, figure: Callable[[], Any] | None = None):
        super().__init__(message)
        self.message = message
        self.figure = figure


class Unsolved(Exception):
    """The reader's function is still the stub (returns None or raises NotImplementedError)."""


@dataclass(frozen=True)
class Puzzle:
    """A function for the reader to write, graded by running it where it belongs."""

    name: str                          # "NN.short_name", NN = the notebook
    title: str
    signature: str                     # "def k_index(physical_block, token, ...):"
    docstring: str
    hint: str
    runs_in: str                       # where the grader runs the reader's function
    article: str                       # the article's lines it replaces (src/...:line)
    grader: Callable[[Callable], Any]  # the success message (or (message, figure)), raises
    #                                    Wrong/Unsolved

    @property
    def function_name(self) -> str:
        return self.signature.split("(")[0].replace("def", "").strip()

    @property
    def parameters(self) -> list[str]:
        inside = self.signature[self.signature.index("(") + 1:self.signature.rindex(")")]
        return [p.strip() for p in inside.split(",") if p.strip()]

    def stub(self) -> str:
        """Source of the function to fill in: signature, docstring, a body of ``...``."""
        doc = textwrap.indent(f'"""{str(self.docstring).strip()}\n"""', "    ")
        return f"{self.signature}\n{doc}\n    ...   # your code\n"

    def describe(self) -> str:
        """Everything the reader needs, as text."""
        return (f"{self.name}: {self.title}\n\n{self.stub()}\nHint: {self.hint}\n"
                f"Graded by running it in {self.runs_in} (replaces {self.article}).")

    def grade(self, answer) -> Verdict:
        if unsolved(answer):
            return Verdict("unsolved", f"write {self.function_name} and pass the function itself")
        if not callable(answer):
            return Verdict("wrong", f"the answer to a puzzle is a function ({self.signature[4:]}"
                           f"), got a {type(answer).__name__}")
        problem = _signature_problem(answer, self.parameters)
        if problem:
            return Verdict("wrong", problem)
        try:
            message = self.grader(answer)
        except Unsolved as done:
            return Verdict("unsolved", str(done) or
                           f"{self.function_name} still returns nothing: write its body")
        except Wrong as wrong:
            return Verdict("wrong", wrong.message, wrong.figure)
        figure = None
        if isinstance(message, tuple):          # a picture of the run, drawn on success too
            message, figure = message
        return Verdict("correct", message, figure)


def _signature_problem(fn, parameters: list[str]) -> str | None:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) != len(parameters) or any(
            p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return (f"the function takes {len(positional)} argument(s); the kernel calls it with "
                f"{len(parameters)}: ({', '.join(parameters)})")
    return None


def describe_args(names: list[str], args) -> str:
    return ", ".join(f"{n}={_short(a)}" for n, a in zip(names, args))


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"<array {value.shape}>"
    text = repr(value)
    return text if len(text) <= 30 else text[:27] + "..."


def host_call(fn: Callable, args: tuple, names: list[str], allow_none: bool = False):
    """Call the reader's plain-Python function on the host.  None (the stub's ``...``) or
    NotImplementedError means not solved yet; any other exception is a wrong answer that names
    the call."""
    try:
        value = fn(*args)
    except (Wrong, Unsolved):
        raise
    except NotImplementedError:
        raise Unsolved() from None
    except Exception as exc:      # the reader's code may raise anything: report it
        raise Wrong(f"your function raised {type(exc).__name__}: {exc} (called with "
                    f"{describe_args(names, args)})") from None
    if value is None and not allow_none:
        raise Unsolved()
    return value


def need_int(value, what: str, call: str) -> int:
    """``value`` as an int, or ``Wrong`` saying why a kernel cannot use it as an index."""
    if isinstance(value, (bool, np.bool_)):
        raise Wrong(f"{what} is {value!r}, a bool; the kernel needs an integer ({call})")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        raise Wrong(f"{what} is {value!r}, a {type(value).__name__}: an index must be an "
                    f"integer (use // rather than /) ({call})")
    raise Wrong(f"{what} is a {type(value).__name__} ({_short(value)}); the kernel needs one "
                f"integer ({call})")


def need_real(value, what: str, call: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise Wrong(f"{what} is {_short(value)} ({type(value).__name__}); the kernel needs a "
                    f"number ({call})")
    return float(value)


def check_compiles(fn: Callable, sample_args: tuple) -> None:
    """Compile ``fn`` with Numba for the sample arguments, as the GPU will compile it as a device
    function: code Numba cannot type (lists of mixed types, f-strings, dicts, classes...) is
    reported here, on every machine, not only on a GPU."""
    import numba
    from numba.core.errors import NumbaError

    try:
        numba.njit(cache=False)(fn)(*sample_args)
    except NumbaError as exc:
        first = str(exc).strip().splitlines()
        reason = next((line for line in first if line.strip() and "During:" not in line),
                      type(exc).__name__)
        raise Wrong(f"Numba cannot compile your function as a device function: {reason.strip()}."
                    "  Plain arithmetic on numbers, min/max, math.exp, if and for loops work; "
                    "Python lists, dicts, strings and classes do not") from None
    except Exception:
        # the host call already ran it; a runtime error here is not a compile problem
        return
