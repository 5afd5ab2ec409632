"""The engine in a process of its own: the server's event loop and the engine's step never wait
for the same interpreter.

    recipe = EngineRecipe("smollm2-135m", backend="numba", max_slots=64)
    engine_process = EngineProcess(recipe)          # starts the process, waits for the engine
    app = build_app(engine_process.frontend, "smollm2", engine_loop=engine_process)

In one process the engine thread and the event loop take turns at Python's interpreter lock:
at 64 streaming clients the engine thread spends about 60 us of interpreter time per token and
the event loop about 12, so the server could never go faster than the engine's share of the
sum.  ``EngineProcess`` keeps the server's side of ``EngineLoop`` (``start``, ``submit``,
``cancel``, ``stats``, ``alive``, ``failure``, ``stop``) and moves everything behind it -- the
engine, its ``EngineLoop`` and each answer's stop rules and text -- into a child process
started with ``spawn`` (a CUDA context cannot cross a ``fork``).  vLLM's ``AsyncLLM`` splits
the same way, its ``EngineCore`` in a background process.

Two one-way pipes join them.  Commands go down (``submit`` with the job's prompt ids and
``SamplingParams``, ``cancel``, ``stop``); each step's events come up as one message (every
client's ``(job id, event)`` pairs and the loop's ``LoopStats``), which a reader thread in the
server's process turns into one ``deliver(calls)``, as the in-process loop does.  The events
are the in-process loop's (see ``engine_loop.py``).

What the server needs of the engine to parse and check a request (tokenizer, chat template,
vocabulary, ``Admission``'s limits) comes up once, when the engine is ready, as
``EngineFrontend``: the server admits and refuses requests without asking the child.  A JSON
grammar's logits processor crosses as its recipe (``structured_output.GrammarRecipe``) and is
built again against the child's tokenizer; any other logits processor must pickle (one that
pickles here but cannot be rebuilt there refuses its job with a ``("rejected", ...)`` event).

The child ignores Ctrl-C and SIGTERM (they reach the whole process group): the server decides
when it stops, drains, and then sends ``stop``.  If the server's process dies, the child reads
the end of its command pipe, cancels what runs and exits.  If the child dies, every job still
open gets an ``("error", ...)`` event and ``failure`` says how it ended.
"""

from __future__ import annotations

import itertools
import multiprocessing
import pickle
import signal
import threading
from dataclasses import dataclass, replace
from typing import Callable

from paged_tutorial.engine.sampling_params import SamplingParams
from paged_tutorial.serving.engine_loop import EngineLoop, LoopStats, call_each
from paged_tutorial.serving.structured_output import GrammarRecipe, JSONLogitsProcessor

#: how often the child, waiting for a command, looks whether its engine thread has failed and
#: sends the loop's statistics if they changed without an event (a request queued, a slot freed)
POLL_S = 0.1


@dataclass(frozen=True)
class EngineRecipe:
    """How the child builds its engine: ``load_model(model, dtype=dtype)`` and ``Engine(...)``
    with these settings, then a warm-up that captures the decode graph of every batch size
    (what ``paged-tutorial serve`` does, in either process).  ``threads``: torch's CPU threads in the child (``configure_threads``)."""
    model: str
    backend: str = "auto"
    dtype: str | None = None
    max_slots: int = 8
    max_seq_len: int | None = None
    prefix_caching: bool = False
    kv_cache_bytes: int | None = None
    threads: int | None = None
    async_scheduling: bool | None = None
    warm_up: bool = True

    def build(self):
        from paged_tutorial.engine.llm_engine import Engine
        from paged_tutorial.loading.models import load_model
        from paged_tutorial.threads import configure_threads

        configure_threads(self.threads)
        engine = Engine(load_model(self.model, dtype=self.dtype), backend=self.backend,
                        max_slots=self.max_slots, max_seq_len=self.max_seq_len,
                        prefix_caching=self.prefix_caching, kv_cache_bytes=self.kv_cache_bytes,
                        async_scheduling=self.async_scheduling)
        if self.warm_up:
            engine.warm_up(every_batch_size=True)
        return engine


class EngineFrontend:
    """What the server's process knows of an engine in another process: enough to encode,
    check and describe requests (the attributes ``openai_protocol`` and ``prompts`` read of an
    ``Engine``)."""

    def __init__(self, engine):
        self.tokenizer = engine.tokenizer
        self.config = engine.config
        self.eos_token_ids = engine.eos_token_ids
        self.admission = engine.admission
        self.max_seq_len = engine.max_seq_len
        self.prefix_caching = engine.prefix_caching
        self.description = engine.describe()

    def encode_prompt(self, prompt, chat: bool = True) -> list[int]:
        return self.admission.encode(prompt, chat=chat)

    def describe(self) -> str:
        return self.description


# --- what crosses the pipes ----------------------------------------------------------------
def portable_params(params: SamplingParams) -> tuple[SamplingParams, list | None]:
    """``params`` as it can cross to the child: the params without their logits processors,
    and the processors with a JSON grammar's as its recipe."""
    processors = params.logits_processors
    if not processors:
        return params, None
    return replace(params, logits_processors=None), [
        p.recipe() if isinstance(p, JSONLogitsProcessor) else p for p in processors]


def rebuilt_params(params: SamplingParams, processors: list | None, engine) -> SamplingParams:
    """In the child: the params with their processors, each grammar recipe built again
    against the engine's tokenizer."""
    if not processors:
        return params
    return replace(params, logits_processors=[
        p.processor(engine.tokenizer, engine.config.vocab_size)
        if isinstance(p, GrammarRecipe) else p for p in processors])


def portable_exception(exc: BaseException) -> BaseException:
    """``exc`` if it pickles (the server shows its type and words), else a RuntimeError
    carrying both."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:                            # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(exc).__name__}: {exc}")


# --- the child ----------------------------------------------------------------------------
@dataclass
class RemoteJob:
    """The server's side of one job in the child: whose events are whose, and how many of its
    answers are still to finish."""
    job_id: int
    on_event: Callable[[tuple], None]
    answers_left: int
    cancelled: bool = False


def ended_by(job, event: tuple) -> bool:
    """Whether ``event`` ends ``job`` (a ``RemoteJob`` or the child's ``_ChildJob``): its last
    answer finished, or it was refused or failed.  Counts the finished answers down."""
    if event[0] == "finish":
        job.answers_left -= 1
        return job.answers_left == 0
    return event[0] in ("rejected", "error")


class _ChildJob:
    """The child's side of one job: called with its events by the loop, it knows whose they
    are and when the job has ended (its n answers finished, or it was refused)."""

    def __init__(self, job_id: int, answers: int):
        self.job_id = job_id
        self.answers_left = answers
        self.job = None                          # the child loop's Job, once submitted

    def __call__(self, event: tuple) -> None:    # never called: ``deliver`` reads the pairs
        raise AssertionError("the child's events are delivered in batches")


def _child_main(recipe: EngineRecipe, commands, events) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        engine = recipe.build()
        loop = EngineLoop(engine)
    except BaseException as exc:                 # noqa: BLE001 - reported to the server
        events.send(("failed", portable_exception(exc)))
        return
    send_lock = threading.Lock()
    jobs: dict[int, _ChildJob] = {}
    sent = [loop.stats()]

    def send(message) -> None:
        with send_lock:
            events.send(message)

    def deliver(calls: list) -> None:            # in the child's engine thread, once per step
        pairs = []
        for child_job, event in calls:
            pairs.append((child_job.job_id, event))
            if ended_by(child_job, event):
                jobs.pop(child_job.job_id, None)
        stats = sent[0] = loop.stats()
        send(("events", pairs, stats))

    send(("ready", EngineFrontend(engine), loop.stats()))
    loop.start(deliver)
    try:
        while loop.alive:
            if not commands.poll(POLL_S):
                stats = loop.stats()
                if stats is not sent[0]:
                    sent[0] = stats
                    send(("stats", stats))
                continue
            message = commands.recv()
            if message[0] == "submit":
                _, job_id, prompt_ids, params, processors = message
                child_job = _ChildJob(job_id, params.n)
                jobs[job_id] = child_job
                try:
                    processors = None if processors is None else pickle.loads(processors)
                    child_job.job = loop.submit(prompt_ids,
                                                rebuilt_params(params, processors, engine),
                                                child_job)
                except Exception as exc:         # noqa: BLE001 - this job's own fault
                    jobs.pop(job_id, None)
                    send(("events", [(job_id, ("rejected", f"its logits processors cannot "
                                               f"be used in the engine's process: "
                                               f"{type(exc).__name__}: {exc}"))], loop.stats()))
            elif message[0] == "cancel":
                child_job = jobs.get(message[1])
                if child_job is not None and child_job.job is not None:
                    loop.cancel(child_job.job)
            else:                                # "stop": serve what is queued, then end
                break
    except (EOFError, OSError):                  # the server's process has gone
        for child_job in list(jobs.values()):
            loop.cancel(child_job.job)
    loop.stop()
    failure = loop.failure
    try:
        send(("stopped", None if failure is None else portable_exception(failure)))
    except OSError:                              # nobody is reading any more
        pass


# --- the server's side ----------------------------------------------------------------------
class EngineProcess:
    """An ``EngineLoop`` whose engine runs in a child process (see the module's docstring).
    The constructor returns once the child has built and warmed up its engine, or raises what
    stopped it (the model not found, a bad setting)."""

    def __init__(self, recipe: EngineRecipe, start_timeout_s: float | None = None):
        context = multiprocessing.get_context("spawn")
        commands_in, self._commands = context.Pipe(duplex=False)
        self._events, events_out = context.Pipe(duplex=False)
        self._process = context.Process(target=_child_main, args=(recipe, commands_in,
                                                                  events_out),
                                        name="engine-core", daemon=True)
        self._process.start()
        commands_in.close()
        events_out.close()
        if not self._events.poll(start_timeout_s):
            self._process.kill()
            raise RuntimeError(f"the engine process was not ready within {start_timeout_s} s")
        try:
            message = self._events.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(f"the engine process ended before its engine was ready (exit "
                               f"code {self._process.exitcode})") from None
        if message[0] == "failed":
            self._process.join()
            raise message[1]
        _, self.frontend, self._stats = message
        self._send_lock = threading.Lock()
        self._jobs: dict[int, RemoteJob] = {}
        self._ids = itertools.count()
        self._stopping = threading.Event()
        self._deliver: Callable[[list], None] = call_each
        self.failure: BaseException | None = None
        self._reader = threading.Thread(target=self._read, name="engine-events", daemon=True)

    # --- EngineLoop's interface ------------------------------------------------------------
    def start(self, deliver: Callable[[list], None] | None = None) -> None:
        """Start reading the child's events; ``deliver(calls)`` (called in the reader thread,
        once per engine step) decides where the ``on_event`` calls run."""
        if deliver is not None:
            self._deliver = deliver
        self._reader.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams,
               on_event: Callable[[tuple], None]) -> RemoteJob:
        if self._stopping.is_set() or self.failure is not None:
            raise RuntimeError("the server is shutting down")
        job = RemoteJob(next(self._ids), on_event, params.n)
        params, processors = portable_params(params)
        # the processors travel pickled on their own, so that one the child cannot unpickle
        # refuses this job there instead of ending the child
        message = ("submit", job.job_id, list(prompt_ids), params,
                   None if processors is None else pickle.dumps(processors))
        self._jobs[job.job_id] = job
        try:
            self._send(message)
        except OSError as exc:                   # the child has gone; the reader will say so
            self._jobs.pop(job.job_id, None)
            raise RuntimeError(f"the engine process has stopped ({exc})") from None
        except BaseException:
            self._jobs.pop(job.job_id, None)
            raise
        return job

    def cancel(self, job: RemoteJob) -> None:
        if job.job_id in self._jobs and not job.cancelled:
            job.cancelled = True
            try:
                self._send(("cancel", job.job_id))
            except (OSError, ValueError):        # the child has gone: nothing runs any more
                pass

    def stats(self) -> LoopStats:
        return self._stats

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.is_alive() and self.failure is None

    def stop(self, timeout: float | None = None) -> None:
        """Serve what is queued and running to the end, then end the child."""
        self._stopping.set()
        try:
            self._send(("stop",))
        except (OSError, ValueError):
            pass
        if self._reader.is_alive():
            self._reader.join(timeout)
        else:                                    # never started: wait for the child here
            self._drain_until_stopped(timeout)
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._commands.close()

    # --- the reader thread -------------------------------------------------------------------
    def _send(self, message) -> None:
        with self._send_lock:
            self._commands.send(message)

    def _read(self) -> None:
        self._drain_until_stopped(None)

    def _drain_until_stopped(self, timeout: float | None) -> None:
        while True:
            if timeout is not None and not self._events.poll(timeout):
                return
            try:
                message = self._events.recv()
            except (EOFError, OSError):
                self._child_died()
                return
            kind = message[0]
            if kind == "events":
                self._stats = message[2]
                self._deliver_events(message[1])
            elif kind == "stats":
                self._stats = message[1]
            else:                                # "stopped"
                if message[1] is not None:
                    self.failure = message[1]
                    self._fail_open_jobs(f"the engine failed: {type(message[1]).__name__}: "
                                         f"{message[1]}")
                return

    def _deliver_events(self, pairs: list) -> None:
        calls = []
        for job_id, event in pairs:
            job = self._jobs.get(job_id)
            if job is None:
                continue
            calls.append((job.on_event, event))
            if ended_by(job, event):
                del self._jobs[job_id]
        if calls:
            self._deliver(calls)

    def _child_died(self) -> None:
        self._process.join(1.0)
        self.failure = RuntimeError(f"the engine process ended unexpectedly (exit code "
                                    f"{self._process.exitcode})")
        self._fail_open_jobs(f"the engine failed: {self.failure}")

    def _fail_open_jobs(self, message: str) -> None:
        jobs, self._jobs = list(self._jobs.values()), {}
        calls = [(job.on_event, ("error", message)) for job in jobs]
        if calls:
            self._deliver(calls)
