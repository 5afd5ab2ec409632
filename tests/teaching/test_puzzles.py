"""Every puzzle: its solution passes when run where it belongs (the article's kernel in the
simulator or on the GPU, or a real engine), the stub is "not solved yet", and the classic wrong
implementations listed in WRONG fail -- each with a message, and a figure that draws.

Kernel cases are tiny (one or two rows, 32-128 threads, a few dozen tokens): about a second
each in the simulator."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

import paged_tutorial as pt  # noqa: E402
import paged_tutorial.teaching.exercises as ex  # noqa: E402
from paged_tutorial.teaching.chapters import PUZZLES, puzzle  # noqa: E402
from helpers.kernel_bodies import WRONG_BODIES  # noqa: E402
from helpers.wrong_allocators import WRONG as WRONG_ALLOCATORS  # noqa: E402


def _softmax(rescale_acc=True, rescale_d=True, inverted=False, keep_first_max=False):
    def update(current_max, d, acc, score, v):
        if keep_first_max and current_max != -math.inf:
            new_max = current_max
        else:
            new_max = max(current_max, score)
        correction = math.exp(new_max - current_max) if inverted else \
            math.exp(current_max - new_max)
        exp_score = math.exp(score - new_max)
        return (new_max, (d * correction if rescale_d else d) + exp_score,
                (acc * correction if rescale_acc else acc) + exp_score * v)
    return update


def _shares_by_the_engines_rule(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    from paged_tutorial.cache.prefix_cache import may_share
    return may_share(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE)


def _shares_by_a_dynamic_import(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    module = __import__("importlib").import_module("paged_tutorial.cache.prefix_cache")
    return module.may_share(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE)


def _changes_the_checker(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    pt.teaching.chapters.ch09_prefix_sharing.prefix_sharing.ReaderRule.__call__ = \
        lambda self, *args: args[0].tokens == args[1]
    return False


def _patches_through_sys_modules(found, tokens, previous, logical_block, n_tokens, BLOCK_SIZE):
    import sys
    sys.modules["paged_tutorial.teaching.chapters.ch09_prefix_sharing.prefix_sharing"].may_share = \
        lambda *args: args[0].tokens == args[1]
    return False


def _copies_around_the_counter(host, device, changed):
    device.tensor[:] = device.tensor.new_tensor(host)


def _resets_the_count(host, device, changed):
    device[:] = host
    device.writes = 0


def _k_index_from_the_kernel(p, t, h, d, Q, BE, KV, HD):
    import paged_tutorial.backends.numba_cuda.kernels.attention as kernel
    return kernel.k_index(p, t, h // Q, d, BE, KV, HD)


#: puzzle -> {what the wrong answer does: function}; each must be refused
WRONG = {
    "01.kv_offset": {
        "counts elements, not bytes":
            lambda t, h, d, isv, BS, KV, HD, IT: t * KV + h * HD + d + (BS * KV if isv else 0),
        "V_OFFSET of one row instead of all K rows":
            lambda t, h, d, isv, BS, KV, HD, IT: (t * KV + h * HD + d) * IT + (KV * IT if isv else 0),
        "no V_OFFSET: V over K":
            lambda t, h, d, isv, BS, KV, HD, IT: (t * KV + h * HD + d) * IT,
        "head stride KV_DIM instead of HEAD_DIM":
            lambda t, h, d, isv, BS, KV, HD, IT: (t * KV + h * KV + d) * IT + (BS * KV * IT if isv else 0),
        "head-major rows (head, token, dim)":
            lambda t, h, d, isv, BS, KV, HD, IT: (h * BS * HD + t * HD + d) * IT + (BS * KV * IT if isv else 0),
        "hard-coded to the chapter's shape (bf16, 2 KV heads x 8)":
            lambda t, h, d, isv, BS, KV, HD, IT: (t * 16 + h * 8 + d) * 2 + (512 if isv else 0),
        "ITEMSIZE taken as 2 (bf16 only)":
            lambda t, h, d, isv, BS, KV, HD, IT: (t * KV + h * HD + d) * 2 + (BS * KV * 2 if isv else 0),
    },
    "02.locate": {
        "position used as the logical block": lambda t, s, l, p, BS: (t[s, l, p], p % BS),
        "the table ignored (logical block as physical)": lambda t, s, l, p, BS: (p // BS, p % BS),
        "division and remainder swapped": lambda t, s, l, p, BS: (t[s, l, p % BS], p // BS),
        "slot and layer swapped": lambda t, s, l, p, BS: (t[l, s, p // BS], p % BS),
        "returns the block only": lambda t, s, l, p, BS: t[s, l, p // BS],
    },
    "02.table_index": {
        "slot and layer terms swapped":
            lambda s, l, lb, L, T, BS: l * L * -(-T // BS) + s * -(-T // BS) + lb,
        "layer stride N_LAYERS":
            lambda s, l, lb, L, T, BS: s * L * -(-T // BS) + l * L + lb,
        "slot stride without N_LAYERS":
            lambda s, l, lb, L, T, BS: s * -(-T // BS) + l * L + lb,
        "row length truncated (the article's MAX_SEQ_LEN / BLOCK_SIZE)":
            lambda s, l, lb, L, T, BS: s * L * (T // BS) + l * (T // BS) + lb,
        "row length in tokens, not blocks":
            lambda s, l, lb, L, T, BS: s * L * T + l * T + lb,
        "hard-coded layout (3 layers, 4 logical blocks)":
            lambda s, l, lb, L, T, BS: s * 12 + l * 4 + lb,
    },
    "03.k_index": {
        "kv_head term missing": lambda p, t, h, d, Q, BE, KV, HD: p * BE + t * KV + d,
        "token stride HEAD_DIM":
            lambda p, t, h, d, Q, BE, KV, HD: p * BE + t * HD + h // Q * HD + d,
        "bytes instead of elements":
            lambda p, t, h, d, Q, BE, KV, HD: (p * BE + t * KV + h // Q * HD + d) * 2,
        "a float index": lambda p, t, h, d, Q, BE, KV, HD: (p * BE + t * KV + h // Q * HD + d) / 1,
        "the query head used as the KV head":
            lambda p, t, h, d, Q, BE, KV, HD: p * BE + t * KV + h * HD + d,
        "the article's ratio: q_head // 4":
            lambda p, t, h, d, Q, BE, KV, HD: p * BE + t * KV + h // 4 * HD + d,
        "query heads dealt round-robin (q_head % kv heads)":
            lambda p, t, h, d, Q, BE, KV, HD: p * BE + t * KV + h % (KV // HD) * HD + d,
        "multiplies by the ratio (q_head * Q_PER_KV)":
            lambda p, t, h, d, Q, BE, KV, HD: p * BE + t * KV + h * Q * HD + d,
        "hard-coded to one shape (head_dim 32, two kv heads)":
            lambda p, t, h, d, Q, BE, KV, HD: p * 2048 + t * 64 + h // Q * 32 + d,
        "imports the engine's kernel and calls its k_index": _k_index_from_the_kernel,
        "hard-coded to the article's shape (head_dim 64, eight kv heads)":
            lambda p, t, h, d, Q, BE, KV, HD: p * BE + t * 512 + h // Q * 64 + d,
    },
    "05.softmax_update": {
        "acc not rescaled": _softmax(rescale_acc=False),
        "d not rescaled": _softmax(rescale_d=False),
        "correction inverted, exp(new - old)": _softmax(inverted=True),
        "running max never updated": _softmax(keep_first_max=True),
        "no running max: exp(score) summed as it is (notebook 05's example)":
            lambda m, d, acc, s, v: (m, d + math.exp(s), acc + math.exp(s) * v),
        "no running max, in float64":
            lambda m, d, acc, s, v: (max(float(m), float(s)), float(d) + math.exp(float(s)),
                                     float(acc) + math.exp(float(s)) * float(v)),
    },
    "06.allocator": WRONG_ALLOCATORS,
    "06.table_sync": {
        "copies nothing after a change": lambda host, device, changed: None,
        "copies only the first changed entry":
            lambda host, device, changed: changed and device.__setitem__(changed[0],
                                                                         host[changed[0]]),
        "copies the whole table (the article's cost)":
            lambda host, device, changed: device.__setitem__(slice(None), host),
        "copies the changed entries' whole rows": lambda host, device, changed: [
            device.__setitem__(slice(i - i % 8, i - i % 8 + 8), host[i - i % 8:i - i % 8 + 8])
            for i in changed],
        "ignores changed and compares the whole device table every step":
            lambda host, device, changed: [device.__setitem__(i, host[i])
                                           for i in range(len(device)) if device[i] != host[i]],
        "writes the device tensor around the counted indexing": _copies_around_the_counter,
        "copies the whole table, then resets the write count": _resets_the_count,
        "reads the whole device table in one slice to find the stale entries":
            lambda host, device, changed: [device.__setitem__(int(i), host[int(i)])
                                           for i in (device[:] != host).nonzero()[0]],
    },
    "09.can_share": {
        "trusts the key (no token check)":
            lambda f, t, p, lb, n, BS: f.parent is p and (lb + 1) * BS < n,
        "no parent check (a hash of the block alone)":
            lambda f, t, p, lb, n, BS: f.tokens == t and (lb + 1) * BS < n,
        "shares the last token's block too":
            lambda f, t, p, lb, n, BS: f.tokens == t and f.parent is p and (lb + 1) * BS <= n,
        "never shares": lambda f, t, p, lb, n, BS: False,
        "calls the engine's own rule (prefix_cache.may_share)": _shares_by_the_engines_rule,
        "imports the engine's rule by name at run time": _shares_by_a_dynamic_import,
        "patches the checker's comparison": _changes_the_checker,
        "patches the checker through sys.modules": _patches_through_sys_modules,
        "hard-coded BLOCK_SIZE 16 (the last-block rule)":
            lambda f, t, p, lb, n, BS: f.tokens == t and f.parent is p and (lb + 1) * 16 < n,
        "compares a list with the tuple":
            lambda f, t, p, lb, n, BS: list(f.tokens) == t and f.parent is p and (lb + 1) * BS < n,
    },
}

#: the body puzzles' wrong answers, with a text each verdict must contain
EXPECTED_TEXT = {(name, what): text for name, wrong in WRONG_BODIES.items()
                 for what, (_, text) in wrong.items()}
WRONG.update({name: {what: fn for what, (fn, _) in wrong.items()}
              for name, wrong in WRONG_BODIES.items()})

NAMES = [p.name for p in PUZZLES]
#: the kernel's body parts' wrong answers are told apart by the simulator's access and
#: shared-memory logs, and some of them store outside q: on a GPU the ones that are safe there
#: are graded by their output alone (tests/gpu/test_gpu_kernel_bodies.py)
SIMULATING = __import__("paged_tutorial.backends.numba_cuda.runtime.access_log",
                        fromlist=["AVAILABLE"]).AVAILABLE
NEEDS_THE_SIMULATOR = pytest.mark.skipif(
    not SIMULATING, reason="a body part's wrong answers are told apart in the simulator; "
                           "tests/gpu/test_gpu_kernel_bodies.py grades them on the GPU")
CASES = [pytest.param(name, what, marks=[NEEDS_THE_SIMULATOR] if name in WRONG_BODIES else [])
         for name in NAMES for what in WRONG[name]]


def test_every_puzzle_has_wrong_answers_to_reject():
    assert sorted(WRONG) == sorted(NAMES)
    assert all(len(w) >= 2 for w in WRONG.values())
    assert set(NAMES) <= set(ex.names())


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name, capsys):
    """The worked solution passes; shown by reveal first, the verdict says it was revealed and
    ``check`` does not count it as hers."""
    assert ex.grade(name, ex.reveal(name)).ok
    assert ex.check(name, ex.reveal(name)) is False
    assert f"✔ revealed [{name}]" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("name,what", CASES)
def test_wrong_answer_fails(name, what):
    verdict = ex.grade(name, WRONG[name][what])
    assert verdict.status == "wrong", verdict.message
    assert len(verdict.message) > 30
    assert EXPECTED_TEXT.get((name, what), "") in verdict.message
    if verdict.figure is not None:
        fig = verdict.figure()
        assert fig.axes
        plt.close(fig)


@pytest.mark.parametrize("name", NAMES)
def test_stub_is_not_solved_and_signature_is_checked(name):
    p = puzzle(name)
    namespace = {"pt": pt}
    exec(p.stub(), namespace)                       # the cell a notebook starts with
    stub = namespace[p.function_name]
    verdict = ex.grade(name, stub)
    assert verdict.status == "unsolved", verdict.message
    assert ex.grade(name, ...).status == "unsolved"
    assert ex.grade(name, 42).status == "wrong"
    refused = ex.grade(name, lambda x: x)
    assert refused.status == "wrong"
    assert ("argument" if p.signature.startswith("def") else "AllocatorBase") in refused.message
    text = p.describe()
    assert p.signature in text and str(p.hint) in text and p.article in text


def test_unsolved_stub_prints_the_not_solved_line(capsys):
    def k_index(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM,
                HEAD_DIM):
        ...
    assert ex.check("03.k_index", k_index) is False
    assert capsys.readouterr().out.startswith("✘ not solved yet [03.k_index]: ")


def test_reader_errors_are_reported_with_the_call():
    def raises(physical_block, token, q_head, thread_id, Q_PER_KV, BLOCK_ELEMS, KV_DIM,
               HEAD_DIM):
        return [token][thread_id + 5]
    verdict = ex.grade("03.k_index", raises)
    assert verdict.status == "wrong" and "IndexError" in verdict.message
    assert "thread_id=" in verdict.message


def test_puzzle_lookup():
    assert ex.puzzle("03.k_index").function_name == "k_index"
    with pytest.raises(KeyError, match="puzzles:"):
        puzzle("03.nothing")
    assert all(p.parameters for p in PUZZLES)


def test_chapter_03_to_05_texts_and_verdicts_speak_korean():
    from paged_tutorial.teaching.language import set_language

    set_language("ko")
    try:
        for name in ("03.walk_blocks", "04.token_score", "05.write_output", "03.k_index",
                     "05.softmax_update"):
            assert "돌려" in puzzle(name).describe() or "쓰세요" in puzzle(name).describe()
        if SIMULATING:          # the store log names the thread block that wrote
            wrong, _ = WRONG_BODIES["05.write_output"]["row and head swapped"]
            verdict = ex.grade("05.write_output", wrong)
            assert verdict.status == "wrong" and "스레드 블록 (행" in verdict.message
            assert "다른 블록" in verdict.message
        else:                   # on a GPU the output alone
            wrong, _ = WRONG_BODIES["05.write_output"]["acc not divided by d"]
            verdict = ex.grade("05.write_output", wrong)
            assert verdict.status == "wrong" and "torch 오라클" in verdict.message
        for name in ex.names("03.") + ex.names("04.") + ex.names("05."):
            if name not in {p.name for p in PUZZLES}:
                assert any("\uac00" <= ch <= "\ud7a3" for ch in str(ex.get(name).question)), name
    finally:
        set_language("en")


def test_every_puzzle_describes_itself_in_korean_with_no_english_join():
    from paged_tutorial.teaching.language import set_language

    set_language("ko")
    try:
        for p in PUZZLES:
            text = p.describe()
            assert "여기에 코드를 쓰세요" in text and "your code" not in text, p.name
            for english in ("Graded by", "the article's", "TODO", " 에서 실행합니다", " 를 대신",
                            "beyond the article", "(prefill)", "(and "):
                assert english not in text, (p.name, english)
            assert "힌트" in text and "채점하는 곳" in text
    finally:
        set_language("en")


@pytest.mark.skipif(not __import__("paged_tutorial.backends.numba_cuda.runtime.access_log",
                                   fromlist=["AVAILABLE"]).AVAILABLE,
                    reason="the time limit stops simulated threads only")
def test_a_stuck_kernel_is_stopped_and_reported_not_hung():
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.teaching.harness import kernel_harness
    from paged_tutorial.teaching.chapters.ch04_warp_shuffle_reduction import score_handoff

    def spins(q_val, k, thread_id, scale, dot_products, score):
        if thread_id == 0:
            while True:             # waits for something no other thread does
                pass
        cuda.syncthreads()          # noqa: F821
        return float32(0.0)         # noqa: F821
    prep = kernel_harness.prepare(score_handoff.cases()[0])
    result = kernel_harness.run_body(prep, attention.ARTICLE_PARTS.replace(token_score=spins),
                                     timeout=3)
    assert result.error is not None and "still running after 3 s" in result.error


@pytest.mark.slow
def test_can_share_tells_tokens_only_from_tokens_and_parent():
    tokens_only = ex.grade("09.can_share", lambda f, t, p, lb, n, BS: f.tokens == t)
    both = ex.grade("09.can_share", lambda f, t, p, lb, n, BS: f.tokens == t and f.parent is p)
    assert tokens_only.status == both.status == "wrong"
    assert tokens_only.message != both.message
    assert "not the parent" in tokens_only.message
    assert "none would be left to compute" in both.message


@pytest.mark.slow
def test_can_share_that_compares_nothing_is_not_said_to_compare_the_tokens():
    verdict = ex.grade("09.can_share", lambda f, t, p, lb, n, BS: f is not None)
    assert verdict.status == "wrong"
    assert "compared the tokens" not in verdict.message
    assert "neither the tokens nor the parent" in verdict.message
