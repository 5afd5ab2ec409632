"""Slots and the decisions between engine steps: admission, preemption, retirement.

The article's engine serves ``MAX_SEQUENCES`` slots; a slot is one row of the block table.  A
request waits in a FIFO queue until a slot is free *and* the cache has blocks for its tokens;
then it is admitted (prefilled) and decodes with the others until it finishes, when its blocks go
back to ``free_blocks`` and its slot to the next waiting request (continuous batching).  When a
decode step needs a block and none is free, the most recently admitted running request is
preempted: its blocks are freed, it goes back to the head of the queue with the tokens it has
generated, and it is recomputed (prefilled again) when re-admitted.

With prefix caching (``cache/prefix_cache.py``) an admitted request's leading prompt blocks
may be found in the cache: its ``num_computed_tokens`` then starts after them and only the
rest is computed.

One engine step is ``schedule()`` -> the model runner -> ``postprocess()``.  ``schedule`` may
allocate blocks and admit or preempt requests; ``postprocess`` appends the sampled tokens and
finishes requests.  If the model runner fails in between (an exception, Ctrl-C), ``rollback``
preempts every request of the batch: their blocks go back, nothing was appended, and they are
recomputed later with exactly the tokens they would have produced.  ``postprocess`` also
commits the prompt blocks the step registered for sharing; ``rollback`` forgets them.

With asynchronous scheduling (``engine_core.py``) ``schedule_ahead`` makes the decode step
after a decode still in flight, before that one is committed: the same requests minus those
whose length ends them, one position further, with blocks for it, and never an admission or a
preemption (when either would be needed it gives up: the engine then waits, commits and
schedules as usual).  A request that finishes while a later step of it is in flight gives its
blocks back at once, as without it: that step may still write one row into them, but every
later use of a block (another request's step, a prefill) is queued behind it on the same
device stream, and the row lies past the request's committed tokens, so it is never in a block
kept for its prefix.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from paged_tutorial.cache.block_allocator import BlockAllocator, CacheFullError
from paged_tutorial.engine.decode_rows import DecodeRows
from paged_tutorial.engine.request import Request, Status


@dataclass
class ScheduledBatch:
    """What one step runs: a prefill of newly admitted requests or a decode of all running
    ones.  ``preempted`` lists requests the scheduler preempted to make room this step;
    ``rows``, for a decode, the host lists the model runner feeds it (``decode_rows.py``)."""
    kind: str                                   # "prefill" | "decode"
    requests: list[Request]
    preempted: list[Request] = field(default_factory=list)
    rows: DecodeRows | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens the model computes this step (K/V written for each)."""
        if self.kind == "decode":
            return len(self.requests)
        return sum(r.total_len - r.num_computed_tokens for r in self.requests)


class Scheduler:
    def __init__(self, blocks: BlockAllocator, max_slots: int, max_seq_len: int,
                 eos_token_ids=()):
        self.blocks = blocks                      # the cache's allocator: all the scheduler calls
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []          # in admission order
        self.free_slots: list[int] = list(range(max_slots - 1, -1, -1))   # pop() gives slot 0 first
        self._admitting: list[Request] = []       # admitted by the schedule() in progress
        self._to_release: list[int] = []          # slots of retired requests, blocks not freed
        self._next_rows: DecodeRows | None = None  # made by the last decode commit

    # --- queue ---------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        request.status = Status.WAITING
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step ------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        """Admit what fits and prefill it; otherwise decode every running request (preempting
        while blocks run short).  None when there is nothing to run.

        Every change is complete before the cache reports it to its listeners, so if a
        listener raises, the state is consistent and ``abort_schedule`` undoes the admissions
        of this call."""
        self._admitting = []
        rows, self._next_rows = self._next_rows, None     # good for this call only
        admitted = self._admit()
        if admitted:
            return ScheduledBatch("prefill", admitted)
        if not self.running:
            return None
        preempted = self._reserve_decode_blocks()
        if not self.running:
            return ScheduledBatch("decode", [], preempted)
        if rows is None or rows.requests != self.running:     # the same requests, in order
            rows = DecodeRows.of(self.running)
        return ScheduledBatch("decode", rows.requests, preempted, rows)

    def _admit(self) -> list[Request]:
        """Move waiting requests into free slots while their tokens fit in free blocks.
        FIFO: a request that does not fit yet blocks the ones behind it (no starvation).

        With prefix caching the cache finds the request's leading prompt blocks (its
        ``num_computed_tokens`` starts there, so only the rest is computed), and a request
        whose prefix a request admitted in this very step is computing waits one step to find
        it cached instead of computing it a second time."""
        admitted = self._admitting
        while self.waiting and self.free_slots:
            request = self.waiting[0]
            slot = self.free_slots[-1]
            if admitted and self.blocks.prefix_in_flight(request):
                break
            if not self.blocks.can_allocate_prompt(slot, request):
                break
            self.waiting.popleft()
            self.free_slots.pop()
            request.slot, request.status = slot, Status.RUNNING
            self.running.append(request)
            admitted.append(request)
            try:
                request.num_computed_tokens = self.blocks.allocate_prompt(slot, request)
                if request.num_cached_tokens is None:      # the first admission's count
                    request.num_cached_tokens = request.num_computed_tokens
                    request.first_scheduled_time = time.perf_counter()
            except CacheFullError:      # an allocator with its own rules disagreed
                admitted.pop()
                self.running.pop()
                self.free_slots.append(slot)
                request.slot, request.status = None, Status.WAITING
                self.waiting.appendleft(request)
                break
        return admitted

    def abort_schedule(self) -> None:
        """``schedule()`` raised (a cache listener did): put the requests it admitted back at
        the head of the queue, as if it had not run."""
        admitted, self._admitting = self._admitting, []
        try:
            self.blocks.discard_uncommitted()
        finally:
            self._undo(admitted, count=False)

    def _undo(self, requests: list[Request], count: bool) -> None:
        """Preempt these requests (in reverse, so that they wait at the head of the queue in
        their order), all of them even if a cache listener raises on the way."""
        first = None
        for request in reversed(requests):
            if request.status is Status.RUNNING:
                try:
                    self.preempt(request, count=count)
                except BaseException as exc:      # noqa: BLE001 - re-raised below
                    first = first or exc
        if first is not None:
            raise first

    def _reserve_decode_blocks(self) -> list[Request]:
        """Give every running request room for the token it writes this step, preempting the
        most recently admitted requests while blocks run short.  Returns the preempted.

        The allocator says at once which requests may need a block (``slots_to_grow``: on
        most steps none, since a block holds BLOCK_SIZE tokens); only those are grown, in
        admission order."""
        running = self.running
        growing = [running[i] for i in self.blocks.slots_to_grow(
            [r.slot for r in running], [r.num_computed_tokens + 1 for r in running])]
        preempted = []
        for request in growing:
            while request.status is Status.RUNNING:
                try:
                    self.blocks.ensure_capacity(request.slot, request.num_computed_tokens + 1)
                    break
                except CacheFullError:
                    victim = self.running[-1]
                    self.preempt(victim)
                    preempted.append(victim)
                    # the victim may be this request (then it waits, and the loop ends)
        return preempted

    def schedule_ahead(self, batch: ScheduledBatch) -> ScheduledBatch | None:
        """The decode step after ``batch`` (a decode launched, not committed), made now: its
        requests that are still running and whose length does not end them at ``batch``'s
        commit, each at the next position, with a block for it.  None when that step would
        admit a request (some wait while a slot is free), preempt one (blocks are short), or
        has no request; the engine then collects ``batch`` and schedules as usual.  Blocks
        taken here are the requests' own: a rollback or a retirement gives them back."""
        rows = batch.rows
        if rows is None or rows.controlled or (self.waiting and self.free_slots):
            return None
        kept, positions = [], []
        max_seq_len = self.max_seq_len
        for i, request in enumerate(rows.requests):
            if request.status is not Status.RUNNING:
                continue
            produced = len(request.output_ids) + 1          # once ``batch`` is committed
            total = len(request.prompt_ids) + produced - 1
            if produced >= request.params.max_tokens or total + 1 >= max_seq_len:
                continue                                   # ``batch`` finishes it
            kept.append(i)
            positions.append(total)
        if not kept:
            return None
        slots = [rows.slots[i] for i in kept]
        for j in self.blocks.slots_to_grow(slots, [p + 1 for p in positions]):
            try:
                self.blocks.ensure_capacity(slots[j], positions[j] + 1)
            except CacheFullError:
                return None                    # a preemption would be needed: not ahead
        ahead = rows.ahead(kept, positions)
        return ScheduledBatch("decode", ahead.requests, rows=ahead)

    def postprocess(self, batch: ScheduledBatch, token_ids: list[int],
                    skip: list[Request] = ()) -> list[Request]:
        """Commit a step that ran: every request of the batch now has all its tokens cached,
        gains its sampled token and is retired if it should stop.  Returns the finished
        requests; their blocks go back in ``release_retired()``, once the engine has
        recorded the step (so a cache listener that raises cannot cut a commit in half).
        The requests in ``skip`` gain nothing (their token is not trusted: the engine
        finishes them).

        One pass over the batch, the stop rules (``stop_reason``) tested inline: most
        requests go on, and only those that stop are asked for their reason."""
        self.blocks.commit_step()
        finished = []
        now = time.perf_counter()
        skip = set(skip)
        eos = self.eos_token_ids
        max_seq_len = self.max_seq_len
        next_tokens, next_positions, dropped = [], [], []   # the next decode step's rows
        for i, (request, token) in enumerate(zip(batch.requests, token_ids)):
            if skip and request in skip:
                dropped.append(i)
                continue
            token = int(token)
            output = request.output_ids
            total = len(request.prompt_ids) + len(output)
            request.num_computed_tokens = total
            output.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
            params = request.params
            if (token in eos and not params.ignore_eos) or len(output) >= params.max_tokens \
                    or total + 1 >= max_seq_len:
                self._retire(request, self.stop_reason(request))
                finished.append(request)
                dropped.append(i)
            else:
                next_tokens.append(token)
                next_positions.append(total)
        if batch.rows is not None:
            kept = None
            if dropped:
                gone = set(dropped)
                kept = [i for i in range(len(batch.requests)) if i not in gone]
            self._next_rows = batch.rows.advanced(next_tokens, next_positions, kept)
        return finished

    def stop_reason(self, request: Request) -> str | None:
        params = request.params
        if not params.ignore_eos and request.output_ids[-1] in self.eos_token_ids:
            return "eos"
        if len(request.output_ids) >= params.max_tokens:
            return "length"
        if request.total_len >= self.max_seq_len:
            return "max_seq_len"
        return None

    def rollback(self, batch: ScheduledBatch, count: bool = True) -> None:
        """A step failed before ``postprocess``: preempt every request of the batch (in reverse,
        so that they wait at the head of the queue in their original order).  What the model
        wrote into their blocks is discarded with the blocks (prefix blocks registered for this
        step are forgotten first: their K/V may be incomplete); nothing was appended.
        ``count``: whether each request counts it as a preemption (not when the step was
        abandoned because one request of it failed on its own)."""
        try:
            self.blocks.discard_uncommitted()
        finally:
            self._undo(batch.requests, count=count)

    # --- preemption and retirement ---------------------------------------------------------
    def preempt(self, request: Request, count: bool = True) -> None:
        """Free the request's blocks and slot and requeue it at the head (recomputed later).
        The cache is released last: its listeners then see a consistent scheduler."""
        slot = request.slot
        self.running.remove(request)
        self.free_slots.append(slot)
        request.slot, request.status = None, Status.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += int(count)
        self.waiting.appendleft(request)
        self.blocks.release(slot)

    def finish(self, request: Request, reason: str) -> None:
        """Retire a request and release its blocks and slot at once (also used by cancel)."""
        self._retire(request, reason)
        self.release_retired()

    def _retire(self, request: Request, reason: str) -> None:
        """Mark a request finished and free its slot; its blocks wait in ``_to_release``."""
        if request.status is Status.FINISHED:
            return
        if request.status is Status.RUNNING:
            self.running.remove(request)
            self.free_slots.append(request.slot)
            self._to_release.append(request.slot)
            request.slot = None
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = Status.FINISHED
        request.finish_reason = reason
        request.finish_time = time.perf_counter()

    def release_retired(self) -> None:
        """Push the blocks of retired requests back to ``free_blocks`` (every slot is released
        even if a cache listener raises; the first such exception is re-raised after)."""
        first = None
        while self._to_release:
            slot = self._to_release.pop(0)
            try:
                self.blocks.release(slot)
            except BaseException as exc:          # noqa: BLE001 - re-raised below
                first = first or exc
        if first is not None:
            raise first

    # --- invariants -----------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Slots and requests agree: each running request holds one slot, no slot is both free
        and used, waiting requests hold none."""
        used = [r.slot for r in self.running]
        if len(set(used)) != len(used) or None in used:
            raise AssertionError(f"running requests hold slots {used}")
        if set(used) & set(self.free_slots) or \
                len(used) + len(self.free_slots) != self.max_slots:
            raise AssertionError(f"slots: used {used}, free {self.free_slots}, "
                                 f"max_slots {self.max_slots}")
        if any(r.slot is not None or r.status is not Status.WAITING for r in self.waiting):
            raise AssertionError("a waiting request holds a slot or is not WAITING")
        for slot in range(self.max_slots):
            if slot in self.free_slots and slot not in self._to_release and \
                    self.blocks.blocks_owned(slot):
                raise AssertionError(f"free slot {slot} still owns blocks")
