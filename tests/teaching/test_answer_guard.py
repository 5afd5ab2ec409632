"""Host-side answers that reach the package or keep state where the static scan cannot see
it are refused, naming what they did; the worked solutions still pass under the watch."""

import functools
import operator
import os
import sys

import pytest

import paged_tutorial as pt
from paged_tutorial.teaching import exercises as ex
import importlib

progress = importlib.import_module("paged_tutorial.teaching.exercises.progress")


def _name(*codes):
    return "".join(map(chr, codes))


def _spelled(backwards):
    """``backwards`` read from its end, so that no name the static scan knows is a constant."""
    return _name(*map(ord, reversed(backwards)))


def locate_through_pt(block_table, slot, layer, position, BLOCK_SIZE):
    found = operator.attrgetter(_spelled("etacol.snoitulos.sesicrexe"))(pt)
    return found(block_table, slot, layer, position, BLOCK_SIZE)


def locate_reading_frames(block_table, slot, layer, position, BLOCK_SIZE):
    try:
        raise ValueError
    except ValueError as error:
        trace = operator.attrgetter(_spelled("__kcabecart__"))(error)
        operator.attrgetter(_spelled("emarf_bt"))(trace)
    return int(block_table[slot, layer, position // BLOCK_SIZE]), position % BLOCK_SIZE


def locate_in_environ(block_table, slot, layer, position, BLOCK_SIZE):
    key = f"SANDBOX_TEST_{slot}_{layer}_{position // BLOCK_SIZE}"
    if key not in os.environ:
        os.environ[key] = str(int(block_table[slot, layer, position // BLOCK_SIZE]))
    return int(os.environ[key]), position % BLOCK_SIZE


def can_share_through_globals(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    for value in operator.attrgetter(_spelled("__tcid__"))(type(found)).values():
        try:
            spaces = operator.attrgetter(_spelled("__slabolg__"))(value)
        except AttributeError:
            continue
        rule = spaces.get(_spelled("erahs_yam"))
        if rule is not None:
            return rule(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE)
    return False


def _locate_memo(block_table, slot, layer, position, BLOCK_SIZE, memo):
    key = (slot, layer, position // BLOCK_SIZE)
    return memo.setdefault(key, int(block_table[key])), position % BLOCK_SIZE


class _CallableLocate:
    def __init__(self):
        self.seen = {}

    def __call__(self, block_table, slot, layer, position, BLOCK_SIZE):
        return int(block_table[slot, layer, position // BLOCK_SIZE]), position % BLOCK_SIZE


def locate_keyword_only(block_table, slot, layer, position, BLOCK_SIZE, *, memo=None):
    return int(block_table[slot, layer, position // BLOCK_SIZE]), position % BLOCK_SIZE


def locate_defaulted(block_table, slot, layer, position, BLOCK_SIZE, seen={}):
    return int(block_table[slot, layer, position // BLOCK_SIZE]), position % BLOCK_SIZE


@pytest.mark.parametrize("puzzle, answer, says", [
    ("02.locate", locate_through_pt, "called paged_tutorial."),
    ("02.locate", locate_reading_frames, "'tb_frame'"),
    ("02.locate", locate_in_environ, "wrote os.environ['SANDBOX_TEST_"),
    ("09.can_share", can_share_through_globals, "may_share"),
    ("02.locate", functools.partial(_locate_memo, memo={}), "functools.partial"),
    ("02.locate", _CallableLocate(), "_CallableLocate object with __call__"),
    ("02.locate", locate_keyword_only, "`memo` is keyword-only"),
    ("02.locate", locate_defaulted, "`seen` has a default ({})"),
])
def test_an_answer_that_reaches_around_or_keeps_state_is_refused_by_name(puzzle, answer, says):
    verdict = ex.grade(puzzle, answer)
    assert verdict.status == "wrong" and says in verdict.message, verdict.message


def test_a_host_part_is_called_by_the_engine_not_the_kernel():
    assert "the engine calls it" in ex.grade("02.locate", locate_defaulted).message


@pytest.mark.parametrize("puzzle", ["01.kv_offset", "02.locate", "06.allocator",
                                    "06.table_sync", "09.can_share"])
def test_the_worked_solutions_pass_under_the_watch(puzzle):
    code = ex.reveal(puzzle).code
    source = ex.reveal(puzzle).source
    space = {**vars(sys.modules[code.__module__]), "__name__": "her_cell"}
    exec(compile(source, "<her cell>", "exec"), space)
    mine = space[code.__name__]
    verdict = ex.grade(puzzle, mine)
    assert verdict.ok, verdict.message


def test_a_check_after_reveal_is_recorded_as_revealed(capsys, monkeypatch):
    monkeypatch.setattr(progress, "_REVEALED", set())
    monkeypatch.setattr(progress, "_SEEN", {})
    name = "02.locate"
    shown = ex.reveal(name)
    space = {}
    exec(compile(shown.source, "<her cell>", "exec"), space)
    assert ex.check(name, space["locate"]) is False      # right, but not hers to claim
    out = capsys.readouterr().out
    assert "revealed" in out and "not solved" in out
    assert progress._SEEN[name]["status"] == "revealed"



def test_pythons_own_bookkeeping_on_a_standard_base_is_not_her_state():
    """Reading ``abc.ABC.__annotations__`` (Python 3.12's imports and ``typing.get_type_hints``
    do) stores an empty dict in the class; an allocator whose bases derive from ABC keeps no
    state for it."""
    import abc

    abc.ABC.__annotations__
    assert "__annotations__" in vars(abc.ABC)
    code = ex.reveal("06.allocator").code
    assert abc.ABC in code.__mro__
    space = {**vars(sys.modules[code.__module__]), "__name__": "her_cell"}
    exec(compile(ex.reveal("06.allocator").source, "<her cell>", "exec"), space)
    verdict = ex.grade("06.allocator", space[code.__name__])
    assert verdict.ok, verdict.message


def test_a_class_that_names_pythons_module_as_its_own_is_still_hers():
    from paged_tutorial.teaching.harness import kept_state

    class Remembers:
        seen = {}
    Remembers.__module__ = "abc"
    assert "keeps state" in kept_state.refusal(type("Mine", (Remembers,), {
        "__module__": "abc", "ensure_capacity": lambda self, slot, new_len: None}))


def test_her_method_may_call_her_other_methods():
    """A right allocator that splits its work into a helper method of its own is graded right:
    the call into the watched stand-in of her helper is her code calling her code."""
    code = ex.reveal("06.allocator").code
    space = {**vars(sys.modules[code.__module__]), "__name__": "her_cell"}
    exec(compile(ex.reveal("06.allocator").source, "<her cell>", "exec"), space)
    worked = space[code.__name__]

    class WithHelper(worked):
        def ensure_capacity(self, slot, new_len):
            return self.grow(slot, new_len)

        def grow(self, slot, new_len):
            return worked.ensure_capacity(self, slot, new_len)

    verdict = ex.grade("06.allocator", WithHelper)
    assert verdict.ok, verdict.message
