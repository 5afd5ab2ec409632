"""Puzzle ``05.softmax_update``: the online-softmax step of the decode kernel
(``kernels.cu:509-519``): fold one token into the running max, denominator and accumulator.

The grader compiles the reader's function into the article's kernel and runs two launches
against the torch oracle on a poisoned cache: 24 tokens of ordinary scores (the running max
rises several times), then 8 tokens whose scores differ by hundreds, where exp() of a score
that is not taken relative to the running max overflows (float32 on a GPU; in the simulator
Python's math.exp raises beyond 709).  A wrong answer's message and figure come from replaying
the reader's update on the host, token by token, next to the article's.
"""

from __future__ import annotations

import math

import numpy as np

from paged_tutorial.teaching.puzzles.base import Puzzle, Wrong, check_compiles, host_call, need_real
from paged_tutorial.teaching.puzzles.kernel_harness import KernelCase, bad_summary, prepare, run

CASES = (KernelCase("24 ordinary tokens", rows=((0, 24),), q_scale=1.5, max_seq_len=32,
                    num_blocks=4, seed=20),
         KernelCase("8 tokens with scores hundreds apart", rows=((0, 8),), q_scale=400.0,
                    max_seq_len=16, num_blocks=3, seed=21))
NAMES = ["current_max", "d", "acc", "score", "v"]


def article_update(current_max, d, acc, score, v):
    from paged_tutorial.backends.numba_cuda.kernels.attention import softmax_update

    return softmax_update(current_max, d, acc, score, v)


def replay(fn, scores, values):
    """(m, d, acc) after each token with the update ``fn`` on the host, thread 0's view
    (``values`` is V of dimension 0).  The kernel's state starts as float32 and scores and V
    are float32, so NumPy's float32 arithmetic overflows where the GPU's would.  Stops at the
    first error, returning what it has."""
    f32 = np.float32
    state = (f32(-np.inf), f32(0.0), f32(0.0))
    steps = []
    with np.errstate(all="ignore"):
        for s, v in zip(scores, values):
            try:
                out = host_call(fn, (*state, f32(s), f32(v)), NAMES)
            except Wrong:
                break
            if not isinstance(out, (tuple, list)) or len(out) != 3:
                raise Wrong(f"your function returned {out!r}; it must return three numbers: "
                            "(new_max, new_d, new_acc)")
            for x, name in zip(out, ("new_max", "new_d", "new_acc")):
                need_real(x, name, "softmax_update")
            state = tuple(out)
            steps.append(tuple(float(x) for x in out))
    return np.array(steps, dtype=np.float64).reshape(-1, 3)


def _scores_and_values(prep, row: int = 0, head: int = 0):
    trace = prep.traces[(row, head)]
    buf = prep.cache.buffer.cpu().double().numpy()
    q = prep.q[row, head].double().numpy()
    scores = buf[trace.k_index] @ q * prep.scale
    return scores, buf[trace.v_index][:, 0]


def _first_divergence(scores, mine, article) -> str:
    with np.errstate(invalid="ignore", divide="ignore"):
        out_mine = mine[:, 2] / mine[:, 1]
        out_article = article[:, 2] / article[:, 1]
    for t in range(len(article)):
        if t >= len(mine):
            return f"at token {t} (score {scores[t]:.3g}) your update fails (see above)"
        if not np.isfinite(out_mine[t]) or abs(out_mine[t] - out_article[t]) > 1e-4 * (
                1 + abs(out_article[t])):
            rose = t > 0 and article[t, 0] > article[t - 1, 0]
            event = (f"the running max rises from {article[t - 1, 0]:.4g} to {article[t, 0]:.4g}"
                     if rose else "the first token" if t == 0 else
                     f"the running max stays {article[t, 0]:.4g}")
            state = f" (your d = {mine[t, 1]:.3g}, acc = {mine[t, 2]:.3g}: "
            if np.isinf(mine[t]).any():
                overflow = state + ("float32 overflowed: exp() of a score far above the kept "
                                    "max exceeds 3.4e38)")
            elif np.isnan(mine[t]).any():
                overflow = state + ("NaN comes from inf x 0 or inf - inf: with the old max "
                                    "-inf, which exp() is infinite?)")
            else:
                overflow = ""
            return (f"token {t} (score {scores[t]:.4g}; {event}): acc/d, the output so far for "
                    f"dimension 0, is {out_mine[t]:.4g} with your update, {out_article[t]:.4g} "
                    f"with the article's{overflow}")
    return "the host replay agrees with the article's update; compare the types you return"


def grade(fn) -> str:
    from paged_tutorial.backends.numba_cuda.kernels import attention

    first = host_call(fn, (-math.inf, 0.0, 0.0, 0.5, 1.0), NAMES)
    if not isinstance(first, (tuple, list)) or len(first) != 3:
        raise Wrong(f"your function returned {first!r}; it must return three numbers: "
                    "(new_max, new_d, new_acc)")
    f32 = np.float32
    check_compiles(fn, (f32(-np.inf), f32(0.0), f32(0.0), f32(0.5), f32(1.0)))
    parts = attention.ARTICLE_PARTS.replace(softmax_update=fn)
    for case in CASES:
        prep = prepare(case)
        result = run(prep, parts)
        if not result.ok:
            scores, values = _scores_and_values(prep)
            mine, article = replay(fn, scores, values), replay(article_update, scores, values)

            def draw(scores=scores, mine=mine, article=article, label=case.label):
                from paged_tutorial.teaching.viz.softmax import plot_softmax_replay

                return plot_softmax_replay(scores, mine, article, title=label)
            raise Wrong(f"{case.label}: {bad_summary(prep, result, 'an overflow or 0/0')}.  First difference, "
                        f"replayed on the host: {_first_divergence(scores, mine, article)}",
                        figure=draw)
    return ("24 ordinary tokens and 8 with scores hundreds apart: the kernel's output equals "
            "the torch oracle's, without overflow")


PUZZLES = (
    Puzzle(
        "05.softmax_update", "the online-softmax update (m, d, acc)",
        "def softmax_update(current_max, d, acc, score, v):",
        "Fold one token into the running state of one thread, and return\n"
        "(new_max, new_d, new_acc).\n"
        "  current_max  the largest score so far (-inf before the first token)\n"
        "  d            the softmax denominator so far, sum of exp(score - current_max)\n"
        "  acc          this thread's sum of exp(score - current_max) * v so far\n"
        "  score        this token's scaled q.k;  v  its V element for this thread's dimension\n"
        "After the last token the kernel writes acc / d.  Use math.exp.",
        "d and acc are kept relative to the running max: when the max rises, what was summed "
        "so far must be rescaled by exp(old max - new max) before the new token is added.",
        "the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a GPU)",
        "kernels.cu:509-519", grade),
)
