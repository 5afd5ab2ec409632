"""Puzzle ``05.softmax_update``: the online-softmax step of the decode kernel
(``kernels.cu:509-519``): fold one token into the running max, denominator and accumulator.

The grader compiles the reader's function into the article's kernel and runs two launches
against the torch oracle on a poisoned cache, both drawn afresh for every check: a few dozen
tokens of ordinary scores (the running max rises several times), then a few tokens whose scores
reach +-800, where exp() of a score that is not taken relative to the running max overflows
even a float64 (beyond 709.78: on a GPU it is inf; in the simulator Python's math.exp raises).  A wrong answer's message and figure come from replaying
the reader's update on the host, token by token, next to the article's.
"""

from __future__ import annotations

import math

import numpy as np

from paged_tutorial.teaching.language import Text, particle, say
from paged_tutorial.teaching.harness import shapes
from paged_tutorial.teaching.harness.base import Puzzle, Wrong, check_compiles, host_call, need_real
from paged_tutorial.teaching.harness.kernel_harness import KernelCase, bad_summary, prepare, run

#: the widest score of the wide launch is at least this far from 0: exp() of it overflows a
#: float64 (beyond 709.78), so only an update relative to the running max survives it
WIDE_SCORE = 720.0


#: the wide launch's max rises at least this far above its first score (exp() of 88.7 already
#: overflows a float32)
RISE = 200.0


def cases() -> list[KernelCase]:
    """Two launches drawn afresh: a few dozen ordinary tokens (the running max rises several
    times), then a few tokens whose scores reach +-800, where exp() of a score that is not taken
    relative to the running max overflows even a float64; BLOCK_SIZE, the softmax scale and the
    q row stride drawn for each.  Before them, on the host (``check_far_below``), each drawn
    afresh: a max that climbs a tenth of a point a token; thousands of tokens 16 below the
    running max, and hundreds 24-60 below it; thousands of tokens at one score, then one token
    14.5-30 above them whose V has the other sign."""
    rng, seed = shapes.fresh_rng()
    head_dim = shapes.pick(rng, (16, 24, 32))
    ordinary = shapes.case(rng, seed, head_dim=head_dim, gqa=(1, 1),
                           lens=[int(rng.integers(18, 31))], max_slots=1, slots=[0],
                           q_scale=1.5, **shapes.drawn_constants(rng, head_dim))
    return [ordinary, wide_case(rng, seed + 1, drawn=True)]


def wide_case(rng, seed: int, drawn: bool = False) -> KernelCase:
    """A few tokens whose widest score is past ``WIDE_SCORE`` and ``RISE`` above the first
    token's (redrawn until it is); with ``drawn``, BLOCK_SIZE, the scale and the q row stride
    are drawn too (a check's case; without, the model's, as a notebook's fixed demo)."""
    for attempt in range(64):
        if not drawn:
            wide = shapes.case(rng, seed + attempt, head_dim=shapes.pick(rng, (16, 24, 32)),
                               gqa=(1, 1), lens=[int(rng.integers(6, 11))], max_slots=1,
                               slots=[0], q_scale=float(rng.uniform(650.0, 800.0)))
        else:
            head_dim = shapes.pick(rng, (16, 24, 32))
            constants = shapes.drawn_constants(rng, head_dim)
            # q scaled so that the scores (scale included) reach several hundred
            q_scale = float(rng.uniform(650.0, 800.0)) / (constants["scale"] * np.sqrt(head_dim))
            wide = shapes.case(rng, seed + attempt, head_dim=head_dim,
                               gqa=(1, 1), lens=[int(rng.integers(6, 11))], max_slots=1,
                               slots=[0], q_scale=q_scale, **constants)
        scores, _ = _scores_and_values(prepare(wide))
        # the max is past what a double's exp() holds, and it rises far above the first score:
        # an update that keeps its first max overflows as surely as one that keeps none
        if scores.max() > WIDE_SCORE and scores.max() - scores[0] > RISE:
            return wide
    raise RuntimeError("wide_case: no draw reached the score WIDE_SCORE")


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
                raise Wrong(_three_numbers(out))
            for x, name in zip(out, ("new_max", "new_d", "new_acc")):
                need_real(x, name, "softmax_update")
            # the kernel keeps m, d and acc in float32 registers: so does the replay
            state = tuple(f32(x) for x in out)
            steps.append(tuple(float(x) for x in out))
    return np.array(steps, dtype=np.float64).reshape(-1, 3)


def _three_numbers(out) -> str:
    return say(en=f"your function returned {out!r}; it must return three numbers: "
                  "(new_max, new_d, new_acc)",
               ko=f"여러분의 함수가 {particle(repr(out), '을/를')} 돌려주었습니다; 숫자 세 개 (new_max, new_d, "
                  "new_acc)를 돌려주어야 합니다")


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
            return say(en=f"at token {t} (score {scores[t]:.3g}) your update fails (see above)",
                       ko=f"토큰 {t} (점수 {scores[t]:.3g})에서 여러분의 업데이트가 실패합니다 "
                          "(위 참고)")
        if not np.isfinite(out_mine[t]) or abs(out_mine[t] - out_article[t]) > 1e-4 * (
                1 + abs(out_article[t])):
            rose = t > 0 and article[t, 0] > article[t - 1, 0]
            if rose:
                event = say(en=f"the running max rises from {article[t - 1, 0]:.4g} to "
                               f"{article[t, 0]:.4g}",
                            ko=f"누적 최댓값이 {article[t - 1, 0]:.4g}에서 "
                               f"{particle(format(article[t, 0], '.4g'), '으로/로')} "
                               "오릅니다")
            elif t == 0:
                event = say(en="the first token", ko="첫 토큰")
            else:
                event = say(en=f"the running max stays {article[t, 0]:.4g}",
                            ko=f"누적 최댓값은 {article[t, 0]:.4g} 그대로입니다")
            state = say(en=f" (your d = {mine[t, 1]:.3g}, acc = {mine[t, 2]:.3g}: ",
                        ko=f" (여러분의 d = {mine[t, 1]:.3g}, acc = {mine[t, 2]:.3g}: ")
            if mine[t, 1] == 0:
                overflow = state + say(en="d is 0, so acc / d is 0/0: exp() of a score far below "
                                          "0 underflows to 0 unless it is taken relative to the "
                                          "running max)",
                                       ko="d가 0이라 acc / d는 0/0입니다: 0보다 한참 작은 점수의 "
                                          "exp()는 누적 최댓값 기준으로 계산하지 않으면 0으로 "
                                          "사라집니다)")
            elif np.isinf(mine[t, 1:]).any():
                overflow = state + say(en="float32 overflowed: exp() of a score far above the "
                                          "kept max exceeds 3.4e38)",
                                       ko="float32 오버플로: 유지한 최대보다 훨씬 큰 점수의 exp()가 "
                                          "3.4e38을 넘습니다)")
            elif np.isnan(mine[t]).any():
                overflow = state + say(en="NaN comes from inf x 0 or inf - inf: with the old max "
                                          "-inf, which exp() is infinite?)",
                                       ko="NaN은 inf x 0이나 inf - inf에서 나옵니다: 이전 최대가 "
                                          "-inf일 때 어느 exp()가 무한대인가요?)")
            else:
                overflow = ""
            return say(en=f"token {t} (score {scores[t]:.4g}; {event}): acc/d, the output so far "
                          f"for dimension 0, is {out_mine[t]:.4g} with your update, "
                          f"{out_article[t]:.4g} with the article's{overflow}",
                       ko=f"토큰 {t} (점수 {scores[t]:.4g}; {event}): 차원 0의 지금까지 출력 "
                          f"acc/d가 여러분의 업데이트로는 {out_mine[t]:.4g}, 글의 것으로는 "
                          f"{out_article[t]:.4g}입니다{overflow}")
    return say(en="the host replay agrees with the article's update; compare the types you "
                  "return",
               ko="호스트 재현은 글의 업데이트와 같습니다; 돌려주는 값의 타입을 비교해 보세요")


#: how far below the running max the far-below probe's tokens score: exp(-FAR_BELOW) is still
#: above half a float32 ulp of 1, so each of them still changes d in float32
FAR_BELOW = 16.0
#: how many such tokens the probe folds in: together they move acc / d far past the tolerance
FAR_BELOW_TOKENS = 3000
#: the deep probe's tokens score this far below the running max (drawn between the two): each
#: one's exp() no longer changes d in float32, but it still adds to an acc that starts at 0
DEEP_BELOW = (24.0, 60.0)
#: tokens of the deep probe; their V is drawn so that together they weigh as much as the first
DEEP_BELOW_TOKENS = 400


def check_far_below(fn) -> None:
    """Host probes, each replayed with the reader's update and the article's (values drawn
    afresh, shown only in a refusal):

    - scores that climb slowly (a tenth of a point a token) for over a hundred points, with
      large V: an update that moves its max only when a score passes it by some margin sums
      exp() of up to that margin for many tokens, and overflows a float32;
    - one token, then ``FAR_BELOW_TOKENS`` tokens ``FAR_BELOW`` below it: each weighs little,
      together much;
    - one token with V = 0, then ``DEEP_BELOW_TOKENS`` tokens 24 to 60 below it whose V is so
      large that together they weigh as much as the first: an update that skips tokens far
      below the running max is refused, whatever its cut-off short of float32's own;
    - thousands of tokens at one score, then one far above them (``check_jump``): an update
      that drops what it summed when the max jumps far is refused."""
    rng, _ = shapes.fresh_rng()
    top = float(rng.uniform(-50.0, 50.0))
    step = float(rng.uniform(*CLIMB_STEP))
    climb = top + step * np.arange(CLIMB_TOKENS)
    climb_values = rng.uniform(*CLIMB_VALUES, CLIMB_TOKENS) * rng.choice((-1.0, 1.0))
    climbing = _host_difference(fn, climb, climb_values)
    if climbing is not None:
        raise Wrong(say(en=f"scores climbing by {step:.2g} a token, from {climb[0]:.4g} to "
                           f"{climb[-1]:.4g}, V of magnitude {CLIMB_VALUES[0]:g}-"
                           f"{CLIMB_VALUES[1]:g}: {climbing}",
                        ko=f"토큰마다 {step:.2g}씩 오르는 점수 ({climb[0]:.4g}에서 "
                           f"{climb[-1]:.4g}까지), 크기 {CLIMB_VALUES[0]:g}-{CLIMB_VALUES[1]:g}"
                           f"의 V: {climbing}"))
    scores = np.array([top] + [top - FAR_BELOW] * FAR_BELOW_TOKENS)
    values = np.array([0.0] + [1.0] * FAR_BELOW_TOKENS)
    _far_below_agrees(fn, scores, values, FAR_BELOW, 1.0)
    depth = float(rng.uniform(*DEEP_BELOW))
    weight = float(rng.uniform(1.0, 3.0)) * math.exp(depth) / DEEP_BELOW_TOKENS
    scores = np.array([top] + [top - depth] * DEEP_BELOW_TOKENS)
    values = np.array([0.0] + [weight] * DEEP_BELOW_TOKENS)
    _far_below_agrees(fn, scores, values, depth, weight)
    check_jump(fn, rng, top)


def _final_outputs(fn, scores, values) -> tuple[float, float] | None:
    """acc / d after the last token with ``fn`` and with the article's update, replayed on the
    host; None when they agree (within the tolerance of a sum of thousands of float32 terms)."""
    mine, article = replay(fn, scores, values), replay(article_update, scores, values)
    with np.errstate(invalid="ignore", divide="ignore"):
        got = mine[-1, 2] / mine[-1, 1] if len(mine) == len(article) else float("nan")
    want = article[-1, 2] / article[-1, 1]
    if np.isfinite(got) and abs(got - want) <= 1e-4 * (1 + abs(want)) + 0.05 * abs(want):
        return None
    return float(got), float(want)


def _far_below_agrees(fn, scores, values, depth: float, weight: float) -> None:
    """Refuse ``fn`` if its acc / d after the probe's last token is not the article's."""
    outputs = _final_outputs(fn, scores, values)
    if outputs is None:
        return
    got, want = outputs
    n, top = len(scores) - 1, scores[0]
    raise Wrong(say(
        en=f"a token scoring {top:.4g}, then {n} tokens scoring {top - depth:.4g} ({depth:.3g} "
           f"below the running max; V = {weight:.3g} for them, 0 for the first): acc / d is "
           f"{got:.4g} with your update, {want:.4g} with the article's.  Each of those tokens "
           f"weighs exp(-{depth:.3g}) of the first, but together they count: every token is "
           "folded in, however far below the running max",
        ko=f"점수 {top:.4g}인 토큰 하나, 그 뒤 점수 {top - depth:.4g}인 토큰 {n}개 (누적 "
           f"최댓값보다 {depth:.3g} 낮음; V는 그 토큰들이 {weight:.3g}, 첫 토큰이 0): acc / d가 "
           f"여러분의 업데이트로는 {got:.4g}, 글의 것으로는 {want:.4g}입니다.  그 토큰 "
           f"하나하나는 첫 토큰의 exp(-{depth:.3g})배지만 모이면 무게가 있습니다: 누적 "
           "최댓값보다 얼마나 낮든 모든 토큰을 더하세요"))


#: how far above the jump probe's many tokens its last token scores (drawn between the two):
#: past 14, so an update that starts over when the max jumps by more than a margin of up to 14
#: (the state so far taken as negligible) starts over here
JUMP = (14.5, 30.0)
#: how many tokens sit at one score before the jump (drawn between the two)
JUMP_TOKENS = (1500, 2500)
#: together, the tokens before the jump weigh this many times the token after it (drawn
#: between the two): their V is scaled so, whatever the drawn jump
JUMP_WEIGHT = (2.0, 4.0)


def check_jump(fn, rng, base: float) -> None:
    """Thousands of tokens at the score ``base``, one V for them all, then one token a drawn
    ``JUMP`` above them with V = -1.  Once the max has jumped, each of the earlier tokens
    weighs exp(-jump) of the new one, but their V is drawn so that together they weigh
    ``JUMP_WEIGHT`` times as much: an update that starts over when the max jumps far is
    refused, whatever its margin short of the drawn jump."""
    n = int(rng.integers(*JUMP_TOKENS))
    jump = float(rng.uniform(*JUMP))
    together = float(rng.uniform(*JUMP_WEIGHT))
    weight = together * math.exp(jump) / n
    scores = np.array([base] * n + [base + jump])
    values = np.array([weight] * n + [-1.0])
    outputs = _final_outputs(fn, scores, values)
    if outputs is None:
        return
    got, want = outputs
    high = base + jump
    raise Wrong(say(
        en=f"{n} tokens scoring {base:.4g} (V = {weight:.3g} for each), then one token scoring "
           f"{high:.4g}, {jump:.3g} above them (V = -1): acc / d after it is {got:.4g} with "
           f"your update, {want:.4g} with the article's.  Once the max has jumped, each of "
           f"those tokens weighs exp(-{jump:.3g}) of the new one, yet together they weigh "
           f"{together:.2g} times as much: however far the max jumps, what was summed before "
           "it still counts",
        ko=f"점수 {base:.4g}인 토큰 {n}개 (V는 각각 {weight:.3g}), 그 뒤 그보다 {jump:.3g} 높은 "
           f"점수 {high:.4g}인 토큰 하나 (V = -1): 그 뒤의 acc / d가 여러분의 업데이트로는 "
           f"{got:.4g}, 글의 것으로는 {want:.4g}입니다.  최댓값이 뛰고 나면 앞의 토큰 하나하나는 "
           f"새 토큰의 exp(-{jump:.3g})배지만, 모두 합치면 {together:.2g}배입니다: 최댓값이 "
           "얼마나 크게 뛰든 그 전에 더한 것도 셉니다"))


#: tokens of the climbing probe, and the range its step per token is drawn from: it climbs
#: over a hundred points, a tenth of a point a token, so a max that lags the scores by up to
#: its margin sums exp() of nearly that margin for hundreds of tokens
CLIMB_TOKENS = 1400
CLIMB_STEP = (0.08, 0.12)
#: the magnitude of the climbing probe's V (one sign for all): with it, a lag of 80 points
#: already overflows a float32 (3.4e38) in acc, where the running max keeps acc near V
CLIMB_VALUES = (100.0, 300.0)


def _host_difference(fn, scores, values) -> str | None:
    """The first token where the reader's update, replayed on the host, leaves the article's
    acc / d, in words; None when they agree throughout."""
    mine, article = replay(fn, scores, values), replay(article_update, scores, values)
    with np.errstate(invalid="ignore", divide="ignore"):
        got = mine[:, 2] / mine[:, 1]
        want = article[:, 2] / article[:, 1]
    n = len(article)
    bad = [t for t in range(n) if t >= len(mine) or not np.isfinite(got[t])
           or abs(got[t] - want[t]) > 1e-4 * (1 + abs(want[t]))]
    if not bad:
        return None
    return _first_divergence(scores, mine, article)


def _grade_case(fn, parts, case):
    """Run one launch with ``parts`` (``fn`` the update in them); raise Wrong naming the shape
    and the first token that differs, replayed on the host."""
    prep = prepare(case)
    failed = None
    try:
        result = run(prep, parts)
    except Wrong as wrong:            # the kernel raised (Python's math.exp in the simulator)
        failed = wrong.message
    if failed is not None or not result.ok:
        scores, values = _scores_and_values(prep)
        mine, article = replay(fn, scores, values), replay(article_update, scores, values)

        def draw(scores=scores, mine=mine, article=article, label=case.label):
            from paged_tutorial.teaching.chapters.ch05_online_softmax.softmax import (
                plot_softmax_replay)

            return plot_softmax_replay(scores, mine, article, title=label)
        summary = failed if failed is not None else bad_summary(
            prep, result, say(en="an overflow or 0/0", ko="오버플로 또는 0/0"))
        first = _first_divergence(scores, mine, article)
        raise Wrong(say(en=f"[{case.label}] {summary}.  First difference, replayed on the "
                           f"host: {first}",
                        ko=f"[{case.label}] {summary}.  호스트에서 재현한 첫 차이: {first}"),
                    figure=draw)
    return prep


def run_parts(fn, case):
    """Grade the update ``fn`` (the package's, or a chapter's demonstration) at one fixed
    ``case`` with this puzzle's checks: a ``Verdict``."""
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.teaching.verdict import Verdict

    try:
        _grade_case(fn, attention.ARTICLE_PARTS.replace(softmax_update=fn), case)
    except Wrong as wrong:
        return Verdict("wrong", wrong.message, wrong.figure)
    return Verdict("correct", say(en="the oracle's output", ko="오라클과 같은 출력"))


def grade(fn) -> tuple:
    from paged_tutorial.backends.numba_cuda.kernels import attention

    first = host_call(fn, (-math.inf, 0.0, 0.0, 0.5, 1.0), NAMES)
    if not isinstance(first, (tuple, list)) or len(first) != 3:
        raise Wrong(_three_numbers(first))
    f32 = np.float32
    check_compiles(fn, (f32(-np.inf), f32(0.0), f32(0.0), f32(0.5), f32(1.0)))
    check_far_below(fn)
    parts = attention.ARTICLE_PARTS.replace(softmax_update=fn)
    drawn = cases()
    for case in drawn:
        prep = _grade_case(fn, parts, case)
    scores, values = _scores_and_values(prep)
    article = replay(article_update, scores, values)
    mine = replay(fn, scores, values)

    def draw(scores=scores, mine=mine, article=article, label=drawn[-1].label):
        from paged_tutorial.teaching.chapters.ch05_online_softmax.softmax import plot_softmax_replay

        return plot_softmax_replay(scores, mine, article, title=label)
    top = float(scores.max())
    shapes_run = "; ".join(case.label for case in drawn)
    return say(en=f"ordinary scores, then scores up to {top:.0f} (exp() of that overflows even a "
                  "float64): the kernel's output equals the torch oracle's, without overflow.  "
                  f"Shapes run: {shapes_run}",
               ko=f"보통 점수, 그리고 {top:.0f}까지 올라가는 점수 (그 exp()는 float64도 넘칩니다): "
                  "커널 출력이 오버플로 없이 torch 오라클과 같습니다.  실행한 모양: "
                  f"{shapes_run}"), draw


PUZZLES = (
    Puzzle(
        "05.softmax_update", Text(en="the online-softmax update (m, d, acc)",
                                  ko="온라인 소프트맥스 업데이트 (m, d, acc)"),
        "def softmax_update(current_max, d, acc, score, v):",
        Text(en="Fold one token into the running state of one thread, and return\n"
                "(new_max, new_d, new_acc).\n"
                "  current_max  the largest score so far (-inf before the first token)\n"
                "  d            the softmax denominator so far, sum of exp(score - current_max)\n"
                "  acc          this thread's sum of exp(score - current_max) * v so far\n"
                "  score        this token's scaled q.k;  v  its V element for this thread's\n"
                "               dimension\n"
                "After the last token the kernel writes acc / d.  Use math.exp.",
             ko="토큰 하나를 스레드 하나의 누적 상태에 더하고 (new_max, new_d, new_acc)를\n"
                "돌려주세요.\n"
                "  current_max  지금까지의 가장 큰 점수 (첫 토큰 전에는 -inf)\n"
                "  d            지금까지의 소프트맥스 분모, exp(score - current_max)의 합\n"
                "  acc          이 스레드의 exp(score - current_max) * v의 합\n"
                "  score        이 토큰의 스케일을 곱한 q·k;  v  이 스레드 차원의 V 원소\n"
                "마지막 토큰 뒤에 커널은 acc / d를 씁니다.  math.exp를 쓰세요."),
        Text(en="d and acc are kept relative to the running max: when the max rises, what was "
                "summed so far must be rescaled before the new token is added.",
             ko="d와 acc는 누적 최댓값 기준으로 유지됩니다: 최대가 오르면 지금까지 더한 값을 새 "
                "토큰을 더하기 전에 다시 맞춰야 합니다."),
        Text(en="the article's decode kernel (attention.py; the simulator on a CPU, the GPU on a "
                "GPU), ordinary scores and scores up to +-800, drawn afresh for every check; "
                "first, on the host, thousands of tokens far below the running max, a max "
                "that climbs a few points a token, and a max that jumps far above thousands of "
                "tokens",
             ko="글의 디코드 커널 (attention.py; CPU에서는 시뮬레이터, GPU에서는 GPU), "
                "채점할 때마다 새로 뽑는 보통 점수와 +-800까지의 점수; 그 전에 호스트에서, 누적 "
                "최댓값보다 한참 낮은 토큰 수천 개, 토큰마다 조금씩 오르는 최댓값, 토큰 수천 개 "
                "위로 크게 뛰는 최댓값"),
        "kernels.cu:509-519", grade),
)
