"""The answer guard's decisions, one by one, made on frames built here.

In a grading the guard decides inside a profile function and an audit hook, which Python runs
without tracing, so ``test_answer_guard.py`` (whole answers, graded) proves the refusals but
coverage.py cannot see which branch made them.  Here the same decision functions are called
directly, as ordinary calls, on frames whose code is real: this file's functions stand for her
code (a test file is "learner" code to the guard), the package's functions for the package's.
"""

from __future__ import annotations

import inspect
import json
import sys
import threading
from types import SimpleNamespace

import pytest

import paged_tutorial as pt
from paged_tutorial.cache.block_table import BlockTable
from paged_tutorial.teaching.harness import answer_guard
from paged_tutorial.teaching.harness.answer_guard import AnswerRefused, Guard
from paged_tutorial.teaching.harness.base import Wrong
from paged_tutorial.teaching.language import pinned


def hers():
    """Stands for a line of her code: its code object is the caller in the frames below."""


def _config():
    return pt.CacheConfig(num_layers=1, num_kv_heads=1, head_dim=2, dtype="float32",
                          kv_cache_bytes=4 * 2 * 16 * 2 * 4, max_slots=1, max_seq_len=64)


def _frame(code, caller=hers.__code__, **f_locals):
    """A frame starting ``code``, called from ``caller`` (None: no caller), with ``f_locals``."""
    back = None if caller is None else SimpleNamespace(f_code=caller, f_back=None, f_locals={})
    return SimpleNamespace(f_code=code, f_back=back, f_locals=f_locals)


def _watch(*handed):
    return answer_guard._Watch(Guard("a puzzle"), handed)


def _refused(watch, frame, event, arg=None) -> str:
    with pytest.raises(AnswerRefused) as raised:
        watch.profile(frame, event, arg)
    assert watch.guard.refusal == str(raised.value)
    return watch.guard.refusal


def test_a_call_from_her_code_into_the_package_is_refused_by_its_dotted_name():
    code = BlockTable.flat_index.__code__
    says = _refused(_watch(), _frame(code, self=object()), "call")
    assert "called paged_tutorial.cache.block_table.BlockTable.flat_index" in says
    assert "reaches the running program" in says


def test_a_method_of_an_object_she_was_handed_is_hers_to_call():
    config = _config()
    watch = _watch(config)
    # a plain method, a property's getter, a classmethod called on the handed type
    watch.profile(_frame(pt.CacheConfig.blocks_for_tokens.__code__, self=config), "call", None)
    watch.profile(_frame(pt.CacheConfig.V_OFFSET.fget.__code__, self=config), "call", None)
    watch.profile(_frame(pt.CacheConfig.for_model.__func__.__code__, cls=pt.CacheConfig),
                  "call", None)
    assert watch.guard.refusal is None


def test_the_same_method_on_an_object_she_was_not_handed_is_refused():
    handed, other = _config(), _config()          # both alive: the watch keeps only ids
    says = _refused(_watch(handed), _frame(pt.CacheConfig.blocks_for_tokens.__code__,
                                           self=other), "call")
    assert "CacheConfig.blocks_for_tokens" in says


def test_a_classmethod_of_a_type_she_was_not_handed_is_refused():
    code = pt.CacheConfig.for_model.__func__.__code__
    says = _refused(_watch(), _frame(code, cls=pt.CacheConfig), "call")
    assert "CacheConfig.for_model" in says


def test_a_package_function_a_handed_object_holds_is_hers_to_call():
    holder = SimpleNamespace(edit=BlockTable.assign)        # as a table's edit methods are
    watch = _watch(holder)
    watch.profile(_frame(BlockTable.assign.__code__, self=object()), "call", None)
    assert watch.guard.refusal is None


def test_a_function_a_handed_object_holds_and_what_it_holds_are_hers_to_call():
    def edit(*args):
        return args
    holder = SimpleNamespace(edit=edit, config=_config())
    watch = _watch(holder)
    watch.profile(_frame(edit.__code__), "call", None)
    # an object one level in (the holder's config) counts as handed: its methods may be called
    watch.profile(_frame(pt.CacheConfig.blocks_for_tokens.__code__, self=holder.config),
                  "call", None)
    assert watch.guard.refusal is None


def test_a_package_function_without_arguments_is_never_hers_to_call():
    code = pt.CacheConfig.blocks_for_tokens.__code__.replace(co_argcount=0)
    says = _refused(_watch(_config()), _frame(code), "call")
    assert "blocks_for_tokens" in says


def test_the_package_exceptions_methods_are_hers_to_call():
    watch = _watch()
    watch.profile(_frame(Wrong.__init__.__code__, self=Wrong("a verdict")), "call", None)
    assert watch.guard.refusal is None


def test_a_method_name_the_type_does_not_define_is_not_the_handed_objects():
    config = _config()
    # a code object named like no attribute of CacheConfig, called with the handed config
    code = BlockTable.flat_index.__code__.replace(co_name="not_an_attribute")
    assert not answer_guard._defines(pt.CacheConfig, code)
    says = _refused(_watch(config), _frame(code, self=config), "call")
    assert "flat_index" in says
    # and a code object named like a method of CacheConfig that is not that method's code
    impostor = BlockTable.flat_index.__code__.replace(co_name="blocks_for_tokens")
    assert not answer_guard._defines(pt.CacheConfig, impostor)
    assert "flat_index" in _refused(_watch(config), _frame(impostor, self=config), "call")


def test_calls_made_by_the_package_or_with_no_caller_are_not_watched():
    watch = _watch()
    code = BlockTable.flat_index.__code__
    watch.profile(_frame(code, caller=None, self=object()), "call", None)
    watch.profile(_frame(code, caller=BlockTable.assign.__code__, self=object()), "call", None)
    # and her calls into code that is neither the package's nor the machinery's
    watch.profile(_frame(json.dumps.__code__, obj=1), "call", None)
    watch.profile(_frame(hers.__code__), "return", None)
    watch.profile(_frame(hers.__code__), "c_return", len)
    assert watch.guard.refusal is None


def test_a_call_into_the_introspection_modules_is_refused_by_module_and_name():
    says = _refused(_watch(), _frame(inspect.getmembers.__code__, object=1), "call")
    assert "called getmembers from inspect" in says


@pytest.mark.parametrize("builtin, shown", [
    (globals, "builtins.globals"),
    (sys._getframe, "sys._getframe"),
    (int.__subclasses__, "int.__subclasses__"),
    (SimpleNamespace(__name__="eval", __self__=3), "int.eval"),
    (SimpleNamespace(__name__="vars"), "called vars"),
])
def test_an_introspection_builtin_called_by_her_code_is_refused_naming_its_owner(builtin, shown):
    says = _refused(_watch(), _frame(hers.__code__), "c_call", builtin)
    assert shown in says


def test_a_builtin_called_outside_her_code_or_not_an_introspection_one_is_allowed():
    watch = _watch()
    watch.profile(_frame(hers.__code__), "c_call", len)
    watch.profile(_frame(BlockTable.assign.__code__), "c_call", globals)
    assert watch.guard.refusal is None


def test_the_first_refusal_is_kept_and_the_hook_flag_is_cleared_after_a_refusal():
    watch = _watch()
    _refused(watch, _frame(hers.__code__), "c_call", globals)
    first = watch.guard.refusal
    with pytest.raises(AnswerRefused):
        watch.profile(_frame(hers.__code__), "c_call", vars)
    assert watch.guard.refusal == first
    assert not getattr(answer_guard._STATE, "in_hook", False)


def test_the_refusals_are_spoken_in_korean_too():
    with pinned("ko"):
        says = _refused(_watch(), _frame(hers.__code__), "c_call", globals)
    assert "불렀습니다" in says and "builtins.globals" in says


def test_a_dotted_name_is_the_module_in_the_package_and_else_the_file_name():
    assert answer_guard._qualified(BlockTable.assign.__code__) == \
        "paged_tutorial.cache.block_table.BlockTable.assign"
    for elsewhere in ("/elsewhere/her_file.py", "bad\0name"):
        odd = hers.__code__.replace(co_filename=elsewhere)
        assert answer_guard._qualified(odd) == f"{elsewhere}.hers"


def test_a_file_name_the_system_cannot_resolve_is_not_the_package():
    odd = hers.__code__.replace(co_filename="bad\0name")
    assert answer_guard._in_package(odd) is False
    assert answer_guard._in_package(odd) is False          # the cached answer
    assert answer_guard._in_package(BlockTable.assign.__code__) is True


def test_a_property_setter_is_a_method_of_its_class():
    class Holder:
        @property
        def value(self):
            return 1

        @value.setter
        def value(self, new):
            pass

    assert answer_guard._defines(Holder, Holder.value.fset.__code__)
    assert not answer_guard._defines(Holder, hers.__code__)


# --- the audit hook -----------------------------------------------------------------------

class _Watching:
    """``watch`` as the watch of this thread's running call, for the length of the block."""

    def __init__(self, watch):
        self.watch = watch

    def __enter__(self):
        answer_guard._STATE.watch = self.watch
        return self.watch

    def __exit__(self, *exc):
        answer_guard._STATE.watch = None


def test_an_environment_write_under_her_call_is_refused_naming_the_key():
    watch = _watch()
    with _Watching(watch), pytest.raises(AnswerRefused):
        answer_guard._audit("os.putenv", (b"SECRET_KEY", b"1"))
    assert "wrote os.environ['SECRET_KEY']" in watch.guard.refusal
    assert "state kept outside the call" in watch.guard.refusal
    other = _watch()
    with _Watching(other), pytest.raises(AnswerRefused):
        answer_guard._audit("os.unsetenv", ())
    assert "os.environ['?']" in other.guard.refusal


def test_a_frame_or_globals_read_by_her_code_is_refused_naming_the_attribute():
    watch = _watch()
    with _Watching(watch), pytest.raises(AnswerRefused):
        answer_guard._audit("object.__getattr__", (hers, "__globals__"))
    assert "read object.__getattr__ '__globals__'" in watch.guard.refusal
    other = _watch()
    with _Watching(other), pytest.raises(AnswerRefused):
        answer_guard._audit("gc.get_objects", (None,))
    assert "read gc.get_objects" in other.guard.refusal


def test_the_hook_is_idle_outside_her_calls_inside_the_guards_own_reads_and_for_other_events():
    answer_guard._audit("os.putenv", (b"K", b"1"))                # no call of hers running
    watch = _watch()
    with _Watching(watch):
        answer_guard._audit("open", ("a file", "r", 0))           # an event it does not watch
        answer_guard._STATE.in_hook = True
        try:
            answer_guard._audit("sys._getframe", (1,))            # the guard's own read
        finally:
            answer_guard._STATE.in_hook = False
    assert watch.guard.refusal is None


def test_a_read_made_by_the_package_under_her_call_is_not_hers():
    watch = _watch()
    package_code = BlockTable.assign.__code__
    # the read's frame is the package's: run _audit from code that claims the package's file
    namespace = {"audit": answer_guard._audit}
    exec(compile("def read():\n    audit('sys._getframe', (0,))\n",
                 package_code.co_filename, "exec"), namespace)
    with _Watching(watch):
        namespace["read"]()
    assert watch.guard.refusal is None


def test_the_hook_is_added_once_per_process_from_any_thread():
    answer_guard._add_hook()
    threads = [threading.Thread(target=answer_guard._add_hook) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answer_guard._HOOK_ADDED


def test_her_method_calling_her_other_method_runs_under_the_one_watch():
    class Hers:
        def twice(self, x):
            return self.once(x) * 2

        def once(self, x):
            return x + 1

    guard = Guard("a puzzle")
    assert answer_guard.guarded(Hers, guard)().twice(1) == 4
    assert guard.refusal is None and getattr(answer_guard._STATE, "watch", None) is None


def test_a_guarded_class_wraps_her_methods_once_and_leaves_pythons_hooks():
    class Base:
        def step(self):
            return "base"

    class Hers(Base):
        size = 3

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)

        def step(self):
            return "hers"

    stand_in = answer_guard.guarded(Hers, Guard("a puzzle"))
    assert stand_in.__name__ == "Hers" and stand_in.__qualname__ == Hers.__qualname__
    assert "step" in vars(stand_in) and "size" not in vars(stand_in)
    assert "__init_subclass__" not in vars(stand_in)
    assert stand_in().step() == "hers"
