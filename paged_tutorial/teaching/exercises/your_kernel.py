"""Your kernel: the article's decode-attention kernel built from the puzzle answers you got right.

    kernel = pt.exercises.your_kernel()          # every part yours, or UnsolvedParts says which
    print(kernel.describe())                     # each part, its puzzle, whose code it is
    kernel.decode_attention(q, cache, table, layer, seq_lens, slots, scale)   # in place, as
                                                 # the stock kernel: same factory, same launch

The kernel's body is four parts of ``attention.KernelParts``, each the answer of one puzzle
(``BODY_PUZZLES``): ``walk_blocks`` (notebook 03), ``token_score`` (04), ``softmax_update`` and
``write_output`` (05).  ``check`` remembers an answer whose verdict is correct (``solved.py``),
in any notebook; ``your_kernel()`` puts the remembered answers in their places and refuses,
naming the puzzles and their notebooks, while any body part is missing.  The article's body
calls smaller steps; two of them are puzzles too (``STEP_PUZZLES``: the table index, the K
address), and a body of hers that calls them gets her versions when she solved them, the
article's otherwise (her K address, which starts from the query head, through
``kernel_addresses.kernel_part``; her table index, which starts from MAX_SEQ_LEN, through
``kernel_addresses.table_part`` when the kernel is built for a cache).
``your_kernel(use_solutions=True)`` takes every part from the worked solutions (the article's
code, as ``solutions.reveal`` shows it: what the tests run), and
``your_kernel(fill_unsolved=True)`` takes hers where she has one and the worked solution for
the rest; ``label`` and ``describe()`` say which is which, so nothing claims she wrote a part
she did not.

To let an engine serve a model with it, wrap a backend: ``teaching/kernel_router.py``;
``Serving`` is notebook 05b's run (its prompt, block size and routed layers), shared with its
tests.  When her kernel's answer differs from the stock engine's, ``which_part_changed`` finds
the part: it swaps her parts (the body's, and the table index and K address when hers) for the
worked ones one at a time (generating only up to the first token that differs) and names the
part whose swap gives back the stock text, with the first token that differs and the token
expected there.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from paged_tutorial.teaching.exercises import solved
from paged_tutorial.teaching.language import particle, say

#: the kernel's body: part (a field of ``attention.KernelParts``) -> the puzzle that writes it
BODY_PUZZLES = {
    "walk_blocks": "03.walk_blocks",
    "token_score": "04.token_score",
    "softmax_update": "05.softmax_update",
    "write_output": "05.write_output",
}
#: steps the article's body calls that are puzzles too: hers when solved, else the article's
STEP_PUZZLES = {
    "block_table_index": "02.table_index",
    "k_index": "03.k_index",
}
YOURS, WORKED = "yours", "worked solution"


class UnsolvedParts(RuntimeError):
    """``your_kernel()`` while some of its parts are not solved yet; ``missing`` lists their
    puzzles."""

    def __init__(self, missing: list[str]):
        self.missing = missing
        lines = "\n".join(say(en=f"  {name}  (notebook {name[:2]})",
                              ko=f"  {name}  (노트북 {name[:2]})") for name in missing)
        n, total = len(missing), len(BODY_PUZZLES)
        super().__init__(say(
            en=f"your kernel is not complete: {n} of the {total} parts of its body are not "
               f"solved yet:\n{lines}\nSolve them with pt.exercises.check(name, your_function) "
               "in their notebooks (a right answer is remembered), or build the kernel with "
               "your_kernel(fill_unsolved=True) to use the worked solutions for these parts",
            ko=f"아직 커널이 완성되지 않았습니다: 본문의 {total}개 부분 가운데 {n}개를 아직 풀지 "
               f"않았습니다:\n{lines}\n각 노트북에서 pt.exercises.check(name, your_function)로 "
               "풀어 보세요 (맞힌 답은 기억됩니다). 또는 your_kernel(fill_unsolved=True)로 이 "
               "부분들에 풀이 예시를 넣어 커널을 만들 수 있습니다"))


@dataclass(frozen=True)
class YourKernel:
    """The decode-attention kernel of ``attention.py`` built with ``parts`` (a
    ``KernelParts``); ``origins`` says, per part, whether it is hers or a worked solution."""

    parts: object
    origins: tuple                       # ((part, puzzle, YOURS | WORKED), ...)

    @property
    def worked_parts(self) -> list[str]:
        """The body puzzles whose worked solution stands in for her answer."""
        return [puzzle for part, puzzle, origin in self.origins
                if origin == WORKED and part in BODY_PUZZLES]

    @property
    def your_parts(self) -> list[tuple[str, str]]:
        """(part, puzzle) of every part that is hers, the body's first, then the steps'."""
        return [(part, puzzle) for part, puzzle, origin in self.origins if origin == YOURS]

    @property
    def all_yours(self) -> bool:
        """Is every part of the body hers?"""
        return not self.worked_parts

    @property
    def label(self) -> str:
        """Whose kernel this is, in a few words (used in front of its output)."""
        if self.all_yours:
            return say(en="your kernel", ko="여러분의 커널")
        if len(self.worked_parts) == len(BODY_PUZZLES):
            return say(en="the worked solutions' kernel", ko="풀이 예시로 만든 커널")
        parts = ", ".join(self.worked_parts)
        return say(en=f"your kernel with worked solutions for {parts}",
                   ko=f"여러분의 커널 ({particle(str(parts), '은/는')} 풀이 예시)")

    def describe(self) -> str:
        """One line per part: body or step, its name, its puzzle, whose code it is."""
        width = max(len(part) for part, _, _ in self.origins)
        whose = {YOURS: say(en=YOURS, ko="여러분의 답"), WORKED: say(en=WORKED, ko="풀이 예시")}
        rows = [f"  {'body' if part in BODY_PUZZLES else 'step'}  {part:<{width}}  "
                f"{puzzle:<18}  {whose[origin]}" for part, puzzle, origin in self.origins]
        return f"{self.label}:\n" + "\n".join(rows)

    def with_worked(self, part: str) -> "YourKernel":
        """This kernel with the worked solution (the article's code) in place of ``part``."""
        from paged_tutorial.backends.numba_cuda.kernels import attention

        parts = self.parts.replace(**{part: getattr(attention.ARTICLE_PARTS, part)})
        origins = tuple((p, puzzle, WORKED if p == part else origin)
                        for p, puzzle, origin in self.origins)
        return YourKernel(parts, origins)

    def kernel_for(self, cache, dtype_name: str):
        """The compiled kernel for ``cache``'s layout (``attention.kernel_for``, these parts)."""
        from paged_tutorial.backends.numba_cuda.kernels import attention

        from paged_tutorial.teaching.chapters.ch02_block_table import kernel_addresses

        parts = self.parts
        if ("block_table_index", "02.table_index", YOURS) in self.origins:
            # hers derives the row length from MAX_SEQ_LEN: put it in the kernel's place
            parts = parts.replace(block_table_index=kernel_addresses.table_part(
                parts.block_table_index, cache.config.max_seq_len))
        return attention.kernel_for(cache, dtype_name, parts)

    def decode_attention(self, q, cache, block_table, layer: int, seq_lens, active_slots,
                         scale: float, kv_group: int | None = None):
        """Decode attention over the paged cache, written over q [B, nH, D] as the stock
        kernel writes it (``attention.launch_decode``); returns q.  ``block_table``,
        ``seq_lens`` and ``active_slots`` are int32 tensors where the kernel runs.

        ``kv_group=g``: only the query heads that share kv head g (one launch of
        ``q_per_kv`` thread blocks per row instead of every head's): the kernel is handed q
        and the cache from that group's first element on, so that its kv head 0 is head g."""
        import torch

        from paged_tutorial.backends.numba_cuda.device.dtypes import ops_for
        from paged_tutorial.backends.numba_cuda.kernels import attention
        from paged_tutorial.backends.numba_cuda.runtime import launch

        c = cache.config
        if q.dim() != 3 or q.shape[2] != c.head_dim or q.shape[1] % c.num_kv_heads:
            raise ValueError(f"YourKernel.decode_attention: q must be [B, n_q_heads, "
                             f"{c.head_dim}] with n_q_heads a multiple of the cache's "
                             f"{c.num_kv_heads} kv heads, got {tuple(q.shape)}")
        if q.dtype != cache.buffer.dtype:
            raise TypeError(f"YourKernel.decode_attention: q is {q.dtype}, the cache holds "
                            f"{cache.buffer.dtype}")
        kernel = self.kernel_for(cache, ops_for(q.dtype).name)
        table, lens, slots = (t.to(device=q.device, dtype=torch.int32).contiguous()
                              for t in (block_table, torch.as_tensor(seq_lens),
                                        torch.as_tensor(active_slots)))
        if kv_group is None:
            return attention.launch_decode(kernel, q, cache, table, layer, lens, slots, scale)
        per_kv = q.shape[1] // c.num_kv_heads
        if not 0 <= kv_group < c.num_kv_heads:
            raise ValueError(f"YourKernel.decode_attention: kv_group {kv_group} outside "
                             f"[0, {c.num_kv_heads})")
        if q.shape[0] == 0:
            return q
        heads = q[:, kv_group * per_kv:(kv_group + 1) * per_kv, :]
        qa, q_rs = launch.rows(heads, "q")
        group_buffer = cache.buffer.reshape(-1)[kv_group * c.head_dim:]
        launch.launch(kernel, (q.shape[0], per_kv), attention.block_threads(c.head_dim),
                      int(layer), qa, q_rs, launch.flat(group_buffer, "cache.buffer"),
                      launch.flat(table), launch.flat(lens), launch.flat(slots), per_kv,
                      float(scale))
        return q


#: notebook 05b's run.  The prompt asks for something the model hesitates over (its third token
#: wins by 0.04 in the logits), so a wrong part in a few heads changes the text within three
#: tokens, where a confident answer ("The capital of France is Paris.") survives it; with the
#: chat template it is 36 tokens, the answer takes it to 43: five and six blocks of BLOCK_SIZE
#: (three at 16), and a BLOCK_SIZE other than 16 shows a literal 16 written for it.
PROMPT = "Give me a random word."
BLOCK_SIZE = 8
MAX_TOKENS = 8
#: on a CPU, the (layer, kv group) pairs whose decode attention her kernel answers: an early, a
#: middle and a late layer of SmolLM2's 30, one kv group (query heads 6-8) each, chosen so that
#: each wrong part of the tests changes the answer (every simulated thread is a Python thread:
#: three groups cost about one whole layer)
CPU_GROUPS = ((2, 2), (16, 2), (28, 2))


@dataclass(frozen=True)
class Serving:
    """A kernel serving ``model`` as notebook 05b runs it (the notebook and its tests share
    it): the greedy answer to ``prompt`` from a one-slot engine whose cache holds
    ``block_size`` tokens per block.  On a GPU the kernel answers the decode attention of every
    layer and head (the numba backend does the rest); on a CPU, where every simulated thread is
    a Python thread, the (layer, kv group) pairs of ``cpu_groups`` (the torch backend does the
    rest).  Prefill attention is not the article's kernel: it stays with the other backend."""

    model: object
    on_gpu: bool
    prompt: str = PROMPT
    block_size: int = BLOCK_SIZE
    max_tokens: int = MAX_TOKENS
    cpu_groups: tuple = CPU_GROUPS

    def routing(self) -> tuple[str, dict | None]:
        """The backend that does the rest, and {layer: [kv group, ...]} of the decode attention
        the kernel answers (None: every layer and head)."""
        if self.on_gpu:
            return "numba", None
        groups: dict = {}
        for layer, group in self.cpu_groups:
            groups.setdefault(layer, []).append(group)
        return "torch", groups

    def router(self, kernel):
        """A fresh ``KernelRouter`` sending the chosen decode attention to ``kernel``."""
        from paged_tutorial.teaching.kernel_router import KernelRouter

        inner, groups = self.routing()
        return KernelRouter(kernel, inner=inner, kv_groups=groups)

    def generate(self, backend="auto", max_tokens: int | None = None):
        """The greedy answer (a ``GenerationResult``) of an engine with ``backend`` (by default
        the engine's own: the stock engine), ``max_tokens`` long at most (default: the run's)."""
        import paged_tutorial as pt

        engine = pt.Engine(self.model, backend=backend, max_slots=1, block_size=self.block_size)
        return engine.generate([self.prompt], max_tokens=max_tokens or self.max_tokens,
                               temperature=0.0)[0]

    def tokens(self, backend, max_tokens: int | None = None) -> tuple[list[int], str | None]:
        """The greedy answer's token ids with ``backend``, and None; or, when the run raises
        (a kernel of hers that reads outside the cache stops with an IndexError in the
        simulator), the tokens made before it and the exception in one line."""
        import paged_tutorial as pt

        made: list[int] = []
        engine = pt.Engine(self.model, backend=backend, max_slots=1, block_size=self.block_size)
        try:
            engine.generate([self.prompt], max_tokens=max_tokens or self.max_tokens,
                            temperature=0.0, on_token=lambda i, token, text: made.append(token))
        except Exception as stopped:        # her kernel's fault, told to her in one line
            return made, f"{type(stopped).__name__}: {stopped}".splitlines()[0]
        return made, None

    def answer(self, kernel, max_tokens: int | None = None) -> list[int]:
        """The token ids of the greedy answer with ``kernel`` routed in (those made before it
        stopped, when it raised)."""
        return self.tokens(self.router(kernel), max_tokens)[0]

    def difference(self, kernel) -> float:
        """The largest difference of ``kernel``'s attention from the other backend's over the
        run (infinite when it stopped before any call finished)."""
        router = self.router(kernel)
        self.tokens(router)
        return max((call.max_abs_diff for call in router.routed), default=math.inf)

    def text(self, tokens: list[int]) -> str:
        """Token ids as text (the tokenizer's decode)."""
        return self.model.tokenizer.decode(tokens)

    def token_text(self, token: int) -> str:
        """One token as text."""
        return self.text([token])


def part_status() -> list[tuple[str, str, bool]]:
    """(part, puzzle, solved?) for the body's parts and then the steps that are puzzles."""
    return [(part, puzzle, solved.solved(puzzle) is not None)
            for part, puzzle in {**BODY_PUZZLES, **STEP_PUZZLES}.items()]


def your_kernel(use_solutions: bool = False, fill_unsolved: bool = False) -> YourKernel:
    """The decode-attention kernel with its body taken from your right answers (see the module
    docstring); ``UnsolvedParts`` while some are missing.  ``use_solutions=True``: every part
    from the worked solutions; ``fill_unsolved=True``: yours where solved, the worked solution
    elsewhere."""
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.teaching.chapters.ch02_block_table import kernel_addresses

    if use_solutions and fill_unsolved:
        raise ValueError("your_kernel: use_solutions=True already takes every part from the "
                         "worked solutions; fill_unsolved only applies to your own parts")
    puzzles = {**BODY_PUZZLES, **STEP_PUZZLES}
    unknown = sorted(set(puzzles) - set(attention.PART_NAMES))
    if unknown:
        raise RuntimeError(f"your_kernel: the kernel has no part(s) {unknown}; its parts are "
                           f"{', '.join(attention.PART_NAMES)}")
    chosen, origins = {}, []
    for part, puzzle in puzzles.items():
        fn = None if use_solutions else solved.solved(puzzle)
        origin = YOURS
        if fn is None:                # the worked solution of a kernel part is the article's
            fn, origin = getattr(attention.ARTICLE_PARTS, part), WORKED
        elif puzzle == "03.k_index":  # hers takes the query head: put it in the kernel's place
            fn = kernel_addresses.kernel_part(fn)
        chosen[part] = fn
        origins.append((part, puzzle, origin))
    unsolved = [puzzle for part, puzzle, origin in origins
                if origin == WORKED and part in BODY_PUZZLES]
    if unsolved and not (use_solutions or fill_unsolved):
        raise UnsolvedParts(unsolved)
    return YourKernel(attention.ARTICLE_PARTS.replace(**chosen), tuple(origins))


def first_difference(mine: list[int], stock: list[int]) -> int | None:
    """The index of the first generated token where two answers part, or None when equal."""
    for i, (a, b) in enumerate(zip(mine, stock)):
        if a != b:
            return i
    return None if len(mine) == len(stock) else min(len(mine), len(stock))


def which_part_changed(kernel: YourKernel, answer: Callable[[YourKernel, int], list[int]],
                       mine: list[int], stock: list[int],
                       token_text: Callable[[int], str] = str) -> str:
    """Why ``kernel``'s answer ``mine`` differs from the stock engine's ``stock``, in words:
    the first token where they part, and the part of hers that changes the text.
    ``answer(kernel, n)`` generates the first ``n`` tokens with a kernel (as the answer being
    explained was generated); each part of hers in turn (the body's, then the table index and
    the K address when she solved them) is replaced by the worked one, and the first whose
    replacement gives back the stock tokens up to the difference is named.  ``token_text(id)``
    shows a token (the tokenizer's decode)."""
    at = first_difference(mine, stock)
    if at is None:
        return say(en="your kernel's answer is the stock engine's, token for token",
                   ko="여러분 커널의 답은 표준 엔진의 답과 토큰 하나하나까지 같습니다")

    def shown(tokens, i):
        return repr(token_text(tokens[i])) if i < len(tokens) else say(en="nothing (it stopped)",
                                                                      ko="없음 (멈춤)")
    where = say(en=f"the answers part at generated token {at + 1}: {kernel.label} wrote "
                   f"{shown(mine, at)} where the stock engine wrote {shown(stock, at)}",
                ko=f"생성된 {at + 1}번째 토큰에서 답이 갈립니다: {particle(kernel.label, '은/는')} "
                   f"{shown(mine, at)}, 표준 엔진은 {particle(shown(stock, at), '을/를')} 썼습니다")
    yours = kernel.your_parts
    for part, puzzle in yours:
        if answer(kernel.with_worked(part), at + 1)[:at + 1] == stock[:at + 1]:
            return say(
                en=f"{where}.  With the worked solution in place of your {part} (puzzle "
                   f"{puzzle}, notebook {puzzle[:2]}) and every other part unchanged, the kernel "
                   f"writes the stock engine's tokens: your {part} is the part that changes the "
                   "text.  Its puzzle's checks passed, so the difference is one they do not "
                   f"cover: compare it with reveal({puzzle!r}) line by line",
                ko=f"{where}.  여러분의 {part} 자리에 풀이 예시를 넣고 (퍼즐 {puzzle}, 노트북 "
                   f"{puzzle[:2]}) 나머지는 그대로 두면 커널이 표준 엔진과 같은 토큰을 생성합니다: "
                   f"텍스트를 바꾸는 것은 여러분의 {part}입니다.  퍼즐의 채점은 통과했으니 "
                   f"채점이 다루지 않는 차이입니다: reveal({puzzle!r})과 한 줄씩 비교해 보세요")
    if not yours:
        return say(en=f"{where}.  Every part of the kernel is a worked solution here, so no "
                      "part of yours explains it: the difference comes from the backend",
                   ko=f"{where}.  커널의 모든 부분이 풀이 예시이므로 여러분의 부분 탓이 아닙니다: "
                      "차이는 백엔드에서 옵니다")
    names = ", ".join(part for part, _ in yours)
    return say(en=f"{where}.  Replacing any one of your parts ({names}) by the worked solution "
                  "still changes the text before that token: more than one of your parts "
                  "differs from the article's",
               ko=f"{where}.  여러분의 부분({names}) 중 어느 하나를 풀이 예시로 바꿔도 그 토큰 "
                  "전에 텍스트가 바뀝니다: 여러분의 부분 둘 이상이 글의 코드와 다릅니다")


#: an attention difference from the other backend at or above this is not rounding
FAR_FROM_ROUNDING = 1e-3


def which_part_differs(kernel: YourKernel, difference: Callable[[YourKernel], float]) -> str:
    """Which part of hers makes ``kernel``'s attention differ from the other backend's even
    when the tokens came out the same: ``difference(kernel)`` runs the routed generation with a
    kernel and returns the largest difference it saw; each part of hers in turn (as in
    ``which_part_changed``) is replaced by the worked one, and the first whose replacement
    brings the difference below ``FAR_FROM_ROUNDING`` is named."""
    worst = difference(kernel)
    if worst < FAR_FROM_ROUNDING:
        return say(en=f"{kernel.label}'s attention equals the other backend's up to rounding "
                      f"({worst:.1e})",
                   ko=f"{kernel.label}의 어텐션은 다른 백엔드의 것과 반올림 오차 안에서 같습니다 "
                      f"({worst:.1e})")
    yours = kernel.your_parts
    for part, puzzle in yours:
        swapped = difference(kernel.with_worked(part))
        if swapped < FAR_FROM_ROUNDING:
            return say(
                en=f"{kernel.label}'s attention differs from the other backend's by {worst:.1e}; "
                   f"with the worked solution in place of your {part} (puzzle {puzzle}, notebook "
                   f"{puzzle[:2]}) and every other part unchanged it differs by {swapped:.1e}: "
                   f"your {part} computes another attention.  Compare it with "
                   f"reveal({puzzle!r}) line by line",
                ko=f"{kernel.label}의 어텐션이 다른 백엔드의 것과 {worst:.1e}만큼 다릅니다. "
                   f"여러분의 {part} 자리에 풀이 예시를 넣고 (퍼즐 {puzzle}, 노트북 {puzzle[:2]}) "
                   f"나머지는 그대로 두면 차이가 {swapped:.1e}입니다: 다른 어텐션을 계산하는 것은 "
                   f"여러분의 {part}입니다.  reveal({puzzle!r})과 한 줄씩 비교해 보세요")
    if not yours:
        return say(en=f"the attention differs by {worst:.1e} with every part of the kernel a "
                      "worked solution: the difference comes from the backend",
                   ko=f"커널의 모든 부분이 풀이 예시인데도 어텐션이 {worst:.1e}만큼 다릅니다: 차이는 "
                      "백엔드에서 옵니다")
    names = ", ".join(part for part, _ in yours)
    return say(en=f"the attention differs by {worst:.1e}, and replacing any one of your parts "
                  f"({names}) by the worked solution does not bring it to rounding: more than one "
                  "of your parts differs from the article's",
               ko=f"어텐션이 {worst:.1e}만큼 다르고, 여러분의 부분({names}) 중 어느 하나를 풀이 "
                  "예시로 바꿔도 반올림 오차로 돌아오지 않습니다: 여러분의 부분 둘 이상이 글의 "
                  "코드와 다릅니다")
