"""What mutation testing needs of each puzzle: its worked solution's source, the namespace a
mutant's code runs in (what a notebook cell gives her code), and its deep oracle."""

from __future__ import annotations

import inspect
import math
import textwrap
from dataclasses import dataclass
from typing import Callable

from tests.mutation import deep


@dataclass(frozen=True)
class Target:
    puzzle: str
    solution: Callable[[], object]        # the worked solution (function or class)
    namespace: Callable[[], dict]         # the globals a mutant's code runs with
    deep_oracle: Callable[[object], str | None]   # why an answer is wrong, or None

    def source(self) -> str:
        return textwrap.dedent(inspect.getsource(self.solution()))

    def build(self, source: str):
        """The function or class ``source`` defines, as a notebook cell would define it."""
        namespace = {"__name__": "__main__", **self.namespace()}
        exec(compile(source, f"<mutant of {self.puzzle}>", "exec"), namespace)
        name = self.solution().__name__
        return namespace[name]


def _solution(name):
    def get():
        from paged_tutorial.teaching.exercises.solutions import solution_of
        return solution_of(name)
    return get


def _plain() -> dict:
    return {}


def _kernel_names() -> dict:
    from numba import cuda, float32
    return {"math": math, "cuda": cuda, "float32": float32}


def _allocator_names() -> dict:
    from paged_tutorial.cache.block_allocator import CacheFullError
    from paged_tutorial.teaching.chapters.ch06_block_lifetime.allocator import AllocatorBase
    return {"AllocatorBase": AllocatorBase, "CacheFullError": CacheFullError}


TARGETS = {t.puzzle: t for t in (
    Target("01.kv_offset", _solution("01.kv_offset"), _plain, deep.kv_offset),
    Target("02.locate", _solution("02.locate"), _plain, deep.locate),
    Target("02.table_index", _solution("02.table_index"), _plain, deep.table_index),
    Target("03.k_index", _solution("03.k_index"), _plain, deep.k_index),
    Target("03.walk_blocks", _solution("03.walk_blocks"), _kernel_names, deep.walk_blocks),
    Target("04.token_score", _solution("04.token_score"), _kernel_names, deep.token_score),
    Target("05.softmax_update", _solution("05.softmax_update"), _kernel_names,
           deep.softmax_update),
    Target("05.write_output", _solution("05.write_output"), _kernel_names, deep.write_output),
    Target("06.allocator", _solution("06.allocator"), _allocator_names, deep.allocator),
    Target("06.table_sync", _solution("06.table_sync"), _plain, deep.table_sync),
    Target("09.can_share", _solution("09.can_share"), _plain, deep.can_share),
)}
