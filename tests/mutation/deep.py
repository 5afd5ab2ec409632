"""Deep oracles: slow, wide checks of an answer against the worked solution, run only for the
mutants the grader calls correct.  Each returns why the answer is wrong, or None.

Host functions are compared with the worked solution on thousands of argument sets drawn over
wide ranges (BLOCK_SIZE 1-64, head_dim up to 256, GQA ratios 1-8, item sizes 1-8, tables of
many layouts).  Kernel parts run in the kernel on launches far wider than any check's:
BLOCK_SIZE 4, 8, 16 and 32, sequences of up to eleven blocks, head_dims with a partial last
warp and with four or five warps, GQA ratios 5 and 7, q rows wider than their heads, scales
that are not 1/sqrt(head_dim), scores spanning +-1000, scores that all lie far below 0, and one
token far above all the others whose V is scaled up so that together they weigh as much.
The engine puzzles are graded again on fresh draws, several times, and the sharing rule is
compared with the worked one on random chains."""

from __future__ import annotations

import math
import random

import numpy as np

#: a fixed seed: the deep oracle is the same run every time
SEED = 20261206


def _first(fn, draws):
    """Run ``fn(*args)`` for every (args, want) of ``draws``: the first disagreement."""
    for args, want in draws:
        try:
            got = fn(*args)
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc} for {_short(args)}"
        if not _same(got, want):
            return f"returned {got!r}, the worked solution {want!r}, for {_short(args)}"
    return None


def _short(args) -> str:
    return "(" + ", ".join(f"<array {a.shape}>" if isinstance(a, np.ndarray) else repr(a)
                           for a in args) + ")"


def _same(got, want) -> bool:
    if isinstance(want, tuple):
        return isinstance(got, (tuple, list)) and len(got) == len(want) and all(
            _same(g, w) for g, w in zip(got, want))
    if isinstance(got, (bool, np.bool_)) or not isinstance(got, (int, np.integer)):
        return False
    return int(got) == int(want)


def _worked(name):
    from paged_tutorial.teaching.exercises.solutions import solution_of
    return solution_of(name)


def kv_offset(fn):
    rng = random.Random(SEED)
    worked = _worked("01.kv_offset")
    draws = []
    for _ in range(4000):
        bs, heads, hd = rng.randint(1, 64), rng.randint(1, 8), rng.randint(1, 256)
        item = rng.choice((1, 2, 4, 8))
        args = (rng.randrange(bs), rng.randrange(heads), rng.randrange(hd),
                rng.random() < 0.5, bs, heads * hd, hd, item)
        draws.append((args, worked(*args)))
    return _first(fn, draws)


def locate(fn):
    rng = np.random.default_rng(SEED)
    worked = _worked("02.locate")
    draws = []
    for _ in range(1500):
        slots, layers, per_seq = (int(x) for x in rng.integers(1, 9, 3))
        bs = int(rng.integers(1, 65))
        table = rng.permutation(slots * layers * per_seq * 3)[:slots * layers * per_seq]
        table = table.reshape(slots, layers, per_seq).astype(np.int32)
        args = (table, int(rng.integers(slots)), int(rng.integers(layers)),
                int(rng.integers(per_seq * bs)), bs)
        draws.append((args, worked(*args)))
    return _first(fn, draws)


def table_index(fn):
    rng = random.Random(SEED)
    worked = _worked("02.table_index")
    draws = []
    for _ in range(4000):
        layers, bs, max_len = rng.randint(1, 40), rng.randint(1, 64), rng.randint(1, 4096)
        per_seq = -(-max_len // bs)
        args = (rng.randrange(9), rng.randrange(layers), rng.randrange(per_seq), layers,
                max_len, bs)
        draws.append((args, worked(*args)))
    return _first(fn, draws)


def k_index(fn):
    rng = random.Random(SEED)
    worked = _worked("03.k_index")
    draws = []
    for _ in range(4000):
        kv, ratio, hd, bs = rng.randint(1, 8), rng.randint(1, 8), rng.randint(1, 256), \
            rng.choice((8, 16, 32, 64))
        kv_dim = kv * hd
        args = (rng.randrange(2000), rng.randrange(bs), rng.randrange(kv * ratio),
                rng.randrange(hd), ratio, 2 * bs * kv_dim, kv_dim, hd)
        draws.append((args, worked(*args)))
    return _first(fn, draws)


# --- the online-softmax update, replayed on the host in float32 -----------------------------

def _score_sequences():
    rng = np.random.default_rng(SEED)
    seqs = []
    for _ in range(60):
        n = int(rng.integers(1, 200))
        spread = float(rng.choice((1.0, 10.0, 100.0, 1000.0)))
        seqs.append(rng.uniform(-spread, spread, n))
    seqs.append(np.linspace(-1000, 1000, 64))                 # the max rises every token
    seqs.append(np.linspace(1000, -1000, 64))                 # it never rises after the first
    seqs.append(np.full(40, 3.5))                             # ties
    seqs.append(np.array([900.0] + [900.0 - 12.0] * 5000))   # many tokens far below the max
    seqs.append(np.array([-1000.0, 1000.0, -1000.0, 999.0]))
    seqs.append(np.array([0.0] * 30 + [60.0] + [59.0] * 30))
    seqs.append(np.array([5.0] * 3000 + [17.0]))              # a max that jumps above many
    drawn = [(s.astype(np.float32), rng.standard_normal(len(s)).astype(np.float32))
             for s in seqs]
    # a max that jumps 25 above 2000 tokens whose V makes them, together, weigh 3 times the
    # new token: what was summed before a jump counts, however far the max jumps
    weight = 3.0 * math.exp(25.0) / 2000
    drawn.append((np.array([5.0] * 2000 + [30.0], dtype=np.float32),
                  np.array([weight] * 2000 + [-1.0], dtype=np.float32)))
    return drawn


def _replay(fn, scores, values):
    f32 = np.float32
    m, d, acc = f32(-np.inf), f32(0.0), f32(0.0)
    outs = []
    with np.errstate(all="ignore"):
        for s, v in zip(scores, values):
            m, d, acc = (f32(x) for x in fn(m, d, acc, f32(s), f32(v)))
            outs.append(float(acc) / float(d) if d != 0 else math.nan)
    return np.array(outs)


def softmax_update(fn):
    worked = _worked("05.softmax_update")
    for i, (scores, values) in enumerate(_score_sequences()):
        want = _replay(worked, scores, values)
        try:
            got = _replay(fn, scores, values)
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc} on score sequence {i}"
        bad = ~(np.isfinite(got) & np.isclose(got, want, rtol=1e-4, atol=1e-5))
        if bad.any():
            t = int(np.argmax(bad))
            return (f"score sequence {i} (length {len(scores)}), token {t}: acc/d {got[t]!r}, "
                    f"the worked update's {want[t]!r}")
    return None


# --- kernel parts, in the kernel, at wide launches ------------------------------------------

def kernel_cases(q_scale_wide: bool = True):
    """The deep oracle's launches (fixed seeds: the same every run)."""
    from paged_tutorial.teaching.harness import shapes

    rng = np.random.default_rng(SEED)
    cases = [
        # eleven 8-token blocks, four warps (the last partial), three layers
        shapes.case(rng, SEED, head_dim=100, gqa=(1, 1), lens=[81], num_layers=3,
                    max_seq_len=8 * 12, block_size=8, scale=0.071, q_row_pad=13),
        # GQA 7, two rows in reverse slot order, 8-token blocks
        shapes.case(rng, SEED + 1, head_dim=40, gqa=(1, 7), lens=[9, 3], num_layers=2,
                    max_seq_len=8 * 3, block_size=8, scale=0.31, q_row_pad=40),
        # 32-token blocks, 2 kv heads x 3, a block and a bit
        shapes.case(rng, SEED + 2, head_dim=24, gqa=(2, 3), lens=[34, 5], num_layers=2,
                    max_seq_len=32 * 3, block_size=32, scale=0.5, q_row_pad=5),
        # five warps (the last partial), GQA 5, slot 2 of 3
        shapes.case(rng, SEED + 3, head_dim=130, gqa=(1, 5), lens=[3], num_layers=2,
                    max_seq_len=16 * 2, block_size=16, scale=0.023, q_row_pad=130,
                    max_slots=3, slots=[2]),
        # one warp exactly, 2 kv heads x 4 (the article's ratio, other kv heads), a full block
        shapes.case(rng, SEED + 4, head_dim=32, gqa=(2, 4), lens=[7, 8, 1], num_layers=1,
                    max_seq_len=8 * 2, block_size=8, scale=0.3, q_row_pad=1),
    ]
    if q_scale_wide:
        # scores spanning +-1000
        cases.append(shapes.case(rng, SEED + 5, head_dim=40, gqa=(1, 3), lens=[19],
                                 num_layers=1, max_seq_len=24, block_size=8, scale=0.2,
                                 q_row_pad=3, q_scale=120.0))
    # every score far below 0 (exp(score) is 0 in float32 and in float64), ten 4-token blocks,
    # a middle layer, slot 2 of 3
    cases.append(shapes.case(rng, SEED + 6, head_dim=24, gqa=(2, 2), lens=[39], num_layers=4,
                             layer=2, max_slots=3, slots=[2], max_seq_len=4 * 11, block_size=4,
                             scale=0.25, q_row_pad=2, score_band=(-990.0, -940.0)))
    # one token of the first block 9.5 to 60 above every other token, whose V is scaled up so
    # that together they weigh as much as it: a walk that leaves out tokens under a weight
    # down to about e^-60 shows; two rows in reverse slot order, the peak's block partly
    # filled in the second
    cases.append(shapes.case(rng, SEED + 7, head_dim=24, gqa=(1, 2), lens=[29, 6],
                             num_layers=2, max_seq_len=8 * 4, block_size=8, scale=0.3,
                             q_row_pad=4, far_below_peak=(9.5, 60.0)))
    return cases


#: the deep launches are long: a simulated launch may take this long on a busy machine
KERNEL_LIMIT_S = 900.0


def _kernel(fn, part: str, extra_checks):
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.teaching.harness.kernel_harness import prepare, run_body

    parts = attention.ARTICLE_PARTS.replace(**{part: fn})
    for case in kernel_cases():
        prep = prepare(case)
        result = run_body(prep, parts, timeout=KERNEL_LIMIT_S)
        if result.error is not None:
            return f"[{case.label}] the kernel failed: {result.error}"
        if result.shared is not None:
            divergence = result.shared.divergence()
            if divergence is not None:
                return f"[{case.label}] a barrier not every thread reached"
            races = result.shared.races()
            if races:
                return f"[{case.label}] a shared-memory race: {races[0]}"
        if result.bad:
            return f"[{case.label}] output differs from the torch oracle at {result.bad[0]}"
        problem = extra_checks(prep, result)
        if problem:
            return f"[{case.label}] {problem}"
    return None


def _wrong_of(check):
    from paged_tutorial.teaching.harness.base import Wrong

    def run(prep, result):
        if not result.logs:
            return None
        try:
            check(prep, result.logs)
        except Wrong as wrong:
            return wrong.message
        return None
    return run


def walk_blocks(fn):
    from paged_tutorial.teaching.chapters.ch03_address_arithmetic import block_walk

    def reads(prep, logs):
        block_walk.check_table_reads(prep, logs)
        block_walk.check_cache_reads(prep, logs)
    return _kernel(fn, "walk_blocks", _wrong_of(reads))


def token_score(fn):
    return _kernel(fn, "token_score", lambda prep, result: None)


def write_output(fn):
    from paged_tutorial.teaching.chapters.ch05_online_softmax import output_store
    return _kernel(fn, "write_output", _wrong_of(output_store.check_q_writes))


# --- engine puzzles: graded again and again on fresh draws ----------------------------------

#: how many more gradings (fresh draws each) an engine puzzle's answer must pass
REGRADES = 4


def _regrade(name, answer):
    from paged_tutorial.teaching.chapters import puzzle

    for i in range(REGRADES):
        verdict = puzzle(name).grade(answer)
        if verdict.status != "correct":
            return f"grading {i + 2}: {str(verdict.message).splitlines()[0]}"
    return None


def allocator(cls):
    return _regrade("06.allocator", cls)


def table_sync(fn):
    return _regrade("06.table_sync", fn)


def can_share(fn):
    """The rule against the worked one on random chains (equal and differing tokens, parents
    that are the same record, an equal but different record, another prompt's block or None,
    at block 0 too), then regraded."""
    from paged_tutorial.cache.prefix_cache import CachedBlock

    worked = _worked("09.can_share")
    rng = random.Random(SEED)
    for _ in range(3000):
        bs = rng.choice((1, 2, 4, 8, 16, 32))
        tokens = tuple(rng.randrange(50) for _ in range(bs))
        other = list(tokens)
        kind = rng.randrange(5)
        if kind == 1:
            other[rng.randrange(bs)] += 1
        elif kind == 2:
            other = other[::-1]
        elif kind == 3 and bs > 1:
            other = other[1:] + other[:1]
        logical = rng.randrange(6)
        parent = None if logical == 0 else CachedBlock(1, tuple(rng.randrange(50) for _ in
                                                                range(bs)), None, logical - 1,
                                                       (0,))
        twin = None if parent is None else CachedBlock(parent.key, parent.tokens, None,
                                                       parent.logical_block, (0,))
        # a block of another prompt: a parent for a record found deeper, block 0's included
        elsewhere = CachedBlock(3, tuple(rng.randrange(50) for _ in range(bs)), None, 0, (2,))
        found_parent = rng.choice((parent, twin, None, elsewhere))
        found = CachedBlock(2, tuple(other), found_parent, logical, (1,))
        previous = rng.choice((parent, twin, None))
        n_tokens = rng.randrange(1, (logical + 3) * bs)
        args = (found, tokens, previous, logical, n_tokens, bs)
        want = worked(*args)
        try:
            got = fn(*args)
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc}"
        if bool(got) != bool(want) or not isinstance(got, (bool, np.bool_)):
            return (f"returned {got!r}, the worked rule {want!r} (logical block {logical}, "
                    f"BLOCK_SIZE {bs}, n_tokens {n_tokens}, tokens equal: "
                    f"{found.tokens == tokens}, parent: "
                    f"{'same' if found_parent is previous else 'other'})")
    return _regrade("09.can_share", fn)
