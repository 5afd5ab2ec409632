"""Requests, slots and the decisions between engine steps: admission, retirement, preemption.

The article's engine serves ``MAX_SEQUENCES`` slots; a slot is one row of the block table.
Here a request waits in a FIFO queue until a slot is free *and* the cache has blocks for its
tokens; then it is admitted (prefilled) and decodes with the others until it finishes, when
its blocks go back to ``free_blocks`` and its slot to the next waiting request (continuous
batching).  When a decode step needs a block and none is free, the most recently admitted
running request is preempted: its blocks are freed, it goes back to the head of the queue with
the tokens it has generated, and it is recomputed (prefilled again) when re-admitted.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .kv_cache import CacheFullError, PagedKVCache


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    request_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    on_token: Callable | None = None
    sample_key: int = 0                  # keys the request's random stream with seed
    # --- state ---
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    slot: int | None = None
    num_cached: int = 0                  # tokens whose K/V are in the cache
    finish_reason: str | None = None
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    detok: object | None = None          # incremental detokenizer (engine-owned)
    text_parts: list[str] = field(default_factory=list)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class Scheduler:
    def __init__(self, cache: PagedKVCache, max_slots: int):
        self.cache = cache
        self.max_slots = max_slots
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []          # in admission order
        self.free_slots: list[int] = list(range(max_slots - 1, -1, -1))   # pop() gives slot 0 first

    # --- queue ---------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- admission -----------------------------------------------------------------------
    def admit(self) -> list[Request]:
        """Move waiting requests into free slots while their tokens fit in free blocks.
        FIFO: a request that does not fit yet blocks the ones behind it (no starvation)."""
        admitted = []
        while self.waiting and self.free_slots:
            request = self.waiting[0]
            slot = self.free_slots[-1]
            try:
                self.cache.ensure_capacity(slot, request.total_len)
            except CacheFullError:
                break
            self.waiting.popleft()
            self.free_slots.pop()
            request.slot, request.status = slot, Status.RUNNING
            self.running.append(request)
            admitted.append(request)
        return admitted

    # --- decode preparation ----------------------------------------------------------------
    def reserve_decode_blocks(self) -> list[Request]:
        """Give every running request room for the token it writes this step, preempting the
        most recently admitted requests while blocks run short.  Returns the preempted."""
        preempted = []
        i = 0
        while i < len(self.running):
            request = self.running[i]
            try:
                self.cache.ensure_capacity(request.slot, request.num_cached + 1)
                i += 1
            except CacheFullError:
                victim = self.running[-1]
                self.preempt(victim)
                preempted.append(victim)
                # if the victim was this request, running[i] is now the next one (or none)
        return preempted

    def preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.cache.release(request.slot)
        self.free_slots.append(request.slot)
        request.slot, request.status = None, Status.WAITING
        request.num_cached = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    # --- retirement ------------------------------------------------------------------------
    def finish(self, request: Request, reason: str) -> None:
        """Retire a request: release its blocks and slot at once (also used by cancel)."""
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self.cache.release(request.slot)
            self.free_slots.append(request.slot)
            request.slot = None
        elif request.status is Status.WAITING and request in self.waiting:
            self.waiting.remove(request)
        request.status = Status.FINISHED
        request.finish_reason = reason
        request.finish_time = time.perf_counter()
