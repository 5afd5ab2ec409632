"""The chapters' graders' verdict paths that the other teaching tests leave: each test grades a
plausible wrong answer (or a right one on a path no other test takes: the GPU's, where the
simulator's access log is not there) and reads the verdict's words.

The kernel parts below are device code written as a reader writes it in a notebook: the names
they use (cuda, float32, WARP_SIZE, NUM_WARPS...) are bound by the kernel's build."""

# flake8: noqa: F821  (the names are bound by attention.compile_parts)

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import paged_tutorial.teaching.exercises as ex  # noqa: E402
from paged_tutorial.backends.numba_cuda.kernels import attention  # noqa: E402
from paged_tutorial.backends.numba_cuda.runtime import access_log  # noqa: E402
from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction import score_handoff  # noqa: E402
from paged_tutorial.teaching.chapters.ch05_online_softmax import online_softmax  # noqa: E402
from paged_tutorial.teaching.harness import shapes  # noqa: E402
from test_verdict_paths import checker_code  # noqa: E402

SIMULATING = access_log.AVAILABLE
NEEDS_THE_SIMULATOR = pytest.mark.skipif(
    not SIMULATING, reason="these paths are told apart by the simulator's logs, or pretend a "
                           "GPU by hiding them")


def on_a_gpu(monkeypatch):
    """Grade as on a GPU: no access log of the kernel's reads, stores or shared memory."""
    monkeypatch.setattr(access_log, "AVAILABLE", False)


def draws(figure):
    fig = figure()
    assert fig.axes
    plt.close(fig)


# --- 04.token_score ------------------------------------------------------------------------

def token_score_without_scale(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += dot_products[w]
        score[0] = total
    cuda.syncthreads()
    return score[0]


def one_warps_butterfly(q_val, k, thread_id, scale, dot_products, score):
    # every lane of a warp gets the warp's sum: no shared memory, no barrier, but no other warp
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_xor_sync(WARP_FULL_MASK, qk, off)
    return qk * scale


def own_shared_array_without_scale(q_val, k, thread_id, scale, dot_products, score):
    warp_sums = cuda.shared.array(NUM_WARPS, float32)
    qk = q_val * k
    for off in (16, 8, 4, 2, 1):
        qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, off)
    if thread_id % WARP_SIZE == 0:
        warp_sums[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        total = float32(0.0)
        for w in range(NUM_WARPS):
            total += warp_sums[w]
        score[0] = total
    cuda.syncthreads()
    return score[0]


@NEEDS_THE_SIMULATOR
def test_a_token_score_without_scale_on_a_gpu_is_told_by_its_output_alone(monkeypatch):
    on_a_gpu(monkeypatch)
    verdict = ex.grade("04.token_score", token_score_without_scale)
    assert verdict.status == "wrong", verdict.message
    assert "outputs differ from the torch oracle" in verdict.message, verdict.message
    # no log: neither the probe nor the cells can say more, and there is no hand-off to draw
    assert "scale" not in verdict.message.split("]: ", 1)[1], verdict.message
    assert verdict.figure is None


@NEEDS_THE_SIMULATOR
def test_a_right_token_score_on_a_gpu_says_races_are_checked_in_the_simulator(monkeypatch):
    on_a_gpu(monkeypatch)
    verdict = ex.grade("04.token_score", ex.reveal("04.token_score"))
    assert verdict.status == "correct", verdict.message
    assert "equals the torch oracle's on this GPU" in verdict.message, verdict.message
    assert "checked in the simulator only" in verdict.message
    case = score_handoff.cases()[0]
    shown = score_handoff.run_parts(attention.ARTICLE_PARTS, case)
    assert shown.status == "correct" and "on this GPU" in shown.message, shown.message


@NEEDS_THE_SIMULATOR
def test_a_score_handed_out_by_one_warps_butterfly_asks_about_the_scale():
    # no shared write at all: the lane probe measures nothing, the cells thread 0 combined are
    # none, and the verdict falls back to its last question
    verdict = ex.grade("04.token_score", one_warps_butterfly)
    assert verdict.status == "wrong", verdict.message
    assert "(3 warp(s))" in verdict.message, verdict.message
    assert "every lane and every warp counted once: is the sum multiplied by scale exactly " \
           "once?" in verdict.message, verdict.message


@NEEDS_THE_SIMULATOR
def test_a_sum_in_a_shared_array_of_her_own_without_scale_is_told_the_scale():
    verdict = ex.grade("04.token_score", own_shared_array_without_scale)
    assert verdict.status == "wrong", verdict.message
    assert "the score does not follow `scale`" in verdict.message, verdict.message


DECODE_WITH_A_BUG = """
import sys

def decode(*args, **kwargs):
    if sys._getframe(1).f_code.co_name == "lane_counts":
        raise RuntimeError("checker bug")
    return real_decode(*args, **kwargs)
"""


@NEEDS_THE_SIMULATOR
def test_a_lane_probe_that_fails_leaves_the_verdict_to_the_other_checks(monkeypatch):
    # the probe's own launch failing (a fault of the grader's) measures nothing: the score
    # without scale is still refused, by the question the other checks leave
    decode = checker_code(DECODE_WITH_A_BUG, "decode", score_handoff,
                          real_decode=attention.decode)
    monkeypatch.setattr(attention, "decode", decode)
    verdict = ex.grade("04.token_score", token_score_without_scale)
    assert verdict.status == "wrong", verdict.message
    assert "is the sum multiplied by scale exactly once?" in verdict.message, verdict.message


# --- 05.softmax_update ---------------------------------------------------------------------

def softmax_update(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    correction = math.exp(current_max - new_max)
    exp_score = math.exp(score - new_max)
    return new_max, d * correction + exp_score, acc * correction + exp_score * v


def update_without_acc(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    correction = math.exp(current_max - new_max)
    return new_max, d * correction + math.exp(score - new_max)


def v_unweighted_when_the_max_stays(current_max, d, acc, score, v):
    if score > current_max:
        correction = math.exp(current_max - score)
        return score, d * correction + 1.0, acc * correction + v
    exp_score = math.exp(score - current_max)
    return current_max, d + exp_score, acc + v


def exp_ratio_instead_of_exp_difference(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    correction = math.exp(current_max) / math.exp(new_max)
    exp_score = math.exp(score) / math.exp(new_max)
    return new_max, d * correction + exp_score, acc * correction + exp_score * v


def test_an_update_that_returns_two_numbers_is_told_to_return_three():
    verdict = ex.grade("05.softmax_update", update_without_acc)
    assert verdict.status == "wrong", verdict.message
    assert "it must return three numbers: (new_max, new_d, new_acc)" in verdict.message, \
        verdict.message


@NEEDS_THE_SIMULATOR
def test_an_update_wrong_only_while_the_max_stays_is_shown_where_it_stays():
    case = shapes.case(np.random.default_rng(7), 7, head_dim=16, gqa=(1, 1), lens=[12],
                       max_slots=1, slots=[0])
    verdict = online_softmax.run_parts(v_unweighted_when_the_max_stays, case)
    assert verdict.status == "wrong", verdict.message
    assert "First difference, replayed on the host: token" in verdict.message
    assert "the running max stays" in verdict.message, verdict.message
    draws(verdict.figure)


@NEEDS_THE_SIMULATOR
def test_an_update_whose_exp_overflows_on_the_host_too_is_shown_failing_there():
    # exp(score) / exp(max) is exp(score - max) on paper; past a score of 709 it overflows
    case = online_softmax.wide_case(np.random.default_rng(21), 21)
    verdict = online_softmax.run_parts(exp_ratio_instead_of_exp_difference, case)
    assert verdict.status == "wrong", verdict.message
    assert "your update fails (see above)" in verdict.message, verdict.message


@NEEDS_THE_SIMULATOR
def test_a_right_update_draws_its_replay():
    verdict = ex.grade("05.softmax_update", softmax_update)
    assert verdict.status == "correct", verdict.message
    assert "without overflow" in verdict.message
    draws(verdict.figure)


# --- 03.walk_blocks on a GPU -------------------------------------------

@NEEDS_THE_SIMULATOR
def test_a_right_walk_on_a_gpu_says_its_reads_are_checked_in_the_simulator(monkeypatch):
    on_a_gpu(monkeypatch)
    verdict = ex.grade("03.walk_blocks", ex.reveal("03.walk_blocks"))
    assert verdict.status == "correct", verdict.message
    assert "the output equals the torch oracle's on this GPU" in verdict.message, \
        verdict.message


# --- 06.table_sync -------------------------------------------------------------------------

def sync_in_16_bits_through_torch(host_table, device_table, changed):
    import torch

    # half the bytes of int32 over the bus: block ids as int16
    ids = torch.from_numpy(host_table).to(torch.int16)
    index = torch.tensor(changed, dtype=torch.int64)
    device_table[index] = ids[index]


def sync_every_entry_by_its_shape(host_table, device_table, changed):
    for i in range(device_table.shape[0]):
        device_table[i] = host_table[i]


def sync_each_change_with_an_inclusive_slice(host_table, device_table, changed):
    for i in changed:
        device_table[i:i + 2] = host_table[i:i + 2]         # "i to i + 1", the end taken as in


def test_a_sync_that_sends_block_ids_as_int16_through_torch_is_told_the_bits():
    verdict = ex.grade("06.table_sync", sync_in_16_bits_through_torch)
    assert verdict.status == "wrong", verdict.message
    assert "cut to 16 bits" in verdict.message, verdict.message


def test_a_sync_over_the_device_tables_shape_copies_the_whole_table():
    verdict = ex.grade("06.table_sync", sync_every_entry_by_its_shape)
    assert verdict.status == "wrong", verdict.message
    assert "copied the whole table" in verdict.message, verdict.message


def test_a_sync_that_writes_a_neighbour_of_each_change_writes_more_than_changed():
    verdict = ex.grade("06.table_sync", sync_each_change_with_an_inclusive_slice)
    assert verdict.status == "wrong", verdict.message
    assert "changed: copy only the entries in `changed`" in verdict.message, verdict.message
