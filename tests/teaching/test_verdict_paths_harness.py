"""The harness's verdict paths that the other teaching tests leave (``harness/base.py``,
``kept_state.py``, ``shapes.py``, ``faults.py``): each test grades an answer a learner could
write (or injects a fault into what the grader calls, as ``test_verdict_paths`` does) and reads
the verdict's words.  The answers are defined in this file, which the graders take for the
learner's own (``faults.origin``)."""

from __future__ import annotations

import cmath
import dataclasses
import enum
import functools
import math
import sys
import types
import typing

import numba
import numpy as np
import pytest

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.cache import CacheFullError
from paged_tutorial.teaching.harness import faults, shapes


# --- what the answer's code holds: closures, helpers, classes (base.py, kept_state.py) --------

def make_locate(trace=False):
    """A locate built by a factory, with a tracing switch: off, the closure's ``log`` is never
    assigned (an empty cell)."""
    if trace:
        log = print

    def locate(block_table, slot, layer, position, BLOCK_SIZE):
        if trace:
            log(slot, layer, position)
        logical_block, row = divmod(position, BLOCK_SIZE)
        return int(block_table[slot, layer, logical_block]), row
    return locate


def test_a_closure_whose_name_was_never_assigned_is_graded():
    # the scans of her closure (borrowed code, kept state) skip the empty cell of `log`
    verdict = ex.grade("02.locate", make_locate(trace=False))
    assert verdict.status == "correct", verdict.message


@dataclasses.dataclass
class Place:
    """Where a token goes: a record of two numbers, no state of the class's own."""
    block: int
    row: int


def locate_through_a_record(block_table, slot, layer, position, BLOCK_SIZE):
    logical_block, row = divmod(position, BLOCK_SIZE)
    place = Place(int(block_table[slot, layer, logical_block]), row)
    return place.block, place.row


def test_a_helper_class_that_holds_no_state_is_no_kept_state():
    # the class's attributes and its bases' (object skipped) hold no container: graded
    verdict = ex.grade("02.locate", locate_through_a_record)
    assert verdict.status == "correct", verdict.message


def _logical(position, BLOCK_SIZE):
    """The blocks before ``position``, counted one at a time."""
    return 0 if position < BLOCK_SIZE else 1 + _logical(position - BLOCK_SIZE, BLOCK_SIZE)


def _physical(block_table, slot, layer, position, BLOCK_SIZE):
    return int(block_table[slot, layer, _logical(position, BLOCK_SIZE)])


def _row(position, BLOCK_SIZE):
    return position - _logical(position, BLOCK_SIZE) * BLOCK_SIZE


def locate_with_helpers(block_table, slot, layer, position, BLOCK_SIZE):
    return _physical(block_table, slot, layer, position, BLOCK_SIZE), _row(position, BLOCK_SIZE)


def test_helpers_that_share_a_helper_are_graded():
    # _physical and _row both call _logical, which calls itself: the scan of her helpers
    # reads it once (and ends)
    verdict = ex.grade("02.locate", locate_with_helpers)
    assert verdict.status == "correct", verdict.message


@functools.lru_cache(maxsize=None)
def _split(position, BLOCK_SIZE):
    return divmod(position, BLOCK_SIZE)


def locate_with_a_memoized_split(block_table, slot, layer, position, BLOCK_SIZE):
    logical_block, row = _split(position, BLOCK_SIZE)
    return int(block_table[slot, layer, logical_block]), row


def test_a_helper_memoized_with_functools_is_kept_state():
    verdict = ex.grade("02.locate", locate_with_a_memoized_split)
    assert verdict.status == "wrong", verdict.message
    assert "locate_with_a_memoized_split keeps state between calls: it calls `_split`, " \
           "memoized with functools' cache" in verdict.message, verdict.message


def locate_printing_to_stderr(block_table, slot, layer, position, BLOCK_SIZE):
    logical_block, row = divmod(position, BLOCK_SIZE)
    print("locate", slot, layer, position, file=sys.stderr)      # a debugging print left in
    return int(block_table[slot, layer, logical_block]), row


def test_a_module_that_reaches_the_running_program_is_named_as_used():
    # no reaching name in her code (sys.stderr), but the module it is read from is sys
    verdict = ex.grade("02.locate", locate_printing_to_stderr)
    assert verdict.status == "wrong", verdict.message
    assert "reaches the running program around its arguments: it uses the module sys (as sys)" \
        in verdict.message, verdict.message


def locate_keeping_the_last_block(block_table, slot, layer, position, BLOCK_SIZE):
    logical_block, row = divmod(position, BLOCK_SIZE)
    math.last_block = int(block_table[slot, layer, logical_block])   # kept for the next call
    return math.last_block, row


def test_an_attribute_set_on_a_module_is_kept_state():
    verdict = ex.grade("02.locate", locate_keeping_the_last_block)
    assert verdict.status == "wrong", verdict.message
    assert "it sets `math.last_block`, an attribute of a module, which outlives the call" \
        in verdict.message, verdict.message


class TableReader:
    def locate(self, block_table, slot, layer, position, BLOCK_SIZE):
        logical_block, row = divmod(position, BLOCK_SIZE)
        return int(block_table[slot, layer, logical_block]), row


def test_a_bound_method_is_refused_for_the_object_it_carries():
    verdict = ex.grade("02.locate", TableReader().locate)
    assert verdict.status == "wrong", verdict.message
    assert "it is a method bound to a TableReader object, whose attributes outlive the call" \
        in verdict.message, verdict.message
    assert "The answer is a plain function (def ...)" in verdict.message, verdict.message


def test_a_memoized_jitted_locate_is_refused_as_memoized():
    # numba's dispatcher keeps the Python function as py_func, and lru_cache copies it onto
    # its wrapper: the wrapper passes for a plain function, but remembers results
    jitted = numba.njit(make_locate(trace=False))
    verdict = ex.grade("02.locate", functools.lru_cache(maxsize=None)(jitted))
    assert verdict.status == "wrong", verdict.message
    assert "locate keeps state between calls: it is memoized with functools' cache" \
        in verdict.message, verdict.message


class MemoAllocator(ex.AllocatorBase):
    """The article's allocator, with the blocks a length needs memoized."""

    @functools.lru_cache(maxsize=None)
    def blocks_for(self, new_len):
        return self.config.blocks_for_tokens(new_len)

    def ensure_capacity(self, slot, new_len):
        c = self.config
        self.check_length(slot, new_len)
        needed = [(layer, logical) for layer in range(c.num_layers)
                  for logical in range(self.blocks_for(new_len))
                  if self.table.entries[slot, layer, logical] == -1]
        if len(needed) > len(self.free_blocks):
            raise CacheFullError(f"slot {slot} needs {len(needed)} blocks")
        for layer, logical in needed:
            self.table.assign(slot, layer, logical, self.free_blocks.pop())

    def release(self, slot):
        pushed = []
        for layer in range(self.config.num_layers):
            for logical in range(self.config.MAX_BLOCKS_PER_SEQ):
                if self.table.entries[slot, layer, logical] != -1:
                    block = self.table.unassign(slot, layer, logical)
                    self.free_blocks.append(block)
                    pushed.append(block)
        return pushed


def test_a_memoized_method_of_an_allocator_is_kept_state():
    verdict = ex.grade("06.allocator", MemoAllocator)
    assert verdict.status == "wrong", verdict.message
    assert "MemoAllocator.blocks_for keeps state between calls: it is memoized with functools' " \
           "cache" in verdict.message, verdict.message


def test_a_function_remade_from_the_worked_solution_is_the_packages_code():
    # her own name and globals, the worked solution's code object
    worked = ex.reveal("02.locate").code
    remade = types.FunctionType(worked.__code__, globals(), "locate")
    verdict = ex.grade("02.locate", remade)
    assert verdict.status == "wrong", verdict.message
    assert "locate runs the package's own code (" in verdict.message, verdict.message
    assert "Write the method yourself" in verdict.message, verdict.message


def test_the_engines_own_function_passed_as_the_answer_is_refused():
    from paged_tutorial.backends.numba_cuda.kernels import attention

    verdict = ex.grade("05.softmax_update", attention.softmax_update)
    assert verdict.status == "wrong", verdict.message
    assert "softmax_update uses softmax_update from the engine's own code " \
           "(paged_tutorial.backends." in verdict.message, verdict.message
    assert "not to call the engine's version of it" in verdict.message, verdict.message


# --- what the answer returns, called on the host (base.host_call, need_int, need_real) -------

def kv_offset_returning_its_check(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM,
                                  HEAD_DIM, ITEMSIZE):
    offset = (token_in_block * KV_DIM + kv_head * HEAD_DIM + dim) * ITEMSIZE
    if is_value:
        offset += BLOCK_SIZE * KV_DIM * ITEMSIZE
    return 0 <= offset < 2 * BLOCK_SIZE * KV_DIM * ITEMSIZE     # the bounds check, not the offset


def test_an_offset_that_is_a_bool_is_named_a_bool():
    verdict = ex.grade("01.kv_offset", kv_offset_returning_its_check)
    assert verdict.status == "wrong", verdict.message
    assert "the offset is True, a bool; the kernel needs an integer (kv_byte_offset(" \
        in verdict.message, verdict.message


def locate_returning_the_tables_row(block_table, slot, layer, position, BLOCK_SIZE):
    return block_table[slot, layer], position % BLOCK_SIZE     # the logical block forgotten


def test_a_physical_block_that_is_an_array_is_named_with_its_shape():
    verdict = ex.grade("02.locate", locate_returning_the_tables_row)
    assert verdict.status == "wrong", verdict.message
    assert "the physical block is a ndarray (<array (" in verdict.message, verdict.message
    assert "the kernel needs one integer (locate(block_table, slot=" in verdict.message, \
        verdict.message


def kv_offset_k_half_only(token_in_block, kv_head, dim, is_value, BLOCK_SIZE, KV_DIM, HEAD_DIM,
                          ITEMSIZE):
    if is_value:
        raise NotImplementedError("the V half comes next")
    return (token_in_block * KV_DIM + kv_head * HEAD_DIM + dim) * ITEMSIZE


def test_not_implemented_error_leaves_the_puzzle_unsolved():
    verdict = ex.grade("01.kv_offset", kv_offset_k_half_only)
    assert verdict.status == "unsolved", verdict.message
    assert "kv_byte_offset still returns nothing: write its body" in verdict.message, \
        verdict.message


def softmax_update_with_cmath(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    correction = cmath.exp(current_max - new_max)
    weight = cmath.exp(score - new_max)
    return new_max, d * correction + weight, acc * correction + weight * v


def test_a_complex_state_is_not_a_number_for_the_kernel():
    verdict = ex.grade("05.softmax_update", softmax_update_with_cmath)
    assert verdict.status == "wrong", verdict.message
    assert "new_d is np.complex64(" in verdict.message, verdict.message
    assert "(complex64); the kernel needs a number (softmax_update)" in verdict.message, \
        verdict.message


# --- compiled the way a GPU compiles it (base.check_compiles, host_only_code) ----------------

def softmax_update_with_scratch(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    weights = np.empty(2)
    weights[0] = math.exp(current_max - new_max)
    weights[1] = math.exp(score - new_max)
    return new_max, d * weights[0] + weights[1], acc * weights[0] + weights[1] * v


def test_an_array_made_inside_a_device_function_is_refused():
    verdict = ex.grade("05.softmax_update", softmax_update_with_scratch)
    assert verdict.status == "wrong", verdict.message
    assert "Numba cannot compile your function as a device function: it allocates memory (an " \
           "array or a container built inside the function)" in verdict.message, verdict.message


def softmax_update_never_rescaled(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    weight = math.exp(score - new_max)
    return new_max, d + weight, acc + weight * v      # d and acc not rescaled when the max rises


def test_an_interrupt_while_numba_compiles_is_an_interrupt(monkeypatch):
    # the reader stops the kernel while Numba types her function (a second or so): nothing graded
    def typeof(value, *args):
        raise KeyboardInterrupt
    monkeypatch.setattr(numba, "typeof", typeof)
    verdict = ex.grade("05.softmax_update", softmax_update_never_rescaled)
    assert verdict.status == "unsolved", verdict.message
    assert "grading softmax_update was interrupted (KeyboardInterrupt) before it finished" \
        in verdict.message, verdict.message


def test_a_numba_failure_that_is_no_compile_error_leaves_the_grading_going(monkeypatch):
    # Numba raising something other than its compile errors (here typeof's ValueError for a
    # value it has no type for) says nothing of her code: the checks after it decide
    def typeof(value, *args):
        raise ValueError(f"cannot determine Numba type of {type(value)}")
    monkeypatch.setattr(numba, "typeof", typeof)
    verdict = ex.grade("05.softmax_update", softmax_update_never_rescaled)
    assert verdict.status == "wrong", verdict.message
    assert "scores climbing by" in verdict.message, verdict.message
    assert "Numba cannot compile" not in verdict.message, verdict.message


def _q_element(active_slot, q_row_stride, q_head, dim):
    return active_slot * q_row_stride + q_head * HEAD_DIM + dim      # noqa: F821 (the kernel's)


def _head_end(active_slot, q_row_stride, q_head):
    return _q_element(active_slot, q_row_stride, q_head, HEAD_DIM)   # noqa: F821


def _trace(q_head, thread_id, value):
    return f"q head {q_head}, thread {thread_id}: {value}"


def write_output_with_a_trace(q, q_row_stride, active_slot, q_head, thread_id, acc, d):
    print(_trace(q_head, thread_id, acc / d))                  # a debugging print left in
    at = _q_element(active_slot, q_row_stride, q_head, thread_id)
    if at < _head_end(active_slot, q_row_stride, q_head):
        store(q, at, acc / d)                                  # noqa: F821 (the kernel's)


def test_a_string_built_in_a_helper_is_found_past_a_helper_read_twice():
    # _q_element is reached from write_output and from _head_end: read once, and the scan
    # goes on to _trace, whose f-string a GPU cannot build
    verdict = ex.grade("05.write_output", write_output_with_a_trace)
    assert verdict.status == "wrong", verdict.message
    assert "the kernel failed with your write_output: _trace builds a string (an f-string, " \
           "str() or a literal) (line " in verdict.message, verdict.message
    assert "which exists only on the host" in verdict.message, verdict.message


# --- the shapes a kernel check draws (shapes.py) ---------------------------------------------

def test_a_case_at_a_layer_it_does_not_have_is_refused_naming_its_layers():
    with pytest.raises(ValueError, match=r"layer 2 is not one of the case's 2 layers: pass 0 "
                                         r"to 1"):
        shapes.case(np.random.default_rng(1), 1, head_dim=16, gqa=(1, 2), lens=[5],
                    num_layers=2, layer=2)
    assert shapes.case(np.random.default_rng(1), 1, head_dim=16, gqa=(1, 2), lens=[5],
                       num_layers=2, layer=1).layer == 1


def test_a_partly_filled_length_never_fills_its_last_block():
    rng = np.random.default_rng(7)
    # 16 fills its block: drawn from 16..17 only 17 may come back (16 is drawn and redrawn)
    assert {shapes.partly_filled(rng, 16, 17, 16) for _ in range(40)} == {17}
    drawn = [shapes.partly_filled(rng, block_size=12) for _ in range(200)]
    assert all(n % 12 and 1 <= n <= 32 for n in drawn), drawn


# --- whose code a frame runs (faults.py) -----------------------------------------------------

def test_a_path_entry_no_path_can_hold_is_passed_over(monkeypatch, tmp_path):
    # a distribution installed into a folder of sys.path (a --target install) is found past
    # an entry that cannot be resolved.  The installed names are read once per process, as
    # the first grading does (importlib.metadata itself fails on such an entry); read here
    # afresh, where a grading's watch (whose profile function calls origin) does not hide it
    faults._installed_names.cache_clear()
    assert "numpy" in faults._installed_names()
    (tmp_path / "numpy").mkdir()
    monkeypatch.setattr("sys.path", ["bad\x00entry", str(tmp_path), *sys.path])
    assert faults.origin(str(tmp_path / "numpy" / "core.py")) == "library"
    assert faults.origin(str(tmp_path / "her_module.py")) == "learner"


def softmax_update_importing_math(current_max, d, acc, score, v):
    import math as m                       # an import inside a device function
    new_max = max(current_max, score)
    correction = m.exp(current_max - new_max)
    exp_score = m.exp(score - new_max)
    return new_max, d * correction + exp_score, acc * correction + exp_score * v


def test_bytecode_numba_does_not_compile_is_a_compile_problem_not_a_pass():
    """Numba raises an ``import`` inside a function as ``UnsupportedBytecodeError``, a plain
    Exception: the part runs as Python in the simulator, but a GPU cannot compile it."""
    verdict = ex.grade("05.softmax_update", softmax_update_importing_math)
    assert verdict.status == "wrong", verdict.message
    assert "UnsupportedBytecodeError" in verdict.message, verdict.message


class BlockAndOffset(typing.NamedTuple):
    block: int
    offset: int = 0


class Half(enum.Enum):
    K = 0
    V = 1


def locate_with_a_named_tuple(block_table, slot, layer, position, BLOCK_SIZE):
    place = BlockAndOffset(int(block_table[slot, layer, position // BLOCK_SIZE]), position % BLOCK_SIZE)
    return place.block, place.offset


def test_a_named_tuple_helper_keeps_no_state():
    """A named tuple's ``_field_defaults`` is a dict Python keeps on every such class."""
    verdict = ex.grade("02.locate", locate_with_a_named_tuple)
    assert verdict.ok, verdict.message


def test_an_enum_helper_keeps_no_state():
    """An Enum's member tables are dicts and lists Python keeps on every such class."""
    from paged_tutorial.teaching.harness import kept_state

    assert kept_state._class_state(Half) is None
    assert kept_state._class_state(BlockAndOffset) is None


def locate_remembering_in_the_named_tuples_table(block_table, slot, layer, position,
                                                  BLOCK_SIZE):
    key = (slot, layer, position // BLOCK_SIZE)
    memo = BlockAndOffset._field_defaults
    if key not in memo:
        memo[key] = int(block_table[key])
    return memo[key], position % BLOCK_SIZE


def test_state_parked_in_a_named_tuples_own_table_is_kept_state():
    verdict = ex.grade("02.locate", locate_remembering_in_the_named_tuples_table)
    assert verdict.status == "wrong", verdict.message
    assert "keeps state between calls" in verdict.message, verdict.message
    assert "`_field_defaults`" in verdict.message, verdict.message
