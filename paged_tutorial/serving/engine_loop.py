"""The server's engine thread: one thread steps the engine; request handlers talk to it by queue.

    loop = EngineLoop(engine); loop.start(deliver)
    job = loop.submit(prompt_ids, params, on_event)   # any thread
    loop.cancel(job)                                  # any thread: the client went away
    loop.stop()                                       # finish what runs, then end the thread

Handlers never touch the engine.  ``submit`` and ``cancel`` put a message in the loop's inbox
(a ``queue.Queue``); the engine thread takes the inbox between steps, queues new requests with
``Engine.add_request`` and cancels abandoned ones with ``Engine.cancel`` (their blocks go back
to ``free_blocks`` before the next step), then runs one step: continuous batching over every
client's requests.  Each job's answers report back through ``on_event(event)``.  The events a
step produces for every client are gathered and handed over together, once per step:
``deliver(calls)`` receives the list of ``(on_event, event)`` pairs in the engine thread (by
default it calls each one there; the server passes one function that moves the whole list to
its event loop in a single hand-off, so 64 streaming clients cost one wake-up per step, not 64).
Events:
``("delta", index, text)`` (text that can be shown), ``("finish", index, CompletionOutput,
prompt tokens found in the prefix cache)``,
``("rejected", message)`` when the engine refused to queue the job (nothing of it runs: the
client's fault, such as a request larger than the whole cache) and ``("error", message)`` when
the engine thread failed.

``stats()`` is a snapshot taken after every step (running requests, queued requests, free
blocks, totals: prompt tokens, prefix-cache queries and hits, finished answers by finish
reason), safe to read from any thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

from paged_tutorial.engine.sampling_params import SamplingParams
from paged_tutorial.serving.answers import Answer


@dataclass
class Job:
    """One client request: a prompt and its n answers."""
    job_id: int
    prompt_ids: list[int]
    params: SamplingParams
    on_event: Callable[[tuple], None]
    answers: list[Answer] = field(default_factory=list)
    cancelled: bool = False

    @property
    def done(self) -> bool:
        return bool(self.answers) and all(a.output is not None for a in self.answers)


@dataclass(frozen=True)
class LoopStats:
    running: int = 0             # requests in a slot
    waiting: int = 0             # requests queued for a slot (preempted ones included)
    free_blocks: int = 0
    total_blocks: int = 0
    steps: int = 0
    jobs_finished: int = 0
    jobs_cancelled: int = 0
    tokens_generated: int = 0    # tokens of finished answers
    prompt_tokens: int = 0       # prompt tokens of finished answers
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0   # of those, tokens found there (their K/V reused)
    preemptions: int = 0
    finished_by_reason: tuple = ()   # ((finish_reason, answers), ...)


class EngineLoop:
    def __init__(self, engine, idle_wait_s: float = 0.05):
        self.engine = engine
        self.idle_wait_s = idle_wait_s
        self._inbox: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count()
        self._stats = LoopStats(free_blocks=engine.cache.num_free,
                                total_blocks=engine.cache.num_blocks)
        self._counts = dict.fromkeys(("jobs_finished", "jobs_cancelled", "tokens_generated",
                                      "prompt_tokens", "prefix_cache_queries",
                                      "prefix_cache_hits", "preemptions"), 0)
        self._reasons: dict[str, int] = {}
        self._outbox: list[tuple[Callable[[tuple], None], tuple]] = []
        self._deliver: Callable[[list], None] = call_each
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # --- any thread ----------------------------------------------------------------------
    def start(self, deliver: Callable[[list], None] | None = None) -> None:
        """Start the engine thread; ``deliver(calls)`` (called there, once per step with the
        step's ``(on_event, event)`` pairs) decides where the ``on_event`` calls run."""
        if deliver is not None:
            self._deliver = deliver
        self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               on_event: Callable[[tuple], None]) -> Job:
        if self._stopping.is_set() or self.failure is not None:
            raise RuntimeError("the server is shutting down")
        job = Job(next(self._ids), list(prompt_ids), params, on_event)
        self._inbox.put(("submit", job))
        self._wake.set()
        return job

    def cancel(self, job: Job) -> None:
        self._inbox.put(("cancel", job))
        self._wake.set()

    def stats(self) -> LoopStats:
        return self._stats

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = None) -> None:
        """Serve what is queued and running to the end, then end the thread."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    # --- the engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                self._take_inbox()
                if self.engine.has_unfinished():
                    self.engine.step()
                    self._finish_answers()
                    self._snapshot()
                    self._flush()
                    continue
                self._finish_answers()
                self._snapshot()
                self._flush()
                if self._stopping.is_set() and self._inbox.empty():
                    return
                self._wake.wait(self.idle_wait_s)
                self._wake.clear()
        except BaseException as exc:            # noqa: BLE001 - reported to every client
            self.failure = exc
            for job in list(self._jobs.values()):
                self._emit(job, ("error", f"the engine failed: {type(exc).__name__}: {exc}"))
            self._flush()
            raise

    def _emit(self, job: Job, event: tuple) -> None:
        self._outbox.append((job.on_event, event))

    def _flush(self) -> None:
        if self._outbox:
            calls, self._outbox = self._outbox, []
            self._deliver(calls)

    def _take_inbox(self) -> None:
        while True:
            try:
                kind, job = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                self._start(job)
            elif job.job_id in self._jobs and not job.cancelled:
                job.cancelled = True
                self._counts["jobs_cancelled"] += 1
                for answer in job.answers:
                    answer.cancel()

    def _start(self, job: Job) -> None:
        params = job.params.with_seed()          # drawn from the OS when the client gave none

        def on_delta(answer: Answer, text: str) -> None:
            self._emit(job, ("delta", answer.index, text))

        try:
            job.answers = [Answer(self.engine, j, params, on_delta) for j in range(params.n)]
            for answer in job.answers:
                answer.submit(job.prompt_ids, sample_key=answer.index)
        except Exception as exc:                 # noqa: BLE001 - this job's own fault
            for answer in job.answers:
                if answer.request is not None:
                    answer.cancel()
                    self.engine.pop_result(answer.request_id)
            self._emit(job, ("rejected", str(exc)))
            return
        self._jobs[job.job_id] = job

    def _finish_answers(self) -> None:
        for job in list(self._jobs.values()):
            for answer in job.answers:
                if answer.output is None and answer.done:
                    output = answer.finish()
                    self._count(job, answer, output)
                    self._emit(job, ("finish", answer.index, output, answer.num_cached_tokens))
            if job.done:
                del self._jobs[job.job_id]
                self._counts["jobs_finished"] += 1

    def _count(self, job: Job, answer: Answer, output) -> None:
        counts = self._counts
        counts["tokens_generated"] += len(output.token_ids)
        counts["prompt_tokens"] += len(job.prompt_ids)
        counts["preemptions"] += answer.result.num_preemptions
        if self.engine.prefix_caching:
            counts["prefix_cache_queries"] += len(job.prompt_ids)
            counts["prefix_cache_hits"] += answer.num_cached_tokens
        reason = output.finish_reason
        self._reasons[reason] = self._reasons.get(reason, 0) + 1

    def _snapshot(self) -> None:
        scheduler = self.engine.scheduler
        self._stats = LoopStats(running=len(scheduler.running), waiting=len(scheduler.waiting),
                                free_blocks=self.engine.cache.num_free,
                                total_blocks=self.engine.cache.num_blocks,
                                steps=self.engine.step_count,
                                finished_by_reason=tuple(sorted(self._reasons.items())),
                                **self._counts)


def call_each(calls: list) -> None:
    """The default ``deliver``: each ``on_event(event)`` called where the step ran."""
    for on_event, event in calls:
        on_event(event)
