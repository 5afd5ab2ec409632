"""What every puzzle shares: the ``Puzzle`` record, how a reader's function is called on the
host (``host_call``, under a time limit), how its results are typed (``need_int``), and how it
is compiled the way the GPU will compile it (``check_compiles``).

A grader raises ``Wrong`` (with a message and, optionally, a figure) or ``Unsolved`` as soon as
it knows; ``Puzzle.grade`` turns either into a ``Verdict``, and so whatever else her code does
while it is graded: an exception of any kind, ``sys.exit``, an interrupt, a run past the
grading time limit.  An answer that calls the engine's own kernel code or the worked
solutions is refused before it runs (``borrowed_code``).
"""

from __future__ import annotations

import inspect
import numbers
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from paged_tutorial.teaching.error_text import compile_error_text, exception_text
from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.harness.faults import checker_fault_message, is_checker_fault
from paged_tutorial.teaching.harness import answer_guard, kept_state
from paged_tutorial.teaching.time_limit import TimeLimitExceeded, time_limit
from paged_tutorial.threads import fixed_threads
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


#: one call of the reader's function on the host takes microseconds; one still running after
#: this long is stuck in a loop
HOST_CALL_LIMIT_S = 10.0
#: the most a whole grading may take (every path of her code run in this thread: the host
#: calls, an engine's steps, the simulator's launches have limits of their own, shorter)
GRADE_LIMIT_S = 900.0
#: modules whose code an answer may not call: the engine's kernels and backends, and the
#: worked solutions
BORROWED_MODULES = ("paged_tutorial.backends", "paged_tutorial.teaching.exercises.solutions",
                    "paged_tutorial.teaching.exercises.solution_code",
                    "paged_tutorial.cache.prefix_cache")
#: the checker's own modules: an answer that reaches a function or a module of theirs could
#: read or change how it is graded (a class of theirs, like AllocatorBase, is no way in)
GRADER_MODULES = ("paged_tutorial.teaching.chapters", "paged_tutorial.teaching.harness",
                  "paged_tutorial.teaching.exercises", "paged_tutorial.teaching.verdict",
                  "paged_tutorial.teaching.time_limit")
#: names that import a module at run time
DYNAMIC_IMPORTS = ("__import__", "importlib", "import_module")
#: names that reach the running program around an answer's arguments: the loaded modules, the
#: caller's frames, another function's globals or closure, the garbage collector's objects
INTROSPECTION = ("modules", "_getframe", "currentframe", "f_back", "f_globals", "f_locals",
                 "__globals__", "__closure__", "__code__", "__builtins__", "get_referrers",
                 "get_objects", "get_referents")


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
    on_host: bool = False              # run as Python on the host (not compiled by Numba): the
    #                                    grader gets it watched by ``answer_guard``

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
                ko=f"퍼즐의 답은 함수입니다 ({self.signature[4:]}); "
                   f"{particle(str(type(answer).__name__), '을/를')} "
                   "받았습니다"))
        caller = "the engine" if self.on_host else "the kernel"
        problem = kept_state.not_plain(answer) or \
            _signature_problem(answer, self.parameters, caller)
        return Verdict("wrong", problem) if problem else None

    def grade(self, answer, worked: bool = False) -> Verdict:
        """The verdict on ``answer``; ``worked=True`` for a worked solution (``reveal``), which
        is the engine's code and is not refused for calling it."""
        if unsolved(answer):
            return Verdict("unsolved", say(
                en=f"write {self.function_name} and pass the function itself",
                ko=f"{particle(self.function_name, '을/를')} 작성해 그대로 넘기세요 (호출 결과가 아니라 그 자체)"))
        refused = self.check_answer(answer)
        if refused is None and not worked:
            borrowed = ends_the_program(answer) or borrowed_code(answer) or \
                kept_state.refusal(answer)
            if borrowed is not None:
                refused = Verdict("wrong", borrowed)
        if refused is not None:
            return refused
        if not self.on_host or worked:
            return self._run_grader(answer)
        guard = answer_guard.Guard(self.name)
        verdict = self._run_grader(answer_guard.guarded(answer, guard))
        if guard.refusal is not None:
            return Verdict("wrong", guard.refusal)
        return verdict

    def _run_grader(self, answer) -> Verdict:
        try:
            # one thread: a grader compares engine runs bit for bit (threads.fixed_threads)
            with time_limit(GRADE_LIMIT_S), fixed_threads(1):
                message = self.grader(answer)
        except answer_guard.AnswerRefused as refused:
            return Verdict("wrong", str(refused))
        except TimeLimitExceeded:
            return Verdict("wrong", say(
                en=f"grading {self.function_name} was still running after {GRADE_LIMIT_S:g} s "
                   "and was stopped: your code never finishes (a loop that does not end?)",
                ko=f"{self.function_name} 채점이 {GRADE_LIMIT_S:g}초가 지나도 끝나지 않아 "
                   "멈췄습니다: 코드가 끝나지 않습니다 (끝나지 않는 루프?)"))
        except SystemExit as exit_:
            return Verdict("wrong", exit_verdict(exit_))
        except KeyboardInterrupt:
            return Verdict("unsolved", say(
                en=f"grading {self.function_name} was interrupted (KeyboardInterrupt) before "
                   "it finished: nothing was graded; run the check again",
                ko=f"{self.function_name} 채점이 끝나기 전에 중단되었습니다 "
                   "(KeyboardInterrupt): 채점된 것이 없습니다. 다시 실행하세요"))
        except MemoryError:
            return Verdict("wrong", say(
                en="your code asked for more memory than this machine has (MemoryError): a "
                   "kernel's part works on a few numbers, never on a huge array",
                ko="코드가 이 컴퓨터의 메모리보다 많은 메모리를 요구했습니다 (MemoryError): 커널의 "
                   "부분은 수 몇 개를 다루지, 거대한 배열을 만들지 않습니다"))
        except Unsolved as done:
            return Verdict("unsolved", str(done) or say(
                en=f"{self.function_name} still returns nothing: write its body",
                ko=f"{particle(str(self.function_name), '이/가')} 아직 아무것도 돌려주지 않습니다: 본문을 작성하세요"))
        except Wrong as wrong:
            return Verdict("wrong", wrong.message, wrong.figure)
        except Exception as exc:       # her code, run where no host_call wraps it, or ours
            if is_checker_fault(exc):
                return Verdict("unsolved", checker_fault_message(exc, self.function_name))
            return Verdict("wrong", say(
                en=f"grading stopped: {type(exc).__name__} was raised while your "
                   f"{self.function_name} ran: {_text_of(exc)}",
                ko=f"채점이 멈췄습니다: 여러분의 {self.function_name} 실행 중 예외가 "
                   f"발생했습니다: {exception_text(exc)}"))
        figure = None
        if isinstance(message, tuple):          # a picture of the run, drawn on success too
            message, figure = message
        return Verdict("correct", message, figure)


def exit_verdict(exit_: SystemExit) -> str:
    """What ``sys.exit(code)`` from her code means, in words."""
    return say(en=f"your code called sys.exit({exit_.code!r}) (raised SystemExit): a puzzle's "
                  "function returns its answer; it must not end the program",
               ko=f"코드가 sys.exit({exit_.code!r})를 호출했습니다 (SystemExit): 퍼즐의 함수는 "
                  "답을 돌려줄 뿐, 프로그램을 끝내면 안 됩니다")


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or what went wrong making it."""
    try:
        return str(exc)
    except Exception as inner:
        return f"<its message raised {type(inner).__name__}>"


def _code_objects(answer):
    """(name, function) for ``answer`` and, for a class, every function it defines."""
    if inspect.isclass(answer):
        for klass in answer.__mro__:
            if not kept_state.answers_own(klass):
                continue
            for name, value in vars(klass).items():
                value = getattr(value, "__func__", value)
                if inspect.isfunction(value):
                    yield f"{answer.__name__}.{name}", value
        return
    fn = getattr(answer, "py_func", answer)
    if inspect.isfunction(fn):
        yield getattr(fn, "__name__", "your function"), fn


def _within(module: str, modules) -> bool:
    return any(module == m or module.startswith(m + ".") for m in modules)


def _borrowed(value) -> str | None:
    """The module of the engine, the worked solutions or the checker ``value`` is part of (a
    class of the checker's excepted), or None."""
    if inspect.ismodule(value):
        module = value.__name__
    else:
        target = getattr(value, "py_func", None) or getattr(value, "__func__", None) or value
        module = getattr(target, "__module__", None)
        if not isinstance(module, str) or not (inspect.isfunction(target) or
                                               inspect.isclass(target)):
            return None
        if inspect.isclass(target) and not _within(module, BORROWED_MODULES):
            return None
    if _within(module, BORROWED_MODULES) or _within(module, GRADER_MODULES):
        return module
    return None


def _imports(code) -> str | None:
    """A module of the package that ``code`` (or code nested in it) imports, or a name it
    uses to import at run time, or None."""
    import dis
    import types

    codes = [code]
    while codes:
        current = codes.pop()
        codes += [c for c in current.co_consts if isinstance(c, types.CodeType)]
        for instruction in dis.get_instructions(current):
            if instruction.opname == "IMPORT_NAME" and \
                    str(instruction.argval).split(".")[0] == "paged_tutorial":
                return str(instruction.argval)
        used = set(current.co_names) & set(DYNAMIC_IMPORTS + INTROSPECTION)
        if used:
            return sorted(used)[0]
    return None


#: names whose use ends the program or stands for an interrupt: refused before the answer runs
#: (raised in a simulated GPU thread, they would end that thread alone and leave the others
#: waiting at a barrier)
ENDING_NAMES = ("exit", "quit", "_exit", "abort", "SystemExit", "KeyboardInterrupt",
                "GeneratorExit", "BaseException")


def ends_the_program(answer) -> str | None:
    """Why ``answer`` is refused when its code names a way to end the program (``sys.exit``,
    ``raise SystemExit``, ``os._exit``...), or None."""
    from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import global_names

    for where, fn in _code_objects(answer):
        used = [n for n in global_names(fn.__code__) if n in ENDING_NAMES]
        if used:
            return say(en=f"{where} uses {used[0]}, which ends the program or stands for an "
                          "interrupt: a puzzle's function computes its answer and returns it; "
                          "report a problem by returning, or by raising an ordinary exception",
                       ko=f"{particle(str(where), '이/가')} {particle(used[0], '을/를')} 씁니다. 이는 프로그램을 "
                          "끝내거나 중단을 뜻합니다: 퍼즐의 함수는 답을 계산해 돌려줄 뿐입니다. "
                          "문제는 값을 돌려주거나 평범한 예외로 알리세요")
    return None


def borrowed_code(answer) -> str | None:
    """Why ``answer`` is refused when it calls the engine's own kernel code (anything in
    ``paged_tutorial.backends``: ``attention.walk_blocks``, ``attention.token_score``...) or a
    worked solution, reached as a global, through a module's attributes, or from a closure;
    None when it does not."""
    from paged_tutorial.backends.numba_cuda.kernels.attention import BUILD_NAMES, PART_NAMES
    from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import global_names

    for where, fn in _code_objects(answer):
        if _borrowed(fn):
            return _borrowed_message(where, fn.__name__, _borrowed(fn))
        copied = _package_code(fn)
        if copied is not None:
            return _copied_message(where, copied)
        imported = _imports(fn.__code__)
        if imported is not None:
            return say(en=f"{where} uses {imported} to reach code beyond its arguments as it "
                          "runs: a puzzle's answer is your own arithmetic on its arguments; it "
                          "needs no module of the package, no other function's frame or globals "
                          "(and may not reach the engine's code, the worked solutions or the "
                          "checker)",
                       ko=f"{particle(str(where), '이/가')} 실행 중에 "
                          f"{particle(imported, '으로/로')} 인자 밖의 코드에 닿습니다: 퍼즐의 답은 "
                          "인자만 가지고 하는 여러분 자신의 계산입니다. 패키지의 모듈도, 다른 함수의 "
                          "프레임이나 전역 변수도 필요 없습니다 (엔진의 코드, 풀이 예시, 채점기에 "
                          "닿아서도 안 됩니다)")
        names = global_names(fn.__code__)
        # the kernel's build binds its own names (load, the constants, the other parts)
        values = [(n, fn.__globals__[n]) for n in names if n in fn.__globals__
                  and n not in BUILD_NAMES and n not in PART_NAMES]
        values += [(n, c.cell_contents) for n, c in
                   zip(fn.__code__.co_freevars, fn.__closure__ or ()) if _has_contents(c)]
        seen: set[int] = set()
        while values:
            name, value = values.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            module = _borrowed(value)
            if module is not None:
                return _borrowed_message(where, name, module)
            if inspect.ismodule(value):       # pt.backends.numba_cuda... : follow attributes
                values += [(f"{name}.{n}", getattr(value, n)) for n in names
                           if hasattr(value, n)]
    return None


#: the folder of the package's own source files: an answer's code is never compiled from them
PACKAGE_DIR = Path(__file__).resolve().parents[2]


def _package_code(fn) -> str | None:
    """``module.function`` when ``fn`` runs code the package wrote (its code object compiled
    from one of the package's files, or its globals a package module's), else None: a
    function remade from another's code object (``types.FunctionType(f.__code__, ...)``, the
    class found through ``__subclasses__()``) keeps both."""
    code = fn.__code__
    module = fn.__globals__.get("__name__")
    try:
        in_package = Path(code.co_filename).resolve().is_relative_to(PACKAGE_DIR)
    except (OSError, ValueError):
        in_package = False
    if in_package or (isinstance(module, str) and module.startswith("paged_tutorial.")):
        return f"{module}.{code.co_qualname}"
    return None


def _copied_message(where: str, copied: str) -> str:
    return say(en=f"{where} runs the package's own code ({copied}), not code you wrote: a "
                  "function remade from the package's (through __subclasses__() or its "
                  "__code__) is the package's work.  Write the method yourself",
               ko=f"{particle(str(where), '이/가')} 여러분이 쓴 코드가 아니라 패키지 자신의 코드"
                  f"({copied})를 실행합니다: 패키지의 함수로 다시 만든 함수(__subclasses__()나 "
                  "__code__로 찾은 것)는 패키지의 일입니다.  메서드를 직접 작성하세요")


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _borrowed_message(where: str, name: str, module: str) -> str:
    if _within(module, GRADER_MODULES) and "solution" not in module:
        return say(en=f"{where} uses {name} from the checker ({module}): an answer computes its "
                      "result from its arguments; it may not read or change how it is graded",
                   ko=f"{particle(str(where), '이/가')} 채점기({module})의 "
                      f"{particle(name, '을/를')} 씁니다: 답은 인자로 결과를 계산할 뿐, 채점 "
                      "방식을 읽거나 바꾸면 안 됩니다")
    if "solution" in module:
        return say(en=f"{where} uses {name} from the worked solutions ({module}): the puzzle "
                      "asks for your own code; write it without them",
                   ko=f"{particle(str(where), '이/가')} 풀이 예시({module})의 "
                      f"{particle(name, '을/를')} 씁니다: "
                      "퍼즐은 여러분 자신의 코드를 요구합니다. 풀이 없이 작성하세요")
    return say(en=f"{where} uses {name} from the engine's own code ({module}): the puzzle asks "
                  "you to write that step yourself, not to call the engine's version of it",
               ko=f"{particle(str(where), '이/가')} 엔진 자신의 코드({module})의 "
                  f"{particle(name, '을/를')} 씁니다: "
                  "퍼즐은 그 단계를 엔진의 것을 부르지 말고 직접 작성하라고 요구합니다")


def _signature_problem(fn, parameters: list[str], caller: str = "the kernel") -> str | None:
    """What is wrong with ``fn``'s parameters for a call with ``parameters`` (positional, in
    that order) by ``caller``, naming the parameter at fault; None when nothing is."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except Exception:                 # (TypeError, ValueError), or a hostile __signature__
        return None
    shown = ", ".join(parameters)
    star = [p for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    keyword_only = [p for p in params if p.kind == p.KEYWORD_ONLY]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    extra = positional[len(parameters):]
    if keyword_only:
        what = say(en=f"its parameter `{keyword_only[0].name}` is keyword-only (after *), "
                      "which the call never passes",
                   ko=f"매개변수 {particle(f'`{keyword_only[0].name}`', '은/는')} 호출이 넘기지 "
                      "않는 키워드 전용 인자입니다 (* 뒤)")
    elif star:
        what = say(en=f"its parameter {star[0]} takes any number of arguments",
                   ko=f"매개변수 {particle(str(star[0]), '은/는')} 인자를 몇 개든 받습니다")
    elif extra and extra[0].default is not inspect.Parameter.empty:
        shared = isinstance(extra[0].default, kept_state.MUTABLE_TYPES)
        what = say(en=f"its extra parameter `{extra[0].name}` has a default "
                      f"({short(extra[0].default)}), which the call never passes"
                      + (", so it is one container shared by every call (state kept between "
                         "calls)" if shared else ""),
                   ko=f"추가 매개변수 `{extra[0].name}`에 호출이 넘기지 않는 기본값"
                      f"({short(extra[0].default)})이 있습니다"
                      + ("; 모든 호출이 함께 쓰는 컨테이너 하나입니다 (호출 사이에 간직한 상태)"
                         if shared else ""))
    elif len(positional) != len(parameters):
        what = say(en=f"it takes {len(positional)} argument(s)",
                   ko=f"인자 {len(positional)}개를 받습니다")
    else:
        return None
    return say(en=f"the function's parameters are not the puzzle's: {what}; {caller} calls it "
                  f"with exactly {len(parameters)} positional argument(s): ({shown})",
               ko=f"함수의 매개변수가 퍼즐의 것과 다릅니다: {what}; "
                  f"{particle('커널' if caller == 'the kernel' else '엔진', '은/는')} 위치 인자 정확히 "
                  f"{len(parameters)}개로 부릅니다: ({shown})")


def _stub_body():
    """A docstring and ``...``, as a stub's body is."""
    ...


def is_stub(fn) -> bool:
    """Whether ``fn``'s body is still the stub's: a docstring and ``...`` (or ``pass``)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code is not None and code.co_code == _stub_body.__code__.co_code


def describe_args(names: list[str], args) -> str:
    return ", ".join(f"{n}={short(a)}" for n, a in zip(names, args))


def short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"<array {value.shape}>"
    try:
        text = repr(value)
    except Exception as exc:          # her object's __repr__ may raise
        return f"<a {type(value).__name__} whose repr raised {type(exc).__name__}>"
    if not isinstance(text, str):
        return f"<a {type(value).__name__}>"
    return text if len(text) <= 30 else text[:27] + "..."


def host_call(fn: Callable, args: tuple, names: list[str], allow_none: bool = False):
    """Call the reader's plain-Python function on the host.  None (the stub's ``...``) or
    NotImplementedError means not solved yet; any other exception is a wrong answer that names
    the call, and so is a call still running after ``HOST_CALL_LIMIT_S``."""
    try:
        with time_limit(HOST_CALL_LIMIT_S):
            value = fn(*args)
    except (Wrong, Unsolved):
        raise
    except NotImplementedError:
        raise Unsolved() from None
    except TimeLimitExceeded:
        call = describe_args(names, args)
        raise Wrong(say(en=f"your function was still running after {HOST_CALL_LIMIT_S:g} s and "
                           f"was stopped (called with {call}): a loop that never ends?",
                        ko=f"함수가 {HOST_CALL_LIMIT_S:g}초가 지나도 끝나지 않아 멈췄습니다 "
                           f"(호출 인자 {call}): 끝나지 않는 루프?")) from None
    except SystemExit as exit_:
        raise Wrong(exit_verdict(exit_)) from None
    except Exception as exc:      # the reader's code may raise anything: report it
        call = describe_args(names, args)
        raise Wrong(say(en=f"your function raised {type(exc).__name__}: {_text_of(exc)} (called "
                           f"with {call})",
                        ko=f"함수에서 예외가 발생했습니다: {exception_text(exc)} "
                           f"(호출 인자 {call})")) from None
    if value is None and not allow_none:
        raise Unsolved()
    return value


def need_int(value, what: str, call: str) -> int:
    """``value`` as an int, or ``Wrong`` saying why a kernel cannot use it as an index."""
    kind = type(value).__name__
    if isinstance(value, (bool, np.bool_)):
        raise Wrong(say(en=f"{what} is {value!r}, a bool; the kernel needs an integer ({call})",
                        ko=f"{particle(str(what), '이/가')} {value!r} (bool)입니다; 커널에는 정수가 필요합니다 "
                           f"({call})"))
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        raise Wrong(say(en=f"{what} is {value!r}, a {kind}: an index must be an integer (use "
                           f"// rather than /) ({call})",
                        ko=f"{particle(str(what), '이/가')} {value!r} ({kind})입니다: 인덱스는 정수여야 합니다 "
                           f"(/ 대신 //) ({call})"))
    raise Wrong(say(en=f"{what} is a {kind} ({short(value)}); the kernel needs one integer "
                       f"({call})",
                    ko=f"{particle(str(what), '이/가')} {kind} ({short(value)})입니다; 커널에는 정수 하나가 "
                       f"필요합니다 ({call})"))


def need_real(value, what: str, call: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise Wrong(say(en=f"{what} is {short(value)} ({type(value).__name__}); the kernel "
                           f"needs a number ({call})",
                        ko=f"{particle(str(what), '이/가')} {short(value)} "
                           f"({type(value).__name__})입니다; "
                           f"커널에는 "
                           f"수가 필요합니다 ({call})"))
    return float(value)


#: what a device function cannot hold on a GPU: Numba's type classes, in words
_HOST_ONLY_TYPES = {
    "DictType": Text(en="a dict", ko="딕셔너리(dict)"),
    "UnicodeType": Text(en="a string (an f-string, str() or a literal)",
                        ko="문자열 (f-문자열, str() 또는 문자열 상수)"),
    "UnicodeCharSeq": Text(en="a string", ko="문자열"),
    "List": Text(en="a Python list", ko="파이썬 리스트"),
    "ListType": Text(en="a typed list", ko="타입 리스트"),
    "Set": Text(en="a set", ko="집합(set)"),
}
#: the CPU target's heap allocations; the CUDA target has no heap for a device function
_HEAP_CALLS = ("NRT_MemInfo_alloc", "NRT_MemInfo_new", "NRT_Allocate")


def _compile_problem(reason: str) -> Wrong:
    return Wrong(say(
        en=f"Numba cannot compile your function as a device function: {reason}.  Plain "
           "arithmetic on numbers, min/max, math.exp, if and for loops work; Python lists, "
           "dicts, strings and classes do not",
        ko=f"Numba가 함수를 디바이스 함수로 컴파일하지 못합니다: {reason}.  수의 산술, "
           "min/max, math.exp, if와 for는 되지만 파이썬 리스트, dict, 문자열, 클래스는 안 "
           "됩니다"))


#: bytecode that builds a host-only object: a list, a dict, a set, a formatted string
_HOST_ONLY_OPS = {
    "BUILD_LIST": _HOST_ONLY_TYPES["List"], "LIST_APPEND": _HOST_ONLY_TYPES["List"],
    "LIST_EXTEND": _HOST_ONLY_TYPES["List"], "LIST_TO_TUPLE": _HOST_ONLY_TYPES["List"],
    "BUILD_MAP": _HOST_ONLY_TYPES["DictType"], "BUILD_CONST_KEY_MAP": _HOST_ONLY_TYPES["DictType"],
    "MAP_ADD": _HOST_ONLY_TYPES["DictType"], "DICT_UPDATE": _HOST_ONLY_TYPES["DictType"],
    "DICT_MERGE": _HOST_ONLY_TYPES["DictType"],
    "BUILD_SET": _HOST_ONLY_TYPES["Set"], "SET_ADD": _HOST_ONLY_TYPES["Set"],
    "SET_UPDATE": _HOST_ONLY_TYPES["Set"],
    "FORMAT_VALUE": _HOST_ONLY_TYPES["UnicodeType"], "BUILD_STRING": _HOST_ONLY_TYPES["UnicodeType"],
}
#: builtins that make a host-only object
_HOST_ONLY_CALLS = {"list": _HOST_ONLY_TYPES["List"], "dict": _HOST_ONLY_TYPES["DictType"],
                    "set": _HOST_ONLY_TYPES["Set"], "str": _HOST_ONLY_TYPES["UnicodeType"]}


def host_only_code(fn: Callable) -> str | None:
    """Why ``fn`` (a kernel part, run by the simulator as Python on a CPU) could not be compiled
    for a GPU because it builds a list, a dict, a set or a string, looking at its bytecode, its
    nested code and the helper functions of hers it calls; None when it builds none.  The CUDA
    target refuses these as device code; the simulator would run them."""
    import dis
    import types

    from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import global_names

    seen: set = set()
    todo = [(getattr(fn, "__name__", "your function"), getattr(fn, "py_func", fn))]
    while todo:
        where, function = todo.pop()
        code = getattr(function, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        codes = [code]
        while codes:
            current = codes.pop()
            codes += [c for c in current.co_consts if isinstance(c, types.CodeType)]
            for instruction in dis.get_instructions(current):
                words = _HOST_ONLY_OPS.get(instruction.opname)
                if words is None and instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    words = _HOST_ONLY_CALLS.get(instruction.argval)
                if words is not None:
                    return say(
                        en=f"{where} builds {words} (line {_line_of(instruction, current)}), "
                           "which exists only on the host: a GPU device function has no heap to "
                           "keep one in (the simulator would run it; a GPU refuses to compile "
                           "it).  Use numbers, tuples and the kernel's arrays",
                        ko=f"{particle(where, '이/가')} {particle(str(words), '을/를')} 만듭니다 "
                           f"({_line_of(instruction, current)}번 줄). 이는 호스트에만 있습니다: "
                           "GPU 디바이스 함수에는 그것을 둘 힙이 없습니다 (시뮬레이터는 실행하지만 "
                           "GPU는 컴파일하지 않습니다).  수, 튜플, 커널의 배열을 쓰세요")
        for name in global_names(code):
            value = getattr(function, "__globals__", {}).get(name)
            if isinstance(value, types.FunctionType) and \
                    not str(value.__module__).startswith("paged_tutorial"):
                todo.append((value.__name__, value))
    return None


def _line_of(instruction, code) -> int:
    line = instruction.positions.lineno if getattr(instruction, "positions", None) else None
    return line or instruction.starts_line or code.co_firstlineno


def compile_errors() -> tuple:
    """The exceptions by which Numba refuses to compile a function: its own errors, and the
    bytecode it does not support (an ``import`` or a ``with`` block inside the function, star
    unpacking), which it raises as a plain ``Exception``."""
    from numba.core.errors import NumbaError, UnsupportedBytecodeError

    return (NumbaError, UnsupportedBytecodeError)


def check_compiles(fn: Callable, sample_args: tuple) -> None:
    """Type ``fn`` with Numba for the sample arguments (without running it), and hold it to
    what the CUDA target compiles for a device function: code Numba cannot type at all, and
    code the CPU target accepts only because it has a heap (a dict, a string or f-string, a
    list of any kind), are reported here, on every machine, not only on a GPU."""
    import numba

    try:
        dispatcher = numba.njit(cache=False)(fn)
        signature = tuple(numba.typeof(a) for a in sample_args)
        dispatcher.compile(signature)
    except compile_errors() as exc:
        raise _compile_problem(compile_error_text(exc)) from None
    except (Wrong, Unsolved, TimeLimitExceeded, SystemExit, KeyboardInterrupt):
        raise
    except Exception:
        # the host calls already ran it; anything else here is not a compile problem
        return
    for result in dispatcher.overloads.values():
        typemap = result.type_annotation.typemap
        for variable, typ in sorted(typemap.items(), key=lambda kv: kv[0].startswith("$")):
            words = _HOST_ONLY_TYPES.get(type(typ).__name__)
            if words is not None:
                shown = "" if variable.startswith("$") else f" ({variable})"
                raise _compile_problem(say(
                    en=f"it builds {words}{shown}, which exists only on the host: a GPU "
                       "device function has no heap to keep one in",
                    ko=f"함수가 {particle(f'{words}{shown}', '을/를')} 만드는데, 이는 "
                       "호스트에만 있습니다: GPU 디바이스 함수에는 그것을 둘 힙이 없습니다"))
        if any(call in result.library.get_llvm_str() for call in _HEAP_CALLS):
            raise _compile_problem(say(
                en="it allocates memory (an array or a container built inside the function): "
                   "a GPU device function has no heap",
                ko="함수 안에서 메모리를 할당합니다 (배열이나 컨테이너를 만듦): GPU 디바이스 "
                   "함수에는 힙이 없습니다"))
