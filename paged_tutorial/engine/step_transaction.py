"""StepTransaction: one engine step, whole or not at all, whatever happens inside it.

``EngineCore.step`` says what a step does (schedule -> run -> commit); this object is every
guard around it, in one place:

- **the lock** (``EngineLock``): one step at a time; a step asked for from inside a callback
  of the same engine is refused, naming the call; cancels asked for mid-step wait here
  (``cancel_later``) and are applied before the next step;
- **Ctrl-C**: the whole step is one critical section (``interrupts.py``): a signal arriving in
  the bookkeeping waits until it is whole again; only the model run and the callbacks are
  open to it;
- **rollback**: an exception in scheduling undoes its admissions; one in the model run
  preempts every request of the batch (recomputed later with the same tokens) and propagates,
  except a ``RequestError``, which finishes that one request with ``"error"`` and lets the
  step go on;
- **timings**: each phase's host seconds, into the step's ``StepReport``;
- **callbacks**: the step's ``on_token`` callbacks run after its commit, open to Ctrl-C.
"""

from __future__ import annotations

import time
from typing import Callable

from paged_tutorial.engine.engine_lock import EngineLock
from paged_tutorial.engine.interrupts import SIGNALS
from paged_tutorial.engine.request import Request, RequestError


class StepTransaction:
    def __init__(self, core, requests, outputs):
        self.core = core                   # EngineCore: the step itself
        self.requests = requests           # RequestRegistry: cancels may forget a request
        self.outputs = outputs             # OutputProcessor: the on_token callbacks
        self.lock = EngineLock()           # one step at a time; no re-entry from callbacks
        #: request -> forget it too; cancels asked for mid-step, applied at the next step
        self.deferred_cancels: dict[Request, bool] = {}
        self.phases: dict[str, float] = {}     # this step's phase -> host seconds
        self.started = 0.0                     # when this step began (perf_counter)

    def step(self):
        """One step of ``core``, guarded; returns its StepReport."""
        self.lock.refuse_reentry("step")
        return self.lock.step(self.run_locked)

    def run_locked(self):
        with SIGNALS.critical():
            self.apply_deferred_cancels()
            self.phases, self.started = {}, time.perf_counter()
            report, committed = self.core.step(self)
            if committed.requests:              # callbacks: after the commit, interruptible
                with SIGNALS.open():
                    self.lock.dispatch(self.outputs.dispatch, committed.requests,
                                       committed.token_ids, self.core.cancel)
        return report

    # --- what EngineCore.step calls --------------------------------------------------------
    def phase(self, name: str, work: Callable, *args, undo: Callable | None = None):
        """``work(*args)``, timed as ``name``; if it raises, ``undo()`` then re-raise."""
        start = time.perf_counter()
        try:
            result = work(*args)
        except BaseException:
            if undo is not None:
                undo()
            raise
        self.phases[name] = time.perf_counter() - start
        return result

    def model_run(self, batch, run: Callable, report, *args):
        """``run(*args)`` (default ``run(batch)``) open to Ctrl-C; its output, or None when one
        request's own fault (``RequestError``) finished that request and the batch was rolled
        back.  Anything else rolls the batch back and propagates."""
        try:
            with SIGNALS.open():
                output = run(*args) if args else run(batch)
        except RequestError as failure:          # one request's own fault: drop it alone
            with SIGNALS.critical():
                self.core.scheduler.rollback(batch, count=False)
                self.core.fail(failure.request, str(failure))
            report.finished = [failure.request.request_id]
            return None
        except BaseException:
            with SIGNALS.critical():
                self.core.scheduler.rollback(batch)
            raise
        self.phases.update(self.core.model_runner.phase_seconds)
        return output

    def finish(self, report):
        """The report, with the phases and the step's seconds."""
        report.phase_seconds = self.phases
        report.seconds = time.perf_counter() - self.started
        return report

    # --- cancels -----------------------------------------------------------------------------
    def cancel(self, request: Request, forget: bool) -> None:
        """Finish ``request`` now, or at the next step when this thread is inside a step's
        bookkeeping (a cache listener, a stream collected there)."""
        if self.lock.mid_step():
            self.deferred_cancels[request] = forget or self.deferred_cancels.get(request, False)
            return
        with self.lock.state("cancel"):
            self.core.cancel(request)
            if forget:
                self.requests.forget([request])

    def cancel_all(self, requests: list[Request]) -> None:
        """Cancel those of ``requests`` the engine still runs, in one critical section."""
        with self.lock.state("cancel"):
            for request in requests:
                if not request.finished and self.requests.holds(request):
                    self.core.cancel(request)

    def apply_deferred_cancels(self) -> None:
        pending, self.deferred_cancels = self.deferred_cancels, {}
        for request, forget in sorted(pending.items(), key=lambda kv: kv[0].request_id):
            if self.requests.holds(request):
                self.core.cancel(request)
                if forget:
                    self.requests.forget([request])
