"""Every verdict a grader can give is reached by a test, with a plausible answer that earns it,
and each test reads the verdict's words: the wrong-answer branches, the grader's own faults
(reported as the grader's, with its traceback, never as hers) and the Korean text.  The README's
test command measures the graders' branch coverage; this file holds the paths the other
teaching tests leave."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.teaching.language import set_language
from paged_tutorial.teaching.chapters.ch03_address_arithmetic import block_walk
from paged_tutorial.teaching.chapters.ch05_online_softmax import online_softmax, output_store
from paged_tutorial.teaching.chapters.ch06_block_lifetime import allocator
from paged_tutorial.teaching.harness import base, engine_harness, faults, mistakes, shapes
from paged_tutorial.teaching.time_limit import TimeLimitExceeded
from helpers.on_this_device import expected
from test_language import english_sentence

CHECKER_FAILED = {"en": "checker itself failed", "ko": "채점기 자신이 실패"}


def checker_code(source: str, name: str, module, **scope):
    """The function ``name`` defined by ``source`` as if it were written in ``module``'s file:
    a frame of it is the checker's own (``faults.origin``), as a bug of ours would be."""
    namespace = dict(scope)
    exec(compile(source, module.__file__, "exec"), namespace)
    return namespace[name]


def assert_checker_fault(verdict, kind: str, language: str = "en"):
    assert verdict.status == "unsolved", verdict.message
    assert CHECKER_FAILED[language] in verdict.message, verdict.message
    assert kind in verdict.message and "checker bug" in verdict.message, verdict.message


# --- the grader's own faults, where a grader catches exceptions around her code --------------

RUN_WITH_A_BUG = """
def run(engine, requests, **options):
    if "against" in options:
        raise {kind}("checker bug")
    return real_run(engine, requests, **options)
"""


def her_allocator():
    """A right allocator written in her cell (the worked solution's source run there): the
    package's own class, handed in as it is, is refused before any fault could be provoked."""
    worked = ex.reveal("06.allocator")
    space = {**vars(sys.modules[worked.code.__module__]), "__name__": "her_cell"}
    exec(compile(worked.source, "<her cell>", "exec"), space)
    return space[worked.code.__name__]


@pytest.mark.parametrize("language", ["en", "ko"])
@pytest.mark.parametrize("kind", ["ValueError", "AssertionError"])
def test_the_allocator_graders_own_fault_in_the_engine_run_is_the_graders(monkeypatch, kind,
                                                                          language):
    # the engine run is where the cache's invariants (AssertionError) and the engine's check of
    # an entry (ValueError) catch her allocator's mistakes: the same kinds raised by the
    # grader's own code are its fault
    run = checker_code(RUN_WITH_A_BUG.format(kind=kind), "run", engine_harness,
                       real_run=engine_harness.run)
    monkeypatch.setattr(allocator, "run", run)
    set_language(language)
    assert_checker_fault(ex.grade("06.allocator", her_allocator()), kind, language)


API_WITH_A_BUG = """
import sys

def through_the_api(table):
    if sys._getframe(1).f_code.co_name == method:
        raise {kind}("checker bug")
    return real(table)
"""


@pytest.mark.parametrize("method, kind", [("ensure_capacity", "IndexError"),
                                          ("ensure_capacity", "TypeError"),
                                          ("release", "TypeError")])
def test_the_allocator_graders_own_fault_around_her_methods_is_the_graders(monkeypatch, method,
                                                                           kind):
    # each call of her ensure_capacity and release runs inside the grader's guard of the
    # table; an IndexError there is her pop from an empty list, anything else her exception,
    # unless the grader's own code raised it
    guard = checker_code(API_WITH_A_BUG.format(kind=kind), "through_the_api", allocator,
                         real=allocator.through_the_api, method=method)
    monkeypatch.setattr(allocator, "through_the_api", guard)
    assert_checker_fault(ex.grade("06.allocator", her_allocator()), kind)


# --- the runner's verdicts for whatever a grading raises (base.Puzzle) -----------------------

def _puzzle(grader):
    return base.Puzzle(name="99.probe", title="probe", signature="def probe(x):",
                       docstring="", hint="", runs_in="a test", article="-", grader=grader)


def _answer(x):
    return x


def _raising(exc):
    def grader(fn):
        fn(1)
        raise exc
    return grader


@pytest.mark.parametrize("language", ["en", "ko"])
@pytest.mark.parametrize("raised, status, words", [
    (TimeLimitExceeded(), "wrong", {"en": "was still running after", "ko": "끝나지 않아"}),
    (SystemExit(3), "wrong", {"en": "sys.exit(3)", "ko": "sys.exit(3)를 호출했습니다"}),
    (KeyboardInterrupt(), "unsolved", {"en": "was interrupted", "ko": "중단되었습니다"}),
    (MemoryError(), "wrong", {"en": "more memory than this machine has",
                              "ko": "메모리보다 많은 메모리"}),
    (base.Unsolved(), "unsolved", {"en": "still returns nothing", "ko": "아직 아무것도"}),
])
def test_each_way_a_grading_ends_has_its_verdict(raised, status, words, language):
    set_language(language)
    verdict = _puzzle(_raising(raised)).grade(_answer)
    assert verdict.status == status and words[language] in verdict.message, verdict.message


@pytest.mark.parametrize("language", ["en", "ko"])
def test_her_exception_outside_a_host_call_stops_the_grading_as_hers(language):
    def grader(fn):
        return fn({})                  # her code raises where no host_call wraps it

    def probe(x):
        return x["missing"]
    set_language(language)
    verdict = _puzzle(grader).grade(probe)
    assert verdict.status == "wrong", verdict.message
    if language == "en":
        assert "grading stopped: KeyError was raised while your probe ran: 'missing'" \
            in verdict.message
    else:
        assert "없는 키를 찾았습니다 (영어 원문: KeyError: 'missing')" in verdict.message
        assert english_sentence(verdict.message) is None, verdict.message


def test_a_message_that_cannot_be_made_is_named():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    def probe(x):
        raise Unprintable()
    verdict = _puzzle(lambda fn: fn(1)).grade(probe)
    assert verdict.status == "wrong"
    assert "<its message raised RuntimeError>" in verdict.message, verdict.message


# --- whose code a frame runs (faults.origin) -------------------------------------------------

def test_frames_no_file_holds_are_told_apart(monkeypatch, tmp_path):
    assert faults.origin("<frozen importlib._bootstrap>") == "library"
    assert faults.origin("bad\x00name.py") == "learner"          # no path: a cell's code
    # a distribution installed into a folder of sys.path (a --target install on PYTHONPATH)
    (tmp_path / "numpy").mkdir()
    monkeypatch.setattr("sys.path", [str(tmp_path), *__import__("sys").path])
    assert faults.origin(str(tmp_path / "numpy" / "core.py")) == "library"
    assert faults.origin(str(tmp_path / "her_module.py")) == "learner"


# --- where two engine runs part (engine_harness) ---------------------------------------------

def _state(kind="decode", logits=(1.0,), tokens=None, table=(0,), free=(1,)):
    import numpy as np
    import torch

    return engine_harness.StepState(0, kind, tokens or {0: 5}, [],
                                    None if logits is None else torch.tensor(logits),
                                    np.array(table), list(free))


@pytest.mark.parametrize("mine, what", [
    (_state(kind="prefill"), "kind"),
    (_state(logits=(2.0,)), "logits"),
    (_state(logits=None), "logits"),
    (_state(tokens={0: 6}), "logits"),
    (_state(table=(1,)), "table"),
    (_state(free=(2,)), "free"),
])
def test_the_first_difference_of_two_runs_is_named(mine, what):
    assert engine_harness.first_difference([mine], [_state()], compare_blocks=True) == (0, what)
    assert engine_harness.first_difference([_state(), _state()], [_state()], True) == \
        (1, "length")
    assert engine_harness.first_difference([_state()], [_state()], True) is None


def test_logits_that_are_not_finite_are_never_the_same():
    import torch

    assert engine_harness.same_logits(None, None)
    nan = torch.tensor([float("nan")])
    assert not engine_harness.same_logits(nan, nan.clone())


@pytest.mark.parametrize("language", ["en", "ko"])
def test_an_engine_step_that_never_ends_is_stopped_with_its_number(monkeypatch, language):
    # the worked allocator, whose release (called by the engine's step when a request
    # finishes) never returns
    from paged_tutorial.cache import CacheFullError

    monkeypatch.setattr(engine_harness, "STEP_LIMIT_S", 0.5)
    source = ex.reveal("06.allocator").source.replace(
        "    def release(self, slot):\n",
        "    def release(self, slot):\n        n = 0\n        while n >= 0:\n            n += 1\n")
    scope = {"AllocatorBase": ex.AllocatorBase, "CacheFullError": CacheFullError}
    exec(compile(source, "<her cell>", "exec"), scope)
    set_language(language)
    verdict = ex.grade("06.allocator", scope["ArticleAllocator"])
    assert verdict.status == "wrong", verdict.message
    assert {"en": "was still running after 0.5 s", "ko": "0.5초가 지나도 끝나지 않아"}[language] \
        in verdict.message, verdict.message


# --- the chapters' demonstrations of classic mistakes (puzzles/mistakes.py) ------------------
# (the notebooks show these verdicts; nbval runs them in a kernel of its own, untraced)

@pytest.mark.parametrize("language", ["en", "ko"])
def test_the_softmax_without_a_running_max_fails_in_the_kernel_and_is_replayed(language):
    set_language(language)
    case = online_softmax.wide_case(np.random.default_rng(21), 21)
    verdict = online_softmax.run_parts(mistakes.sum_without_max, case)
    assert verdict.status == "wrong" and verdict.figure is not None
    # the simulator's math.exp raises on an overflow; a GPU's gives inf, and the output NaN
    words = {"en": [expected("the kernel failed with your function: OverflowError: math range "
                             "error", "NaN or inf"),
                    "First difference, replayed on the host: token 0"],
             "ko": [expected("여러분의 함수로 커널이 실패했습니다: 수가 너무 커서 나타낼 수 "
                             "없습니다 (영어 원문: OverflowError: math range error)",
                             "NaN 또는 inf"), "호스트에서 재현한 첫 차이"]}
    for said in words[language]:
        assert said in verdict.message, verdict.message
    assert online_softmax.run_parts(attention.softmax_update, case).status == "correct"


def test_the_unguarded_store_and_the_floor_block_count_are_named():
    stored = output_store.run_parts(
        attention.ARTICLE_PARTS.replace(write_output=mistakes.unguarded_store),
        shapes.case(np.random.default_rng(5), 5, head_dim=40, gqa=(1, 2), lens=[3, 2]))
    assert stored.status == "wrong"
    assert expected("thread 40 wrote q element 40", "own no dimension") in stored.message, \
        stored.message
    walked = block_walk.run_parts(
        attention.ARTICLE_PARTS.replace(blocks_to_read=mistakes.floor_block_count),
        shapes.case(np.random.default_rng(3), 3, head_dim=40, gqa=(1, 2), lens=[20, 9],
                    num_layers=2))
    assert walked.status == "wrong"
    assert expected("read 1 block-table entries, but its 20 tokens fill 2 logical block(s)",
                    "A GPU logs no reads") in walked.message, walked.message
