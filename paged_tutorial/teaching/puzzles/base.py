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

from paged_tutorial.teaching.language import Text, say
from paged_tutorial.teaching.verdict import Verdict, unsolved


#: the comment a stub's body carries, where the reader writes
STUB_COMMENT = Text(en="your code", ko="여기에 코드를 쓰세요")


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
    title: Text
    signature: str                     # "def k_index(physical_block, token, ...):"
    docstring: Text                    # shown in the stub, in the current language
    hint: Text
    runs_in: Text                      # where the grader runs the reader's function
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
        return f"{self.signature}\n{doc}\n    ...   # {STUB_COMMENT}\n"

    def describe(self) -> str:
        """Everything the reader needs, as text."""
        return say(en=f"{self.name}: {self.title}\n\n{self.stub()}\nHint: {self.hint}\n"
                      f"Graded by running it in {self.runs_in} (replaces {self.article}).",
                   ko=f"{self.name}: {self.title}\n\n{self.stub()}\n힌트: {self.hint}\n"
                      f"채점하는 곳: {self.runs_in}.\n대신하는 원본 코드: {self.article}.")

    def check_answer(self, answer) -> Verdict | None:
        """A verdict for an answer that is not a function the grader can call, else None."""
        if not callable(answer):
            return Verdict("wrong", say(
                en=f"the answer to a puzzle is a function ({self.signature[4:]}), got a "
                   f"{type(answer).__name__}",
                ko=f"퍼즐의 답은 함수입니다 ({self.signature[4:]}); {type(answer).__name__} 를 "
                   "받았습니다"))
        problem = _signature_problem(answer, self.parameters)
        return Verdict("wrong", problem) if problem else None

    def grade(self, answer) -> Verdict:
        if unsolved(answer):
            return Verdict("unsolved", say(
                en=f"write {self.function_name} and pass the function itself",
                ko=f"{self.function_name} 를 작성하고 그 함수 자체를 넘기세요"))
        refused = self.check_answer(answer)
        if refused is not None:
            return refused
        try:
            message = self.grader(answer)
        except Unsolved as done:
            return Verdict("unsolved", str(done) or say(
                en=f"{self.function_name} still returns nothing: write its body",
                ko=f"{self.function_name} 가 아직 아무것도 돌려주지 않습니다: 본문을 작성하세요"))
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
        return say(en=f"the function takes {len(positional)} argument(s); the kernel calls it "
                      f"with {len(parameters)}: ({', '.join(parameters)})",
                   ko=f"함수가 인자 {len(positional)}개를 받는데, 커널은 {len(parameters)}개로 "
                      f"부릅니다: ({', '.join(parameters)})")
    return None


def _stub_body():
    """A docstring and ``...``, as a stub's body is."""
    ...


def is_stub(fn) -> bool:
    """Whether ``fn``'s body is still the stub's: a docstring and ``...`` (or ``pass``)."""
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_code == _stub_body.__code__.co_code


def describe_args(names: list[str], args) -> str:
    return ", ".join(f"{n}={short(a)}" for n, a in zip(names, args))


def short(value) -> str:
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
        call = describe_args(names, args)
        raise Wrong(say(en=f"your function raised {type(exc).__name__}: {exc} (called with "
                           f"{call})",
                        ko=f"함수에서 {type(exc).__name__} 가 발생했습니다: {exc} (호출 인자 "
                           f"{call})")) from None
    if value is None and not allow_none:
        raise Unsolved()
    return value


def need_int(value, what: str, call: str) -> int:
    """``value`` as an int, or ``Wrong`` saying why a kernel cannot use it as an index."""
    kind = type(value).__name__
    if isinstance(value, (bool, np.bool_)):
        raise Wrong(say(en=f"{what} is {value!r}, a bool; the kernel needs an integer ({call})",
                        ko=f"{what} 가 {value!r} (bool) 입니다; 커널에는 정수가 필요합니다 "
                           f"({call})"))
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        raise Wrong(say(en=f"{what} is {value!r}, a {kind}: an index must be an integer (use "
                           f"// rather than /) ({call})",
                        ko=f"{what} 가 {value!r} ({kind}) 입니다: 인덱스는 정수여야 합니다 "
                           f"(/ 대신 //) ({call})"))
    raise Wrong(say(en=f"{what} is a {kind} ({short(value)}); the kernel needs one integer "
                       f"({call})",
                    ko=f"{what} 가 {kind} ({short(value)}) 입니다; 커널에는 정수 하나가 "
                       f"필요합니다 ({call})"))


def need_real(value, what: str, call: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise Wrong(say(en=f"{what} is {short(value)} ({type(value).__name__}); the kernel "
                           f"needs a number ({call})",
                        ko=f"{what} 가 {short(value)} ({type(value).__name__}) 입니다; 커널에는 "
                           f"수가 필요합니다 ({call})"))
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
        raise Wrong(say(
            en=f"Numba cannot compile your function as a device function: {reason.strip()}.  "
               "Plain arithmetic on numbers, min/max, math.exp, if and for loops work; Python "
               "lists, dicts, strings and classes do not",
            ko=f"Numba 가 함수를 디바이스 함수로 컴파일하지 못합니다: {reason.strip()}.  수의 "
               "산술, min/max, math.exp, if 와 for 는 되지만 파이썬 리스트, dict, 문자열, "
               "클래스는 안 됩니다")) from None
    except Exception:
        # the host call already ran it; a runtime error here is not a compile problem
        return
