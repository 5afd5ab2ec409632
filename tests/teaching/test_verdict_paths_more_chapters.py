"""More of the chapters' graders' verdict paths that the other teaching tests leave (chapters 01,
02, 03, 05 and 09): each test grades a plausible wrong answer (or a right one on a path no other
test takes: the GPU's, where the simulator's access log is not there, or a helper shared by two
helpers of hers), or injects a fault into the grader's own code, and reads the verdict's words.

The kernel parts below are device code written as a reader writes it in a notebook: the names
they use (cuda, float32, BLOCK_SIZE, load...) are bound by the kernel's build."""

# flake8: noqa: F821  (the names are bound by attention.compile_parts)

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import paged_tutorial.teaching.exercises as ex
from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.teaching.chapters.ch01_block_layout import block_layout
from paged_tutorial.teaching.chapters.ch02_block_table import kernel_addresses
from paged_tutorial.teaching.chapters.ch03_address_arithmetic import block_walk
from paged_tutorial.teaching.chapters.ch05_online_softmax import online_softmax
from paged_tutorial.teaching.chapters.ch09_prefix_sharing import prefix_sharing
from paged_tutorial.teaching.harness import shapes
from test_verdict_paths import assert_checker_fault, checker_code
from test_verdict_paths_chapters import NEEDS_THE_SIMULATOR, on_a_gpu


# --- 09.can_share ----------------------------------------------------------------------------

def can_share_as_tokens_left(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    # "truthy": the tokens left to compute after this block, 0 (False) when none are left
    return (found.tokens == tokens and found.parent is previous
            and n_tokens - (logical_block + 1) * BLOCK_SIZE)


def can_share_raising_on_other_tokens(found, tokens, previous, logical_block, n_tokens,
                                   BLOCK_SIZE):
    if found.tokens != tokens:
        raise ValueError("hash collision")     # cannot happen unless the hash is broken
    return (logical_block + 1) * BLOCK_SIZE < n_tokens


def test_a_share_rule_that_returns_the_tokens_left_is_told_to_return_a_bool():
    verdict = ex.grade("09.can_share", can_share_as_tokens_left)
    assert verdict.status == "wrong", verdict.message
    assert "it must return True or False" in verdict.message, verdict.message


def test_a_share_rule_that_raises_on_other_tokens_is_told_it_does_not_compare_the_parent():
    # asked about other tokens it raises rather than answering: the grader takes the raise
    # for a token compare and names what the run showed, the parent left out
    verdict = ex.grade("09.can_share", can_share_raising_on_other_tokens)
    assert verdict.status == "wrong", verdict.message
    assert "your rule compared the tokens but not the parent" in verdict.message, \
        verdict.message


# --- 03.walk_blocks --------------------------------------------------------------------------

def _k_element(physical_block, token, kv_head, thread_id):
    return physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM + thread_id


def _k_of(kv_cache, physical_block, token, kv_head, thread_id):
    return load(kv_cache, _k_element(physical_block, token, kv_head, thread_id))


def _v_of(kv_cache, physical_block, token, kv_head, thread_id):
    return load(kv_cache, _k_element(physical_block, token, kv_head, thread_id) + V_OFFSET_ELEMS)


def walk_with_helpers(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id, owns_dim,
                      q_val, scale, dot_products, score):
    current_max = float32(-math.inf)
    d = float32(0.0)
    acc = float32(0.0)
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        physical_block = block_table[slot * N_LAYERS * MAX_BLOCKS_PER_SEQ
                                     + layer * MAX_BLOCKS_PER_SEQ + logical_block]
        for token in range(min(seq_len - logical_block * BLOCK_SIZE, BLOCK_SIZE)):
            k = float32(0.0)
            if owns_dim:
                k = _k_of(kv_cache, physical_block, token, kv_head, thread_id)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = float32(0.0)
            if owns_dim:
                v = _v_of(kv_cache, physical_block, token, kv_head, thread_id)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def walk_waiting_for_every_k(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id,
                             owns_dim, q_val, scale, dot_products, score):
    # every thread's K loaded before the score is summed: a barrier after the load (in the
    # branch that loads, which the threads past head_dim never enter)
    current_max = float32(-math.inf)
    d = float32(0.0)
    acc = float32(0.0)
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        physical_block = block_table[slot * N_LAYERS * MAX_BLOCKS_PER_SEQ
                                     + layer * MAX_BLOCKS_PER_SEQ + logical_block]
        for token in range(min(seq_len - logical_block * BLOCK_SIZE, BLOCK_SIZE)):
            k_elem = (physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM
                      + thread_id)
            k = float32(0.0)
            if owns_dim:
                k = load(kv_cache, k_elem)
                cuda.syncthreads()
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = float32(0.0)
            if owns_dim:
                v = load(kv_cache, k_elem + V_OFFSET_ELEMS)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


def walk_folding_k_for_v(kv_cache, block_table, slot, layer, seq_len, kv_head, thread_id,
                         owns_dim, q_val, scale, dot_products, score):
    # V is read, but K goes into the softmax in its place
    current_max = float32(-math.inf)
    d = float32(0.0)
    acc = float32(0.0)
    for logical_block in range((seq_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        physical_block = block_table[slot * N_LAYERS * MAX_BLOCKS_PER_SEQ
                                     + layer * MAX_BLOCKS_PER_SEQ + logical_block]
        for token in range(min(seq_len - logical_block * BLOCK_SIZE, BLOCK_SIZE)):
            k_elem = (physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM
                      + thread_id)
            k = float32(0.0)
            if owns_dim:
                k = load(kv_cache, k_elem)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = float32(0.0)
            if owns_dim:
                v = load(kv_cache, k_elem + V_OFFSET_ELEMS)
            current_max, d, acc = softmax_update(current_max, d, acc, s, k)
    return current_max, d, acc


@NEEDS_THE_SIMULATOR
def test_a_walk_whose_two_helpers_share_a_third_is_graded_as_hers():
    # _k_of and _v_of both call _k_element: the search for the kernel's own steps visits it
    # once
    assert block_walk.kernel_steps_called(walk_with_helpers) == []
    verdict = ex.grade("03.walk_blocks", walk_with_helpers)
    assert verdict.status == "correct", verdict.message
    assert "every K and V element of each thread exactly once" in verdict.message, \
        verdict.message


@NEEDS_THE_SIMULATOR
def test_a_walk_with_a_barrier_only_loading_threads_reach_is_told_its_divergence():
    verdict = ex.grade("03.walk_blocks", walk_waiting_for_every_k)
    assert verdict.status == "wrong", verdict.message
    assert "the loop bounds may depend on the sequence, not on thread_id" in verdict.message, \
        verdict.message


@NEEDS_THE_SIMULATOR
def test_a_walk_that_folds_k_in_for_v_on_an_ordinary_launch_is_asked_about_score_and_v():
    # an ordinary launch (no scores drawn far below 0, no peak): the verdict adds no note
    case = shapes.case(np.random.default_rng(3), 3, head_dim=40, gqa=(1, 2), lens=[20, 9],
                       num_layers=2)
    verdict = block_walk.run_parts(attention.ARTICLE_PARTS.replace(
        walk_blocks=walk_folding_k_for_v), case)
    assert verdict.status == "wrong", verdict.message
    assert verdict.message.endswith("The reads were the article's: what happens to each "
                                    "token's score and V?"), verdict.message


# --- 05.softmax_update -----------------------------------------------------------------------

def update_returning_a_list(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    correction = math.exp(current_max - new_max)
    exp_score = math.exp(score - new_max)
    return [new_max, d * correction + exp_score, acc * correction + exp_score * v]


@NEEDS_THE_SIMULATOR
def test_an_update_that_returns_a_list_is_told_to_compare_the_types_it_returns():
    # right on the host, where a list unpacks like a tuple; a GPU device function builds none
    case = shapes.case(np.random.default_rng(7), 7, head_dim=16, gqa=(1, 1), lens=[12],
                       max_slots=1, slots=[0])
    verdict = online_softmax.run_parts(update_returning_a_list, case)
    assert verdict.status == "wrong", verdict.message
    assert "the host replay agrees with the article's update; compare the types you return" \
        in verdict.message, verdict.message


def test_a_wide_launch_the_grader_cannot_draw_is_the_graders_fault(monkeypatch):
    # no draw of the wide launch reaches a score this high: the grader's own RuntimeError
    monkeypatch.setattr(online_softmax, "WIDE_SCORE", math.inf)
    verdict = ex.grade("05.softmax_update", ex.reveal("05.softmax_update"))
    assert verdict.status == "unsolved", verdict.message
    assert "checker itself failed" in verdict.message, verdict.message
    assert "no draw reached the score WIDE_SCORE" in verdict.message, verdict.message


# --- 02.table_index --------------------------------------------------------------------------

def table_index_slot_stride_without_layers(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN,
                                           BLOCK_SIZE):
    blocks_per_seq = (MAX_SEQ_LEN + BLOCK_SIZE - 1) // BLOCK_SIZE
    return slot * blocks_per_seq + layer * blocks_per_seq + logical_block


def _table_case(slots):
    rng = np.random.default_rng(11)
    return shapes.case(rng, 11, head_dim=16, gqa=(1, 1), lens=[30, 17], num_layers=3,
                       layer=1, max_slots=2, slots=slots, max_seq_len=36,
                       **shapes.drawn_constants(rng, 16, 12))


def test_a_table_index_right_for_slot_0_only_is_told_the_first_slot_it_misses(monkeypatch):
    # slot 0's row comes first and every one of its entries is right: the explanation goes on
    # to slot 1's
    monkeypatch.setattr(kernel_addresses, "table_cases", lambda: [_table_case([0, 1])])
    verdict = ex.grade("02.table_index", table_index_slot_stride_without_layers)
    assert verdict.status == "wrong", verdict.message
    assert "For slot 1, layer 1, logical block 0 your index reads entry" in verdict.message, \
        verdict.message


@NEEDS_THE_SIMULATOR
def test_a_wrong_table_index_on_a_gpu_draws_the_entries_its_function_computed(monkeypatch):
    on_a_gpu(monkeypatch)
    monkeypatch.setattr(kernel_addresses, "table_cases", lambda: [_table_case([1, 0])])
    verdict = ex.grade("02.table_index", table_index_slot_stride_without_layers)
    assert verdict.status == "wrong", verdict.message
    assert "For slot 1, layer 1, logical block 0 your index reads entry" in verdict.message, \
        verdict.message
    fig = verdict.figure()
    title = fig.axes[0].get_title().replace("\n", " ")
    assert "computed by your function" in title, title
    plt.close(fig)


# --- the grader's own faults, where no answer of hers parts two runs -------------------------

WRITE_KV_WITH_A_BUG = """
def write_kv(self, cache, k, v, block_table, layer, slots, positions):
    real_write_kv(self, cache, k, v * 0, block_table, layer, slots,
                  positions)
"""


def test_a_layout_run_that_differs_with_her_offsets_right_says_they_match(monkeypatch):
    # the grader's writer drops V (a bug of ours): her offsets are the article's, and the
    # verdict says so rather than blaming one of them
    write_kv = checker_code(WRITE_KV_WITH_A_BUG, "write_kv", block_layout,
                            real_write_kv=block_layout.OffsetWriterBackend.write_kv)
    monkeypatch.setattr(block_layout.OffsetWriterBackend, "write_kv", write_kv)
    verdict = ex.grade("01.kv_offset", ex.reveal("01.kv_offset"))
    assert verdict.status == "wrong", verdict.message
    assert "differs from a stock engine's" in verdict.message, verdict.message
    assert verdict.message.endswith("the offsets match the article's layout"), verdict.message


PREPARE_WITH_A_BUG = """
def prepare(case):
    # an oracle one off everywhere (a bug of ours): no read of hers explains the difference
    prep = real_prepare(case)
    prep.reference += 1.0
    return prep
"""


@pytest.mark.parametrize("name, words", [
    ("02.table_index", "The table entries read look right; check what else the function returns"),
    ("03.k_index", "The K elements read look right; check what else the function returns"),
])
def test_an_output_that_differs_with_every_address_right_names_no_address(monkeypatch, name,
                                                                          words):
    prepare = checker_code(PREPARE_WITH_A_BUG, "prepare", kernel_addresses,
                           real_prepare=kernel_addresses.prepare)
    monkeypatch.setattr(kernel_addresses, "prepare", prepare)
    verdict = ex.grade(name, ex.reveal(name))
    assert verdict.status == "wrong", verdict.message
    assert verdict.message.endswith(words), verdict.message


STOCK_WITH_A_BUG = """
import dataclasses

def stock_results(scenario):
    # serves one token more than the reader's run does (a bug of ours)
    longer = dataclasses.replace(scenario, max_tokens=scenario.max_tokens + 1)
    return tuple(_serve(_engine(longer, may_share), longer))
"""


def test_a_share_run_that_differs_without_a_disagreement_is_named(monkeypatch):
    stock = checker_code(STOCK_WITH_A_BUG, "stock_results", prefix_sharing,
                         **vars(prefix_sharing))
    monkeypatch.setattr(prefix_sharing, "stock_results", stock)
    verdict = ex.grade("09.can_share", ex.reveal("09.can_share"))
    assert verdict.status == "wrong", verdict.message
    assert "[the hash ignores the chain; BLOCK_SIZE" in verdict.message, verdict.message
    assert "the run differs from the engine's" in verdict.message, verdict.message


def can_share_counting_its_sharers(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    ok = (found.tokens == tuple(tokens) and found.parent is previous
          and (logical_block + 1) * BLOCK_SIZE < n_tokens)
    if ok:
        found.ref_count += 1              # "one more slot shares it"
    return ok


def can_share_marking_it_done(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    found.pending = False
    return (found.tokens == tuple(tokens) and found.parent is previous
            and (logical_block + 1) * BLOCK_SIZE < n_tokens)


@pytest.mark.parametrize("answer, field", [(can_share_counting_its_sharers, "ref_count"),
                                           (can_share_marking_it_done, "pending")])
def test_a_share_rule_that_edits_the_caches_record_is_refused_naming_the_field(answer, field):
    verdict = ex.grade("09.can_share", answer)
    assert verdict.status == "wrong", verdict.message
    assert f"can_share changed found.{field}" in verdict.message, verdict.message


def can_share_leaving_two_tokens(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    return ((logical_block + 1) * BLOCK_SIZE < n_tokens - 1 and found.tokens == tuple(tokens)
            and found.parent is previous)


def test_a_share_rule_off_by_one_at_the_last_token_is_refused():
    """A block followed by the prompt's last token alone leaves one token to compute: it is
    shared.  A rule that wants two left recomputes a whole block."""
    verdict = ex.grade("09.can_share", can_share_leaving_two_tokens)
    assert verdict.status == "wrong", verdict.message
    # the probe ("one token left to compute"), or an engine stream that met the case first
    # ("leaving one token or more to compute")
    assert "to compute" in verdict.message and "False" in verdict.message or \
        "your rule refused" in verdict.message, verdict.message
