"""What an answer may not do besides computing from its arguments: keep state between calls
(a module-level or class-level dict, list, set or array it reads or writes, a ``global`` it
assigns, a memoizing decorator, a mutable default), or reach the running program around its
arguments (``sys.modules``, ``getattr(obj, "__subclasses__")``, frames, globals, ``eval``).

Every check calls an answer many times while the table, the free list and the shapes change
between calls: a remembered result goes stale, and code that finds the engine's or the
checker's objects by another path than its arguments could read or change how it is graded.
``refusal(answer)`` says, in words, what the answer did; None when it does neither.
"""

from __future__ import annotations

import abc
import collections
import dis
import enum
import functools
import inspect
import types
import typing

import numpy as np

from paged_tutorial.teaching.language import particle, say

#: containers that keep what is put in them from one call to the next
MUTABLE_TYPES = (dict, list, set, bytearray, np.ndarray, collections.deque)
#: names (attributes, builtins, or strings passed to getattr) that reach the running program
#: around an answer's arguments
REACHING_NAMES = ("__subclasses__", "__mro__", "__bases__", "__base__", "__globals__",
                  "__closure__", "__code__", "__builtins__", "__dict__", "modules",
                  "_getframe", "currentframe", "f_back", "f_globals", "f_locals",
                  "get_referrers", "get_referents", "get_objects", "globals", "locals", "vars",
                  "eval", "exec", "compile", "__import__")
#: modules whose import gives an answer the running program rather than arithmetic
REACHING_MODULES = ("sys", "gc", "inspect", "builtins", "ctypes", "importlib", "types",
                    "__main__")
#: the functions the graders' own code is in (never an answer's helper)
PACKAGE = "paged_tutorial"
#: Python's own classes an answer's class may derive from: what they hold (``ABC``'s
#: ``__annotations__``, say) is Python's bookkeeping, never an answer's state.  Named by
#: identity: a class of hers that merely says ``__module__ = "abc"`` is still hers.
STANDARD_BASES = (object, abc.ABC, typing.Generic, typing.Protocol)


def answers_own(klass) -> bool:
    """Whether ``klass`` is a class of hers, not the package's, nor one of Python's own."""
    return klass not in STANDARD_BASES and not str(klass.__module__).startswith(PACKAGE)


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _functions(answer):
    """(where, function) for ``answer``, a class's methods (its own and its non-package bases'),
    and every plain helper function they call through a global or a closure, each once."""
    todo = []
    if inspect.isclass(answer):
        for klass in answer.__mro__:
            if not answers_own(klass):
                continue
            for name, value in vars(klass).items():
                value = getattr(value, "__func__", value)
                if inspect.isfunction(value):
                    todo.append((f"{answer.__name__}.{name}", value))
    else:
        fn = getattr(answer, "py_func", answer)
        if inspect.isfunction(fn):
            todo.append((getattr(fn, "__name__", "your function"), fn))
    seen = set()
    while todo:
        where, fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        yield where, fn
        for _, value in _globals_used(fn) + _cells(fn):
            if inspect.isfunction(value) and not str(value.__module__).startswith(PACKAGE):
                todo.append((value.__name__, value))


def _codes(code):
    out = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out += _codes(const)
    return out


def _globals_used(fn) -> list:
    names = set()
    for code in _codes(fn.__code__):
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"):
                names.add(ins.argval)
    g = fn.__globals__
    return [(n, g[n]) for n in sorted(names) if n in g]


def _cells(fn) -> list:
    out = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            out.append((name, cell.cell_contents))
        except ValueError:
            continue
    return out


def _kind(value) -> str:
    if isinstance(value, np.ndarray):
        return say(en="an array", ko="배열")
    return say(en=f"a {type(value).__name__}", ko=type(value).__name__)


def _keeps(where: str, what: str) -> str:
    return say(en=f"{where} keeps state between calls: {what}.  The check calls it many times "
                  "while the table, the free list and the shapes change between calls, so "
                  "anything remembered from an earlier call is stale; compute the answer from "
                  "the arguments on every call (a kernel part hands values between threads "
                  "through the shared arrays it is given)",
               ko=f"{particle(where, '이/가')} 호출 사이에 상태를 간직합니다: {what}.  채점은 "
                  "테이블, 빈 블록 목록, 모양이 바뀌는 사이에 여러 번 부르므로 앞선 호출에서 "
                  "기억한 것은 낡은 값입니다; 매 호출마다 인자로 답을 계산하세요 (커널 부분은 "
                  "스레드 사이의 값을 받은 공유 배열로 넘깁니다)")


def _reaches(where: str, what: str) -> str:
    return say(en=f"{where} reaches the running program around its arguments: {what}.  An "
                  "answer computes its result from its arguments; it may not look up the "
                  "engine's or the checker's objects another way",
               ko=f"{particle(where, '이/가')} 인자 밖의 실행 중인 프로그램에 닿습니다: "
                  f"{what}.  답은 인자로 결과를 계산할 뿐, 엔진이나 채점기의 객체를 다른 "
                  "길로 찾으면 안 됩니다")


def _state_of_function(where: str, fn) -> str | None:
    for code in _codes(fn.__code__):
        for ins in dis.get_instructions(code):
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                return _keeps(where, say(en=f"it assigns the module-level name "
                                            f"`{ins.argval}` (global {ins.argval})",
                                         ko=f"모듈 수준의 이름 `{ins.argval}`에 대입합니다 "
                                            f"(global {ins.argval})"))
    for name, value in _globals_used(fn):
        if isinstance(value, MUTABLE_TYPES):
            return _keeps(where, say(en=f"it uses the module-level `{name}` ({_kind(value)}), "
                                        "which outlives the call",
                                     ko=f"호출보다 오래 사는 모듈 수준의 `{name}` "
                                        f"({_kind(value)})을 씁니다"))
        if inspect.isclass(value) and not str(value.__module__).startswith(PACKAGE):
            kept = _class_state(value)
            if kept is not None:
                return _keeps(where, say(en=f"it uses {kept}", ko=f"{particle(kept, '을/를')} 씁니다"))
        if callable(value) and hasattr(value, "cache_info"):
            return _keeps(where, say(en=f"it calls `{name}`, memoized with functools' cache",
                                     ko=f"functools 캐시로 기억하는 `{name}`을 부릅니다"))
    for name, value in _cells(fn):
        if isinstance(value, MUTABLE_TYPES):
            return _keeps(where, say(en=f"it uses `{name}` ({_kind(value)}) from an enclosing "
                                        "function, which outlives the call",
                                     ko=f"바깥 함수의 `{name}` ({_kind(value)})을 씁니다. 이는 "
                                        "호출보다 오래 삽니다"))
    defaults = list(fn.__defaults__ or ()) + list((fn.__kwdefaults__ or {}).values())
    if any(isinstance(d, MUTABLE_TYPES) for d in defaults):
        return _keeps(where, say(en="a default argument is a mutable container, shared by "
                                    "every call",
                                 ko="기본 인자가 모든 호출이 함께 쓰는 변경 가능한 컨테이너입니다"))
    return None


def _reach_of_function(where: str, fn) -> str | None:
    for code in _codes(fn.__code__):
        for ins in dis.get_instructions(code):
            if ins.opname == "IMPORT_NAME":
                top = str(ins.argval).split(".")[0]
                if top in REACHING_MODULES:
                    return _reaches(where, say(en=f"it imports {ins.argval}",
                                               ko=f"{particle(str(ins.argval), '을/를')} "
                                                  "가져옵니다"))
        used = [n for n in code.co_names if n in REACHING_NAMES]
        if used:
            return _reaches(where, say(en=f"it uses {used[0]}", ko=f"{particle(used[0], '을/를')} 씁니다"))
        strings = [c for c in code.co_consts if isinstance(c, str) and c in REACHING_NAMES]
        if strings:
            return _reaches(where, say(en=f"it names {strings[0]!r} (getattr with a name "
                                          "finds what an attribute would)",
                                       ko=f"{strings[0]!r}라는 이름을 씁니다 (getattr에 이름을 "
                                          "주면 속성과 같은 것에 닿습니다)"))
    for name, value in _globals_used(fn) + _cells(fn):
        if isinstance(value, types.ModuleType) and \
                value.__name__.split(".")[0] in REACHING_MODULES:
            return _reaches(where, say(en=f"it uses the module {value.__name__} (as {name})",
                                       ko=f"모듈 {particle(f'{value.__name__} ({name})', '을/를')} 씁니다"))
    return None


#: the mutable tables Python keeps on every named tuple class and every Enum: how the class
#: was built, not state an answer keeps, so long as her code never names them
NAMED_TUPLE_TABLES = ("_field_defaults",)
ENUM_TABLES = ("_member_map_", "_value2member_map_", "_member_names_", "_unhashable_values_")


def _pythons_own(klass, name: str) -> bool:
    """Whether the class attribute ``name`` is one of the tables Python keeps on ``klass``'s
    kind of class (a named tuple's, an Enum's)."""
    if issubclass(klass, tuple) and hasattr(klass, "_fields") and name in NAMED_TUPLE_TABLES:
        return True
    return isinstance(klass, enum.EnumMeta) and name in ENUM_TABLES


def _names_pythons_tables(where: str, fn) -> str | None:
    """A table of ``_pythons_own`` that ``fn`` names: state parked where the class check lets
    Python's own tables be."""
    for code in _codes(fn.__code__):
        for name in code.co_names:
            if name in NAMED_TUPLE_TABLES + ENUM_TABLES:
                return _keeps(where, say(en=f"it names `{name}`, a table Python keeps on the "
                                            "class",
                                         ko=f"클래스에 파이썬이 두는 표 `{name}`을 씁니다"))
    return None


def _class_state(klass) -> str | None:
    """The first mutable class attribute of ``klass`` (or its non-package bases), in words."""
    for base in klass.__mro__:
        if not answers_own(base):
            continue
        for name, value in vars(base).items():
            if isinstance(value, MUTABLE_TYPES) and not _dunder(name) and \
                    not _pythons_own(base, name):
                return say(en=f"the class attribute `{base.__name__}.{name}` ({_kind(value)}), "
                              "shared by every call",
                           ko=f"모든 호출이 함께 쓰는 클래스 속성 `{base.__name__}.{name}` "
                              f"({_kind(value)})")
    return None


#: instructions that load the object an attribute access then reads or writes
_LOADS = ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_FAST", "LOAD_CLOSURE")


def _module_attribute(where: str, fn) -> str | None:
    """An attribute of a module that ``fn`` writes (``math._memo = {}``: it outlives the call
    like a global) or a private one it reads (``numpy._handoff``: state parked there)."""
    found = dict(_cells(fn))
    found.update((n, v) for n, v in _globals_used(fn))
    for code in _codes(fn.__code__):
        instructions = list(dis.get_instructions(code))
        imported = {after.argval for ins, after in zip(instructions, instructions[1:])
                    if ins.opname in ("IMPORT_NAME", "IMPORT_FROM")
                    and after.opname.startswith("STORE_")}
        for before, ins in zip(instructions, instructions[1:]):
            if before.opname not in _LOADS or not (
                    isinstance(found.get(before.argval), types.ModuleType)
                    or (before.opname == "LOAD_FAST" and before.argval in imported)):
                continue
            name = f"{before.argval}.{ins.argval}"
            if ins.opname in ("STORE_ATTR", "DELETE_ATTR"):
                return _keeps(where, say(en=f"it sets `{name}`, an attribute of a module, which "
                                            "outlives the call like a module-level name",
                                         ko=f"모듈의 속성 {particle(f'`{name}`', '을/를')} 바꿉니다. "
                                            "이는 모듈 수준의 이름처럼 호출보다 오래 삽니다"))
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and str(ins.argval).startswith("_"):
                return _keeps(where, say(en=f"it reads `{name}`, a private attribute of a "
                                            "module, where state can be parked between calls",
                                         ko=f"모듈의 비공개 속성 {particle(f'`{name}`', '을/를')} "
                                            "읽습니다. 호출 사이에 상태를 둘 수 있는 곳입니다"))
    return None


def not_plain(answer) -> str | None:
    """Why ``answer`` is not a plain function or class (a ``functools.partial``, an object
    with ``__call__``, a bound method), which carries what was bound into it from call to
    call; None when it is one."""
    if inspect.isfunction(answer) or inspect.isclass(answer) or \
            inspect.isfunction(getattr(answer, "py_func", None)):
        return None
    if isinstance(answer, functools.partial):
        bound = [f"{name}={_kind(value)}" for name, value in answer.keywords.items()]
        bound += [_kind(value) for value in answer.args]
        what = say(en=f"it is a functools.partial, whose bound arguments ({', '.join(bound)}) "
                      "are the same objects in every call",
                   ko=f"functools.partial이며, 묶인 인자 ({', '.join(bound)})는 모든 호출에서 "
                      "같은 객체입니다")
    elif inspect.ismethod(answer):
        what = say(en=f"it is a method bound to a {type(answer.__self__).__name__} object, "
                      "whose attributes outlive the call",
                   ko=f"{type(answer.__self__).__name__} 객체에 묶인 메서드이며, 그 객체의 "
                      "속성은 호출보다 오래 삽니다")
    else:
        what = say(en=f"it is a {type(answer).__name__} object with __call__, whose "
                      "attributes outlive the call",
                   ko=f"__call__을 가진 {type(answer).__name__} 객체이며, 그 속성은 호출보다 "
                      "오래 삽니다")
    where = getattr(answer, "__name__", None) or say(en="your answer", ko="답")
    return _keeps(where, say(en=f"{what}.  The answer is a plain function (def ...)",
                             ko=f"{what}.  답은 평범한 함수(def ...)입니다"))


def refusal(answer) -> str | None:
    """Why ``answer`` is refused for keeping state between calls or reaching around its
    arguments, in words naming what it did; None when it does neither."""
    plain_problem = not_plain(answer)
    if plain_problem is not None:
        return plain_problem
    if callable(answer) and not inspect.isclass(answer) and hasattr(answer, "cache_info"):
        return _keeps(getattr(answer, "__name__", "your function"),
                      say(en="it is memoized with functools' cache",
                          ko="functools 캐시로 결과를 기억합니다"))
    if inspect.isclass(answer):
        for klass in answer.__mro__:
            if not answers_own(klass):
                continue
            for name, value in vars(klass).items():
                if isinstance(value, MUTABLE_TYPES) and not _dunder(name):
                    return _keeps(f"{answer.__name__}", say(
                        en=f"the class attribute `{klass.__name__}.{name}` ({_kind(value)}) "
                           "is shared by every allocator the check makes",
                        ko=f"클래스 속성 `{klass.__name__}.{name}` ({_kind(value)})은 채점이 "
                           "만드는 모든 할당기가 함께 씁니다"))
                if hasattr(getattr(value, "__func__", value), "cache_info"):
                    return _keeps(f"{answer.__name__}.{name}", say(
                        en="it is memoized with functools' cache",
                        ko="functools 캐시로 결과를 기억합니다"))
    for where, fn in _functions(answer):
        problem = (_reach_of_function(where, fn) or _state_of_function(where, fn)
                   or _module_attribute(where, fn) or _names_pythons_tables(where, fn))
        if problem is not None:
            return problem
    return None
