"""EngineCore: the loop itself -- queue requests, step, cancel; each step commits or rolls back.

    Scheduler.schedule -> ModelRunner.launch, .collect -> Scheduler.postprocess (commit)
                                                     \\-> Scheduler.rollback (anything raised)

``step`` is the step itself; ``StepTransaction`` (``step_transaction.py``) guards it: one
critical section (``interrupts.py``) opened for the model run, where Ctrl-C rolls the batch
back (every request of it preempted, recomputed later with the same tokens), while a signal
anywhere else waits until the bookkeeping it cut into is whole again.  Tokens are appended
only after the model run fully succeeded.  Three faults finish one request and spare
the others: its random stream or its detokenizer fails (``RequestError``, finish_reason
``"error"``), or its row of logits is not finite (finish_reason ``"non_finite"``, with the
layer where its activations first went non-finite, found by ``numerical_faults.py``).

**Asynchronous scheduling** (``async_scheduling``, the engine's option): while a decode step
runs on the device, the host schedules and launches the next one before reading the first
back (``Scheduler.schedule_ahead``; its input tokens are taken on the device from the step in
flight, ``ModelRunner.launch(after=...)``), then commits the first while the second runs.  So
the device does not wait for the host's commit, detokenizing and scheduling between steps.
``step`` still commits one step per call; a step may be left in flight between calls, and
only while some request of it is running.  What changes is one step of lateness: a request
that stops (EOS, a stop string, a cancel) at step n was already computed once more at step
n + 1; that token is dropped.  Its blocks go back at once (``scheduler.py`` says why that is
safe with step n + 1 still writing one row of them).
The scheduler looks ahead only where nothing else would happen between the two steps (no
admission, no preemption, no sampling controls, no recorded logits); elsewhere the step runs
as without it.

The core knows nothing of callers: who submitted what, results, threads and callbacks are
``llm_engine.py``'s (the frontend); text is ``output_processor.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.engine.model_runner import LaunchedRun, ModelRunner, record_logprobs
from paged_tutorial.engine.numerical_faults import NON_FINITE, describe_non_finite
from paged_tutorial.engine.output_processor import OutputProcessor
from paged_tutorial.engine.request import Request, Status
from paged_tutorial.engine.scheduler import Scheduler


@dataclass
class StepReport:
    """What one engine step did (notebooks record these to replay a run)."""
    index: int
    kind: str                            # "prefill" | "decode" | "idle"
    request_ids: list[int]
    slots: list[int]
    num_tokens: int
    preempted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    new_tokens: dict = field(default_factory=dict)     # request_id -> token id
    num_free_blocks: int = 0
    num_evictable_blocks: int = 0           # unused blocks kept for their prefix (prefix caching)
    seconds: float = 0.0
    #: host seconds per phase of the step: ``schedule`` (admission, preemption, block
    #: allocation), the model runner's phases (``ModelRunner.phase_seconds``: ``inputs``,
    #: ``forward``, ``sample``, or ``graph``), ``postprocess`` (tokens appended, the step
    #: committed, detokenized) and ``release`` (finished requests' blocks given back)
    phase_seconds: dict = field(default_factory=dict)
    logits: torch.Tensor | None = None   # float32 [rows, vocab], kept when engine.record_logits


@dataclass
class CommittedTokens:
    """The tokens a step appended, for the callbacks run after it: request i got token i."""
    requests: list[Request] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)


@dataclass
class InFlightStep:
    """A step launched ahead (asynchronous scheduling), to be committed by the next ``step``."""
    launched: LaunchedRun
    report: StepReport


class EngineCore:
    def __init__(self, scheduler: Scheduler, model_runner: ModelRunner, backend: Backend,
                 cache: PagedKVCache, outputs: OutputProcessor, async_scheduling: bool = False):
        self.scheduler = scheduler
        self.model_runner = model_runner
        self.backend = backend
        self.cache = cache
        self.outputs = outputs
        self.async_scheduling = async_scheduling
        self.step_count = 0                  # steps completed
        self.steps_ahead = 0                 # steps launched before the previous was committed
        self.record_logits = False           # keep each step's logits in its StepReport
        self.in_flight: InFlightStep | None = None

    # --- requests in and out ---------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request ``Admission.request`` made (its prompt leaves room for an answer)."""
        self.scheduler.add(request)

    def cancel(self, request: Request) -> None:
        """Finish a request now; a running one gives its slot and blocks back at once (after
        the step in flight that writes them, if there is one)."""
        self.scheduler.finish(request, "cancelled")
        self.drop_dead_step()

    def fail(self, request: Request, message: str, reason: str = "error") -> None:
        """Finish one request with ``reason`` and ``message`` (the others go on)."""
        if not request.finished:
            request.error = message
            self.scheduler.finish(request, reason)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self.in_flight is not None

    # --- one step ----------------------------------------------------------------------------
    def step(self, guard) -> tuple[StepReport, CommittedTokens]:
        """Admit what fits and prefill it; otherwise decode every running request.  ``guard``
        (the ``StepTransaction``) times each phase, keeps Ctrl-C out of the bookkeeping and
        rolls the batch back when the run fails.  Returns the report and the tokens committed,
        for the caller's callbacks.  With asynchronous scheduling the step committed may be
        the one the last call launched, and the next one may be left in flight."""
        in_flight, self.in_flight = self.in_flight, None
        committed = CommittedTokens()
        if in_flight is None:
            batch = guard.phase("schedule", self.scheduler.schedule,
                                undo=self.scheduler.abort_schedule)
            report = self.new_report(batch)
            launched = None
            if batch is not None and batch.requests:
                launched = guard.model_run(batch, self.launch, report)
        else:
            launched, report = in_flight.launched, in_flight.report
            report.index = self.step_count
        if launched is not None:
            ahead_batch = None
            if self.async_scheduling and not self.record_logits:
                ahead_batch = guard.phase("schedule", self.schedule_ahead, launched,
                                          undo=lambda: self.abandon(launched))
            result = guard.model_run(launched.batch, self.collect_and_look_ahead, report,
                                     launched, ahead_batch)
            if result is not None:
                output, ahead = result
                if ahead is not None:
                    self.in_flight = InFlightStep(ahead, self.new_report(ahead.batch))
                batch = launched.batch
                gone = [r for r in batch.requests if r.status is not Status.RUNNING]
                committed = guard.phase("postprocess", self.commit, batch, output, gone)
                self.describe_commit(report, batch, committed, output, gone)
                self.drop_dead_step()
        self.step_count += 1
        # last: a cache listener that raises finds the step's bookkeeping all done
        guard.phase("release", self.scheduler.release_retired)
        report.num_free_blocks = self.cache.num_free
        report.num_evictable_blocks = self.cache.num_evictable_blocks
        return guard.finish(report), committed

    def launch(self, batch) -> LaunchedRun:
        """Queue the model run of a batch (``collect_and_look_ahead`` reads it back)."""
        self.backend.begin_step(self.step_count)
        return self.model_runner.launch(batch)

    def schedule_ahead(self, launched: LaunchedRun):
        """The step after ``launched``, scheduled now (``Scheduler.schedule_ahead``), or None."""
        return self.scheduler.schedule_ahead(launched.batch)

    def abandon(self, launched: LaunchedRun) -> None:
        """Scheduling ahead of ``launched`` failed: roll its batch back (recomputed later)."""
        self.scheduler.rollback(launched.batch)

    def collect_and_look_ahead(self, launched: LaunchedRun, ahead_batch):
        """Launch ``ahead_batch`` (the step after ``launched``, or None) on the device, then
        wait for ``launched`` and read it back.  Returns (its output, the step launched ahead
        or None).  If anything fails here the caller rolls ``launched``'s batch back, which
        holds every request of the step ahead too."""
        ahead = None
        if ahead_batch is not None:
            self.backend.begin_step(self.step_count + 1)
            ahead = self.model_runner.launch(ahead_batch, after=launched)
            self.steps_ahead += 1
        output = self.model_runner.collect(launched)
        if ahead is not None:                    # this call's host time, in this report
            self.model_runner.phase_seconds["launch_ahead"] = sum(
                ahead.phase_seconds.values())
        return output, ahead

    def drop_dead_step(self) -> None:
        """A step in flight none of whose requests still runs is waited for and dropped (its
        tokens were computed once too many), so that an engine with nothing to run has
        nothing in flight."""
        in_flight = self.in_flight
        if in_flight is None or any(r.status is Status.RUNNING
                                    for r in in_flight.launched.batch.requests):
            return
        self.in_flight = None
        self.model_runner.collect(in_flight.launched)

    def new_report(self, batch) -> StepReport:
        if batch is None:
            return StepReport(self.step_count, "idle", [], [], 0)
        return StepReport(self.step_count, batch.kind, [r.request_id for r in batch.requests],
                          [r.slot for r in batch.requests], batch.num_tokens,
                          preempted=[r.request_id for r in batch.preempted])

    def describe_commit(self, report: StepReport, batch, committed: CommittedTokens,
                        output, gone: list[Request] = ()) -> None:
        """What the commit did, into the report: finished requests, tokens, logits.
        ``gone``: requests of the batch that had finished before it was committed."""
        report.finished = [r.request_id for r in batch.requests
                           if r.status is Status.FINISHED and r not in gone]
        committed_ids = report.request_ids if len(committed.requests) == len(batch.requests) \
            else [r.request_id for r in committed.requests]
        report.new_tokens = dict(zip(committed_ids, committed.token_ids))
        if self.record_logits:
            report.logits = output.logits.detach().float().cpu()

    def commit(self, batch, output, gone: list[Request] = ()) -> CommittedTokens:
        """Append the step's tokens (``Scheduler.postprocess``) and their text; a request whose
        logits were not finite gets no token and is finished with ``"non_finite"``.  The
        requests in ``gone`` (finished while a step launched ahead was computing them) get
        nothing."""
        if all(output.finite) and not gone:      # the usual step: every row is kept
            faulted = []
            committed = CommittedTokens(list(batch.requests), list(output.token_ids))
        else:
            faulted = [r for r, ok in zip(batch.requests, output.finite)
                       if not ok and r not in gone]
            skipped = set(faulted) | set(gone)
            kept = [(r, t) for r, t in zip(batch.requests, output.token_ids)
                    if r not in skipped]
            committed = CommittedTokens([r for r, _ in kept], [t for _, t in kept])
        self.scheduler.postprocess(batch, output.token_ids, skip=faulted + list(gone))
        if output.logprobs is not None or output.prompt_logprobs is not None:
            record_logprobs(batch.requests, output, set(faulted) | set(gone))
        self.outputs.detokenize(committed.requests, committed.token_ids, self.fail)
        for request in faulted:
            self.outputs.flush(request)
            self.fail(request, describe_non_finite(request, self.model_runner, self.step_count),
                      reason=NON_FINITE)
        return committed
