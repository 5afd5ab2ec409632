"""What a host-side answer calls while it runs: watched, so that code which finds the package or
the checker by a path the static scan (``kept_state.py``) cannot read (a name spelled at run
time and looked up with ``operator.attrgetter``, a function's globals, the caller's frames) is
refused for what it called.

``guarded(answer)`` gives the grader a stand-in for the answer (a function, or a subclass of her
class whose methods are wrapped) that, for the length of each call of hers and on the thread
that makes it, has a profile function (``sys.setprofile``) see every call her code makes, and an
audit hook (``sys.addaudithook``, added once per process, idle outside her calls) see the
frame, globals and garbage-collector look-ups and the environment writes made under her code.
Refused:

- a call from her code into the package's own functions: everything but the methods of the
  objects she is handed (her arguments, her allocator, and what they hold: the table's
  ``assign``, the config's ``blocks_for_tokens``, ``AllocatorBase``'s helpers) and the
  package's exceptions;
- a call from her code to the running program's machinery (``INTROSPECTION_CALLS``, the
  ``inspect``, ``gc``, ``ctypes`` and ``importlib`` modules);
- a frame, a traceback's frame or a function's ``__globals__`` read by her code, and any write
  to ``os.environ`` while she runs (state kept outside the call).

The first refusal is kept (``Guard.refusal``) and ends her call; ``Puzzle.grade`` turns it into
the verdict whatever her code or the grader did with the exception.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from pathlib import Path

from paged_tutorial.teaching.harness.faults import PACKAGE_DIR, origin
from paged_tutorial.teaching.harness.kept_state import answers_own
from paged_tutorial.teaching.language import particle, say

#: builtins (by name) that reach the running program around an answer's arguments
INTROSPECTION_CALLS = ("__subclasses__", "_getframe", "_current_frames", "get_objects",
                       "get_referrers", "get_referents", "globals", "locals", "vars", "eval",
                       "exec", "compile", "__import__", "import_module", "setprofile",
                       "settrace", "addaudithook", "getprofile", "gettrace")
#: library modules (their files' names) whose functions reach the running program
INTROSPECTION_MODULES = ("inspect.py", "gc", "ctypes", "importlib")
#: audit events of a look-up around the arguments: a frame, a traceback's frame, a function's
#: globals (``object.__getattr__`` is raised for those attributes only), the collector's objects
REACHING_EVENTS = ("object.__getattr__", "sys._getframe", "sys._current_frames",
                   "gc.get_objects", "gc.get_referrers", "gc.get_referents")
#: audit events of a write to the process's environment
ENVIRONMENT_EVENTS = ("os.putenv", "os.unsetenv")


class AnswerRefused(BaseException):
    """Raised inside her call when it does what ``answer_guard`` refuses (a BaseException, so
    that an ``except Exception`` of hers does not swallow it; the refusal is kept anyway)."""


_STATE = threading.local()
_HOOK_ADDED = False
_HOOK_LOCK = threading.Lock()
_ORIGINS: dict = {}


def _origin_of(code) -> str:
    found = _ORIGINS.get(code)
    if found is None:
        found = _ORIGINS[code] = origin(code.co_filename)
    return found


_PACKAGE_CODE: dict = {}


def _in_package(code) -> bool:
    found = _PACKAGE_CODE.get(code)
    if found is None:
        try:
            found = PACKAGE_DIR in Path(code.co_filename).resolve().parents
        except (OSError, ValueError):
            found = False
        _PACKAGE_CODE[code] = found
    return found


class Guard:
    """One grading's watch over her calls: the first refusal (None while there is none)."""

    def __init__(self, puzzle_name: str):
        self.puzzle_name = puzzle_name
        self.refusal: str | None = None

    def refuse(self, message: str) -> None:
        if self.refusal is None:
            self.refusal = message
        raise AnswerRefused(message)


def _reaches(what: str) -> str:
    return say(en=f"your code {what} while the check ran it: it reaches the running program "
                  "around its arguments.  An answer computes its result from its arguments and "
                  "the methods of the objects it is handed; it may not call the package's own "
                  "version of the step, the worked solutions, or the checker, nor look at "
                  "frames, globals or the garbage collector's objects",
               ko=f"채점이 실행하는 동안 코드가 {what}: 인자 밖의 실행 중인 프로그램에 닿습니다.  "
                  "답은 인자와 건네받은 객체의 메서드로만 결과를 계산합니다; 패키지의 구현, 풀이 "
                  "예시, 채점기를 부르거나 프레임, 전역 변수, 가비지 컬렉터의 객체를 보면 안 "
                  "됩니다")


def _keeps_outside(what: str) -> str:
    return say(en=f"your code {what} while the check ran it: that is state kept outside the "
                  "call, which outlives it and is shared by every cache and engine in the "
                  "process.  Compute the answer from the arguments on every call",
               ko=f"채점이 실행하는 동안 코드가 {what}: 호출 밖에 간직한 상태로, 호출보다 오래 "
                  "살고 프로세스의 모든 캐시와 엔진이 함께 씁니다.  매 호출마다 인자로 답을 "
                  "계산하세요")


def _qualified(code) -> str:
    name = getattr(code, "co_qualname", code.co_name)
    try:
        relative = Path(code.co_filename).resolve().relative_to(PACKAGE_DIR.parent)
        module = ".".join(relative.with_suffix("").parts)
    except (OSError, ValueError):
        module = code.co_filename
    return f"{module}.{name}"


def _defines(klass: type, code) -> bool:
    """Whether ``code`` is the code of a method (or a property's getter or setter) of
    ``klass``."""
    for base in klass.__mro__:
        value = vars(base).get(code.co_name)
        if value is None:
            continue
        found = [getattr(value, "__func__", value), getattr(value, "fget", None),
                 getattr(value, "fset", None)]
        if any(getattr(f, "__code__", None) is code for f in found):
            return True
    return False


class _Watch:
    """The objects one call of hers was handed, and what her code may call on them."""

    def __init__(self, guard: Guard, handed: tuple):
        self.guard = guard
        held = list(handed)
        for obj in handed:
            try:
                held += list(vars(obj).values())
            except TypeError:
                pass
        self.handed_ids = {id(obj) for obj in held}
        self.handed_types = {type(obj) for obj in held}
        # functions they hold, one level further (a table's edit methods, set on it)
        functions = list(held)
        for obj in held:
            try:
                functions += [v for v in vars(obj).values() if callable(v)]
            except TypeError:
                pass
        self.handed_codes = {getattr(getattr(f, "__func__", f), "__code__", None)
                             for f in functions}

    def may_call(self, frame) -> bool:
        """Whether the call ``frame`` starts is a method of an object she was handed (or of
        the package's exceptions), a function one of them holds, or her own watched function
        or method (the stand-in ``guarded`` made: her code calling her code)."""
        code = frame.f_code
        if code in self.handed_codes or code in _STAND_IN_CODES:
            return True
        if code.co_argcount == 0:
            return False
        first = frame.f_locals.get(code.co_varnames[0])
        if isinstance(first, type):
            owner = first if first in self.handed_types else None
        elif id(first) in self.handed_ids or isinstance(first, BaseException):
            owner = type(first)
        else:
            owner = None
        return owner is not None and _defines(owner, code)

    def profile(self, frame, event, arg):
        if event not in ("call", "c_call"):
            return
        _STATE.in_hook = True          # the frame reads below are the guard's, not hers
        try:
            self._look(frame, event, arg)
        finally:
            _STATE.in_hook = False

    def _look(self, frame, event, arg):
        if event == "call":
            caller = frame.f_back
            if caller is None or _origin_of(caller.f_code) != "learner":
                return
            code = frame.f_code
            if _in_package(code):
                if not self.may_call(frame):
                    self.guard.refuse(_reaches(say(en=f"called {_qualified(code)}",
                                                   ko=f"{particle(_qualified(code), '을/를')} 불렀습니다")))
            elif any(part in code.co_filename.replace("\\", "/").split("/")
                     or code.co_filename.endswith("/" + part)
                     for part in INTROSPECTION_MODULES):
                self.guard.refuse(_reaches(say(en=f"called {code.co_name} from "
                                                  f"{Path(code.co_filename).stem}",
                                               ko=f"{Path(code.co_filename).stem}의 "
                                                  f"{particle(code.co_name, '을/를')} "
                                                  "불렀습니다")))
        else:                                               # "c_call"
            if _origin_of(frame.f_code) != "learner":
                return
            name = getattr(arg, "__name__", "")
            if name in INTROSPECTION_CALLS:
                owner = getattr(arg, "__self__", None)
                shown = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}" \
                    if owner is not None else name
                self.guard.refuse(_reaches(say(en=f"called {shown}",
                                               ko=f"{particle(shown, '을/를')} 불렀습니다")))


def _audit(event: str, args: tuple) -> None:
    watch = getattr(_STATE, "watch", None)
    if watch is None or getattr(_STATE, "in_hook", False):
        return
    if event in ENVIRONMENT_EVENTS:
        key = args[0] if args else "?"
        key = key.decode(errors="replace") if isinstance(key, bytes) else key
        watch.guard.refuse(_keeps_outside(say(en=f"wrote os.environ[{key!r}]",
                                              ko=f"os.environ[{key!r}]에 썼습니다")))
    if event not in REACHING_EVENTS:
        return
    _STATE.in_hook = True
    try:
        # the frame that raised the event (a C call makes none); never the hook's own, which
        # returns above while ``in_hook`` is set
        hers = _origin_of(sys._getframe(1).f_code) == "learner"
    finally:
        _STATE.in_hook = False
    if hers:
        what = f"{event} {args[1]!r}" if event == "object.__getattr__" and len(args) > 1 \
            else event
        watch.guard.refuse(_reaches(say(en=f"read {what}", ko=f"{particle(what, '을/를')} 읽었습니다")))


def _add_hook() -> None:
    global _HOOK_ADDED
    with _HOOK_LOCK:
        if not _HOOK_ADDED:
            sys.addaudithook(_audit)
            _HOOK_ADDED = True


def _watched_call(guard: Guard, fn, handed: tuple, args: tuple, kwargs: dict):
    if getattr(_STATE, "watch", None) is not None:      # her code calling her own code
        return fn(*args, **kwargs)
    _add_hook()
    watch = _Watch(guard, handed)
    before = sys.getprofile()
    _STATE.watch = watch
    sys.setprofile(watch.profile)
    try:
        return fn(*args, **kwargs)
    finally:
        sys.setprofile(before)
        _STATE.watch = None


def _guarded_function(guard: Guard, fn):
    @functools.wraps(fn)
    def watched(*args, **kwargs):
        return _watched_call(guard, fn, args + tuple(kwargs.values()), args, kwargs)
    return watched


def _guarded_method(guard: Guard, fn):
    @functools.wraps(fn)
    def watched(self, *args, **kwargs):
        return _watched_call(guard, fn, (self,) + args + tuple(kwargs.values()),
                             (self,) + args, kwargs)
    return watched


#: the code of the stand-ins' wrappers: a call into one is her code calling her own function
#: or method, which runs under the watch already set (``_watched_call``)
_STAND_IN_CODES = frozenset(wrap(None, _add_hook).__code__
                            for wrap in (_guarded_function, _guarded_method))


def guarded(answer, guard: Guard):
    """A stand-in for ``answer`` whose every call is watched by ``guard``: a function that
    calls hers, or (a class) a subclass of hers, of the same name, whose methods of hers call
    through the watch."""
    if not inspect.isclass(answer):
        return _guarded_function(guard, answer)
    methods = {}
    for klass in answer.__mro__:
        if not answers_own(klass):
            continue
        for name, value in vars(klass).items():
            if name in methods or not inspect.isfunction(value) or \
                    name in ("__init_subclass__", "__class_getitem__"):
                continue
            methods[name] = _guarded_method(guard, value)
    methods["__module__"] = answer.__module__
    methods["__qualname__"] = answer.__qualname__
    return type(answer.__name__, (answer,), methods)
