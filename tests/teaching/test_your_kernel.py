"""``pt.exercises.your_kernel()``: the kernel assembled from remembered puzzle answers, serving a
tiny model through ``KernelRouter`` (every layer, every head, in the simulator on a CPU).

The model is random with its matrices scaled up (std 0.2 instead of 0.02) so that attention is
sharp and the next token depends on it: with HF's small init every wrong kernel below still
produced the stock tokens.

The last tests run notebook 05b's own run (``ex.Serving``: SmolLM2, its prompt, its block size,
its routed layers) with one wrong part of hers for each part 05b assembles, each refused by its
own puzzle's check: the text changes, and the diagnosis names the part and the first token."""

# flake8: noqa: F821  (the kernel parts name what attention.compile_parts binds)

from __future__ import annotations

import math

import pytest

import paged_tutorial as pt
import paged_tutorial.teaching.exercises as ex
from helpers.clever_answers import CLEVER
from helpers.kernel_bodies import WRONG_BODIES
from paged_tutorial.backends.numba_cuda.runtime import access_log
from paged_tutorial.teaching.exercises import solved
from paged_tutorial.teaching.exercises.solution_code import Solution
from paged_tutorial.teaching.exercises.solutions import solution_of
from paged_tutorial.teaching.exercises.your_kernel import (BODY_PUZZLES, STEP_PUZZLES,
                                                           first_difference)
from paged_tutorial.teaching.kernel_router import KernelRouter

PROMPT = [list(range(3, 21))]            # 18 tokens: two blocks of the cache
NEW_TOKENS = 4


@pytest.fixture
def nothing_solved():
    solved.clear()
    yield
    solved.clear()


@pytest.fixture(scope="module")
def sharp_model():
    config = pt.ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=32)
    model = pt.random_model(config, seed=1)
    for w in model.weights.values():
        if w.dim() == 2:
            w.mul_(10.0)
    return model


def _worked_source(name: str) -> str:
    """A worked solution's source as she would have typed it herself: read without
    ``reveal``, which would record the puzzle as revealed."""
    return Solution(name, solution_of(name)).source


def generate(model, backend):
    engine = pt.Engine(model, backend=backend, max_slots=1, max_seq_len=64)
    return engine.generate(PROMPT, max_tokens=NEW_TOKENS, temperature=0.0)[0].token_ids


@pytest.fixture(scope="module")
def stock_tokens(sharp_model):
    return generate(sharp_model, "torch")


# --- wrong parts, as a learner would write them ----------------------------------------------

def token_score_skips_offset_2(q_val, k, thread_id, scale, dot_products, score):
    qk = q_val * k
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 16)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 8)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 4)
    qk += cuda.shfl_down_sync(WARP_FULL_MASK, qk, 1)
    if thread_id % WARP_SIZE == 0:
        dot_products[thread_id // WARP_SIZE] = qk
    cuda.syncthreads()
    if thread_id == 0:
        score[0] = combine_warps(dot_products, HEAD_DIM, WARP_SIZE) * scale
    cuda.syncthreads()
    return score[0]


def softmax_update_without_rescale(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    exp_score = math.exp(score - new_max)
    return new_max, d + exp_score, acc + exp_score * v


def walk_blocks_one_block_short(kv_cache, block_table, slot, layer, seq_len, kv_head,
                                thread_id, owns_dim, q_val, scale, dot_products, score):
    current_max = float32(-math.inf)
    acc = float32(0.0)
    d = float32(0.0)
    for logical_block in range(blocks_to_read(seq_len, BLOCK_SIZE) - 1):
        physical_block = block_table[block_table_index(slot, layer, logical_block, N_LAYERS,
                                                       MAX_BLOCKS_PER_SEQ)]
        for token in range(tokens_in_block(seq_len, logical_block, BLOCK_SIZE)):
            k_elem = k_index(physical_block, token, kv_head, thread_id, BLOCK_ELEMS, KV_DIM,
                             HEAD_DIM)
            k = float32(0.0)
            if owns_dim:
                k = load(kv_cache, k_elem)
            s = token_score(q_val, k, thread_id, scale, dot_products, score)
            v = float32(0.0)
            if owns_dim:
                v = load(kv_cache, k_elem + V_OFFSET_ELEMS)
            current_max, d, acc = softmax_update(current_max, d, acc, s, v)
    return current_max, d, acc


WRONG = {
    "04.token_score": token_score_skips_offset_2,
    "05.softmax_update": softmax_update_without_rescale,
    "03.walk_blocks": walk_blocks_one_block_short,
}


# --- tests -----------------------------------------------------------------------------------

def test_refuses_while_parts_are_unsolved_and_names_them(nothing_solved):
    with pytest.raises(ex.UnsolvedParts) as refused:
        ex.your_kernel()
    assert refused.value.missing == list(BODY_PUZZLES.values())
    for puzzle in BODY_PUZZLES.values():
        assert f"{puzzle}  (notebook {puzzle[:2]})" in str(refused.value)
    solved.remember("05.softmax_update", softmax_update_without_rescale)
    with pytest.raises(ex.UnsolvedParts) as refused:
        ex.your_kernel()
    assert "05.softmax_update" not in refused.value.missing


def test_labels_say_whose_parts_run(nothing_solved):
    assert ex.your_kernel(use_solutions=True).label == "the worked solutions' kernel"
    assert ex.your_kernel(fill_unsolved=True).label == "the worked solutions' kernel"
    from paged_tutorial.backends.numba_cuda.kernels import attention

    solved.remember("04.token_score", token_score_skips_offset_2)
    assert ex.your_kernel(fill_unsolved=True).label == (
        "your kernel with worked solutions for 03.walk_blocks, 05.softmax_update, "
        "05.write_output")

    for part, puzzle in BODY_PUZZLES.items():
        solved.remember(puzzle, getattr(attention.ARTICLE_PARTS, part))
    mine = ex.your_kernel()
    assert mine.label == "your kernel" and mine.all_yours
    assert all(origin == "yours" for part, _, origin in mine.origins if part in BODY_PUZZLES)
    assert all(origin == "worked solution" for part, _, origin in mine.origins
               if part in STEP_PUZZLES)
    assert ex.your_kernel(use_solutions=True).label == "the worked solutions' kernel"


def test_a_right_answer_checked_is_remembered_across_processes(nothing_solved, tmp_path):
    """check() remembers a right puzzle answer; a new process (here: the memory forgotten)
    rebuilds it from the source written to the store folder."""
    from paged_tutorial.backends.numba_cuda.kernels import attention

    source = tmp_path / "her_notebook_cell.py"           # her own copy, with a source file
    source.write_text(_worked_source("05.softmax_update"))
    hers = solved.rebuild(source.read_text(), str(source))
    assert ex.check("05.softmax_update", hers) is True
    assert solved.names() == ["05.softmax_update"]
    solved._REMEMBERED.clear()
    rebuilt = solved.solved("05.softmax_update")
    assert rebuilt is not attention.softmax_update
    assert rebuilt(0.0, 1.0, 2.0, 1.0, 3.0) == attention.softmax_update(0.0, 1.0, 2.0, 1.0, 3.0)
    assert ex.check("05.softmax_update", softmax_update_without_rescale) is False
    assert ex.your_kernel(fill_unsolved=True).origins[2] == ("softmax_update",
                                                            "05.softmax_update", "yours")


def test_a_demonstration_checked_with_remember_false_is_not_hers(nothing_solved):
    """A chapter's demonstration of a classic mistake (which a GPU may grade right by its
    output alone) is graded and printed, but neither remembered nor recorded."""
    from paged_tutorial.teaching.exercises.progress import record_file

    before = record_file().read_text() if record_file().is_file() else None
    demonstration = solved.rebuild(_worked_source("05.softmax_update"))
    assert ex.check("05.softmax_update", demonstration, remember=False) is True
    assert solved.names() == [] and ex.your_kernel(fill_unsolved=True).origins[2][2] != "yours"
    after = record_file().read_text() if record_file().is_file() else None
    assert after == before


def test_worked_solutions_generate_the_stock_tokens(sharp_model, stock_tokens):
    router = KernelRouter(ex.your_kernel(use_solutions=True), "torch")
    assert generate(sharp_model, router) == stock_tokens
    layers = sharp_model.config.num_hidden_layers
    assert len(router.routed) == layers * (NEW_TOKENS - 1)           # every decode step
    assert {c.layer for c in router.routed} == set(range(layers))
    assert max(c.max_abs_diff for c in router.routed) < 1e-4


@pytest.mark.parametrize("puzzle", sorted(WRONG))
def test_one_wrong_part_changes_the_tokens(sharp_model, stock_tokens, puzzle):
    part = next(p for p, name in BODY_PUZZLES.items() if name == puzzle)
    good = ex.your_kernel(use_solutions=True)
    wrong = ex.YourKernel(good.parts.replace(**{part: WRONG[puzzle]}), good.origins)
    router = KernelRouter(wrong, "torch")
    assert generate(sharp_model, router) != stock_tokens
    assert max(c.max_abs_diff for c in router.routed) > 0.1


def test_a_changed_answer_names_the_part_that_changes_it(sharp_model, stock_tokens,
                                                          nothing_solved):
    """The kernel of 05b with one wrong part of hers (and her right ones): the diagnosis swaps
    each of her parts for the worked one and names the wrong one, with the first token."""
    solved.remember("05.softmax_update", softmax_update_without_rescale)
    solved.remember("04.token_score", solution_of("04.token_score"))
    kernel = ex.your_kernel(fill_unsolved=True)

    def answer(k, n):
        engine = pt.Engine(sharp_model, backend=KernelRouter(k, "torch"), max_slots=1,
                           max_seq_len=64)
        return engine.generate(PROMPT, max_tokens=n, temperature=0.0)[0].token_ids
    mine = answer(kernel, NEW_TOKENS)
    assert mine != stock_tokens
    said = ex.which_part_changed(kernel, answer, mine, stock_tokens)
    at = next(i for i, (a, b) in enumerate(zip(mine, stock_tokens)) if a != b)
    assert f"generated token {at + 1}" in said and f"wrote {str(mine[at])!r}" in said
    assert "your softmax_update is the part that changes the text" in said
    assert "token_score is the part" not in said
    assert ex.which_part_changed(kernel, answer, stock_tokens, stock_tokens).startswith(
        "your kernel's answer is the stock engine's")


def her_k_index(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM,
                HEAD_DIM):
    kv_head = q_head // Q_PER_KV
    return physical_block * BLOCK_ELEMS + token * KV_DIM + kv_head * HEAD_DIM + thread_id


def test_her_k_index_from_the_query_head_takes_the_kernels_place(sharp_model, stock_tokens,
                                                                 nothing_solved):
    """03.k_index's answer starts from the query head; in her kernel it stands where the
    article's k_index (which gets the KV head) stands, and the tokens stay the stock ones."""
    solved.remember("03.k_index", her_k_index)
    kernel = ex.your_kernel(fill_unsolved=True)
    assert ("k_index", "03.k_index", "yours") in kernel.origins
    assert generate(sharp_model, KernelRouter(kernel, "torch")) == stock_tokens


def her_table_index(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
    row = -(-MAX_SEQ_LEN // BLOCK_SIZE)
    return (slot * N_LAYERS + layer) * row + logical_block


def test_her_table_index_from_max_seq_len_takes_the_kernels_place(sharp_model, stock_tokens,
                                                                  nothing_solved):
    """02.table_index's answer derives the row length from MAX_SEQ_LEN; her kernel gets it for
    the cache it is built for, and the tokens stay the stock ones."""
    solved.remember("02.table_index", her_table_index)
    kernel = ex.your_kernel(fill_unsolved=True)
    assert ("block_table_index", "02.table_index", "yours") in kernel.origins
    assert generate(sharp_model, KernelRouter(kernel, "torch")) == stock_tokens


def test_an_attention_difference_names_the_part_that_makes_it(sharp_model, nothing_solved):
    """When her kernel's attention is far from the other backend's, 05b names the part whose
    swap for the worked one brings the difference back to rounding."""
    solved.remember("05.softmax_update", softmax_update_without_rescale)
    solved.remember("04.token_score", solution_of("04.token_score"))
    kernel = ex.your_kernel(fill_unsolved=True)

    def difference(k):
        router = KernelRouter(k, "torch")
        generate(sharp_model, router)
        return max(c.max_abs_diff for c in router.routed)
    said = ex.which_part_differs(kernel, difference)
    assert "your softmax_update computes another attention" in said, said
    assert "token_score computes" not in said
    right = ex.your_kernel(use_solutions=True)
    assert "up to rounding" in ex.which_part_differs(right, difference)


# --- notebook 05b's own run ------------------------------------------------------------------

def k_index_token_stride_head_dim(physical_block, token, q_head, thread_id, Q_PER_KV,
                                  BLOCK_ELEMS, KV_DIM, HEAD_DIM):
    return physical_block * BLOCK_ELEMS + token * HEAD_DIM + q_head // Q_PER_KV * HEAD_DIM \
        + thread_id


def softmax_update_without_rescaling_acc(current_max, d, acc, score, v):
    new_max = max(current_max, score)
    correction = math.exp(current_max - new_max)
    exp_score = math.exp(score - new_max)
    return new_max, d * correction + exp_score, acc + exp_score * v


def table_index_without_the_layer(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN,
                                  BLOCK_SIZE):
    return slot * N_LAYERS * -(-MAX_SEQ_LEN // BLOCK_SIZE) + logical_block


#: (puzzle, a wrong answer to it as she could have written it): every part 05b assembles
WRONG_IN_05B = [
    ("02.table_index", table_index_without_the_layer),
    ("03.k_index", k_index_token_stride_head_dim),
    ("03.walk_blocks", walk_blocks_one_block_short),
    ("03.walk_blocks", CLEVER["03.walk_blocks"]["the literal 16 for BLOCK_SIZE"][0]),
    ("04.token_score", WRONG_BODIES["04.token_score"]["a shuffle offset sequence that skips 4"][0]),
    ("05.softmax_update", softmax_update_without_rescaling_acc),
    ("05.write_output", WRONG_BODIES["05.write_output"]["acc not divided by d"][0]),
]
#: the tokens of 05b's answer these tests compare (each wrong part changes one of them)
TOKENS_05B = 3


@pytest.fixture(scope="module")
def serving_05b(smollm2_f32):
    return ex.Serving(smollm2_f32, on_gpu=not access_log.AVAILABLE)


@pytest.fixture(scope="module")
def stock_05b(serving_05b):
    return serving_05b.generate(max_tokens=TOKENS_05B).token_ids


def test_05b_wrongs_cover_every_part_it_assembles():
    assert {puzzle for puzzle, _ in WRONG_IN_05B} == {*BODY_PUZZLES.values(),
                                                      *STEP_PUZZLES.values()}


def test_05b_runs_the_kernel_in_every_layer_on_a_gpu_and_three_spread_layers_on_a_cpu():
    assert ex.Serving(None, on_gpu=True).routing() == ("numba", None)
    inner, groups = ex.Serving(None, on_gpu=False).routing()
    assert inner == "torch"
    cpu = KernelRouter(ex.your_kernel(use_solutions=True), inner, kv_groups=groups)
    layers = sorted(cpu.layers)
    assert len(layers) >= 3 and layers[0] <= 5 and layers[-1] >= 25
    assert any(10 <= layer <= 20 for layer in layers)


@pytest.mark.slow
def test_05b_context_spans_at_least_three_blocks_of_sixteen(serving_05b):
    engine = pt.Engine(serving_05b.model, max_slots=1, block_size=serving_05b.block_size)
    assert len(engine.encode_prompt(serving_05b.prompt)) > 2 * 16
    assert serving_05b.block_size < 16      # a literal 16 for BLOCK_SIZE shows too


@pytest.mark.slow
@pytest.mark.parametrize("puzzle, wrong", WRONG_IN_05B,
                         ids=[f"{puzzle}-{wrong.__name__}" for puzzle, wrong in WRONG_IN_05B])
def test_a_wrong_part_changes_05bs_text_and_is_named(serving_05b, stock_05b, nothing_solved,
                                                     puzzle, wrong):
    """Her part, wrong in a way its own check refuses, in 05b's run (SmolLM2, its prompt and
    routed layers) with every other part the worked one: the answer changes within the first
    tokens, and the diagnosis names that part, the first token that differs and the token
    expected there."""
    assert not ex.grade(puzzle, wrong).ok
    solved.remember(puzzle, wrong)
    kernel = ex.your_kernel(fill_unsolved=True)
    part = next(p for p, name, origin in kernel.origins if name == puzzle)
    assert kernel.your_parts == [(part, puzzle)]
    mine = serving_05b.answer(kernel, TOKENS_05B)
    at = first_difference(mine, stock_05b)
    assert at is not None, f"{puzzle}: the text did not change"
    said = ex.which_part_changed(kernel, serving_05b.answer, mine, stock_05b,
                                 serving_05b.token_text)
    text = serving_05b.token_text
    assert (f"generated token {at + 1}: {kernel.label} wrote {text(mine[at])!r} where the "
            f"stock engine wrote {text(stock_05b[at])!r}") in said, said
    assert f"your {part} is the part that changes the text" in said, said



def table_index_row_in_tokens(slot, layer, logical_block, N_LAYERS, MAX_SEQ_LEN, BLOCK_SIZE):
    return (slot * N_LAYERS + layer) * MAX_SEQ_LEN + logical_block


@pytest.mark.slow
@pytest.mark.skipif(not access_log.AVAILABLE, reason="a read past the block table's end is "
                    "undefined on a GPU (it may end the process's CUDA context); the simulator "
                    "stops it")
def test_a_part_that_reads_past_the_table_stops_05bs_answer_and_is_named(serving_05b, stock_05b,
                                                                         nothing_solved):
    """A table index whose rows are MAX_SEQ_LEN entries long reads past the block table in
    05b's middle layer: the simulator stops the kernel with an IndexError, the answer stops
    there (said in one line), and the diagnosis names the table index."""
    wrong = table_index_row_in_tokens
    assert not ex.grade("02.table_index", wrong).ok
    solved.remember("02.table_index", wrong)
    kernel = ex.your_kernel(fill_unsolved=True)
    mine, stopped = serving_05b.tokens(serving_05b.router(kernel), TOKENS_05B)
    assert stopped is not None and stopped.startswith("IndexError: ") and "\n" not in stopped
    assert mine == stock_05b[:len(mine)] and len(mine) < len(stock_05b)
    said = ex.which_part_changed(kernel, serving_05b.answer, mine, stock_05b,
                                 serving_05b.token_text)
    assert f"generated token {len(mine) + 1}: {kernel.label} wrote nothing (it stopped)" in said
    assert "your block_table_index is the part that changes the text" in said, said
