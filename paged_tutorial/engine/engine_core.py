"""EngineCore: the loop itself -- queue requests, step, cancel; each step commits or rolls back.

    Scheduler.schedule -> ModelRunner.run -> Scheduler.postprocess (commit)
                                          \\-> Scheduler.rollback (anything raised)

``step`` is the step itself; ``StepTransaction`` (``step_transaction.py``) guards it: one
critical section (``interrupts.py``) opened for the model run, where Ctrl-C rolls the batch
back (every request of it preempted, recomputed later with the same tokens), while a signal
anywhere else waits until the bookkeeping it cut into is whole again.  Tokens are appended
only after the model run fully succeeded.  Three faults finish one request and spare
the others: its random stream or its detokenizer fails (``RequestError``, finish_reason
``"error"``), or its row of logits is not finite (finish_reason ``"non_finite"``, with the
layer where its activations first went non-finite, found by ``numerical_faults.py``).

The core knows nothing of callers: who submitted what, results, threads and callbacks are
``llm_engine.py``'s (the frontend); text is ``output_processor.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.engine.model_runner import ModelRunner, record_logprobs
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


class EngineCore:
    def __init__(self, scheduler: Scheduler, model_runner: ModelRunner, backend: Backend,
                 cache: PagedKVCache, outputs: OutputProcessor):
        self.scheduler = scheduler
        self.model_runner = model_runner
        self.backend = backend
        self.cache = cache
        self.outputs = outputs
        self.step_count = 0                  # steps completed
        self.record_logits = False           # keep each step's logits in its StepReport

    # --- requests in and out ---------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request ``Admission.request`` made (its prompt leaves room for an answer)."""
        self.scheduler.add(request)

    def cancel(self, request: Request) -> None:
        """Finish a request now; a running one gives its slot and blocks back at once."""
        self.scheduler.finish(request, "cancelled")

    def fail(self, request: Request, message: str, reason: str = "error") -> None:
        """Finish one request with ``reason`` and ``message`` (the others go on)."""
        if not request.finished:
            request.error = message
            self.scheduler.finish(request, reason)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # --- one step ----------------------------------------------------------------------------
    def step(self, guard) -> tuple[StepReport, CommittedTokens]:
        """Admit what fits and prefill it; otherwise decode every running request.  ``guard``
        (the ``StepTransaction``) times each phase, keeps Ctrl-C out of the bookkeeping and
        rolls the batch back when the run fails.  Returns the report and the tokens committed,
        for the caller's callbacks."""
        batch = guard.phase("schedule", self.scheduler.schedule,
                            undo=self.scheduler.abort_schedule)
        report, committed = self.new_report(batch), CommittedTokens()
        if batch is not None and batch.requests:
            output = guard.model_run(batch, self.run, report)
            if output is not None:
                committed = guard.phase("postprocess", self.commit, batch, output)
                self.describe_commit(report, batch, committed, output)
        self.step_count += 1
        # last: a cache listener that raises finds the step's bookkeeping all done
        guard.phase("release", self.scheduler.release_retired)
        report.num_free_blocks = self.cache.num_free
        report.num_evictable_blocks = self.cache.num_evictable_blocks
        return guard.finish(report), committed

    def run(self, batch):
        """The model run of a batch: its sampled tokens and logits."""
        self.backend.begin_step(self.step_count)
        return self.model_runner.run(batch)

    def new_report(self, batch) -> StepReport:
        if batch is None:
            return StepReport(self.step_count, "idle", [], [], 0)
        return StepReport(self.step_count, batch.kind, [r.request_id for r in batch.requests],
                          [r.slot for r in batch.requests], batch.num_tokens,
                          preempted=[r.request_id for r in batch.preempted])

    def describe_commit(self, report: StepReport, batch, committed: CommittedTokens,
                        output) -> None:
        """What the commit did, into the report: finished requests, tokens, logits."""
        report.finished = [r.request_id for r in batch.requests
                           if r.status is Status.FINISHED]
        committed_ids = report.request_ids if len(committed.requests) == len(batch.requests) \
            else [r.request_id for r in committed.requests]
        report.new_tokens = dict(zip(committed_ids, committed.token_ids))
        if self.record_logits:
            report.logits = output.logits.detach().float().cpu()

    def commit(self, batch, output) -> CommittedTokens:
        """Append the step's tokens (``Scheduler.postprocess``) and their text; a request whose
        logits were not finite gets no token and is finished with ``"non_finite"``."""
        if all(output.finite):                   # the usual step: every row is kept
            faulted = []
            committed = CommittedTokens(list(batch.requests), list(output.token_ids))
        else:
            faulted = [r for r, ok in zip(batch.requests, output.finite) if not ok]
            kept = [(r, t) for r, t, ok in zip(batch.requests, output.token_ids,
                                               output.finite) if ok]
            committed = CommittedTokens([r for r, _ in kept], [t for _, t in kept])
        self.scheduler.postprocess(batch, output.token_ids, skip=faulted)
        if output.logprobs is not None or output.prompt_logprobs is not None:
            record_logprobs(batch.requests, output, faulted)
        self.outputs.detokenize(committed.requests, committed.token_ids, self.fail)
        for request in faulted:
            self.outputs.flush(request)
            self.fail(request, describe_non_finite(request, self.model_runner, self.step_count),
                      reason=NON_FINITE)
        return committed
