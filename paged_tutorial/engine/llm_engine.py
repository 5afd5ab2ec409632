"""Engine: the frontend that serves callers, around the loop of ``engine_core.py``.

    add_request -> EngineCore.add_request -> EngineCore.step (schedule, run, commit) -> callbacks

``generate`` and ``stream`` are the one-call APIs; ``add_request`` / ``step`` / ``cancel``
expose the loop underneath for notebooks and tests that watch the cache change step by step.
The Engine puts together the pieces (``engine_parts.py``), one job per file: ``admission.py``
(what a caller submits, checked and encoded), ``request_registry.py`` (requests held until
their result is taken), ``engine_core.py`` (the step: schedule, run, commit),
``step_transaction.py`` (its guards: the lock, Ctrl-C, rollback, timings),
``output_processor.py`` (text pieces and on_token callbacks) and ``token_stream.py``.

What the engine guarantees, whatever happens mid-run:

- **A step commits or rolls back.**  If the model runner fails (an exception, Ctrl-C), every
  request of that step is preempted (blocks freed, recomputed later with the same tokens) and
  the exception propagates; tokens are appended only after a step fully succeeded.
- **A call cleans up after itself.**  If anything raises while ``generate`` or a ``stream``
  runs (a callback, Ctrl-C, the model), the requests that call submitted are cancelled, their
  blocks go back to ``free_blocks``, and the exception is re-raised.  Closing or abandoning a
  stream cancels its request.  No other request's tokens change.
- **Ctrl-C at any instant.**  The bookkeeping between model runs (admission, preemption,
  commit, rollback, cancel, release) runs as critical sections (``interrupts.py``): a signal
  arriving in one is handled as soon as it ends, so an interrupt never leaves a slot half
  released; the forward pass and the callbacks stay interruptible at once.
- **Callbacks run after the step is committed.**  An exception in a request's ``on_token``
  (``KeyboardInterrupt`` included) cancels that request and is re-raised by the call that
  submitted it, in its own thread, whichever thread ran the step.  Calling
  ``step``/``run_until_done``/``generate``/``stream`` from inside a callback (``on_token``,
  ``on_step``) raises a RuntimeError naming the call; ``cancel`` and ``add_request`` are
  allowed there.
- **Validated at the edge.**  Every argument of ``add_request``/``generate``/``stream`` is
  checked before anything is queued (``Admission.request``; a refusal is an
  ``AdmissionError`` naming the field and the fix, a prompt too long for ``max_seq_len``
  included).  A request that still cannot go on for a reason of its
  own (``RequestError``: its random stream or its detokenizer fails) is finished with
  ``finish_reason "error"`` and the others are served.
- **Numerical faults are named.**  A request whose row of logits holds a NaN or an inf is
  finished with ``finish_reason "non_finite"`` (that token is not appended) and ``error``
  names the first layer where its activations went non-finite (``numerical_faults.py``); the
  others are served.
- **Bounded memory.**  The engine keeps a request until its result is taken (``generate``
  and streams take theirs; with ``add_request``, ``pop_result``); a stream dropped
  unfinished is cancelled and forgotten.
- **Prefix caching** (``prefix_caching=True``, ``prefix_cache.py``): requests whose prompts
  begin with the same full blocks share those blocks' K/V instead of computing them again,
  and the blocks stay cached after their last user finishes; ``GenerationResult.
  num_cached_tokens`` says how many prompt tokens were found.  Tokens are the same as without.
- **Threads.**  An Engine may be shared by threads: steps are serialized by a lock, so
  ``generate``/``stream`` from several threads run their requests together (continuous
  batching across callers), each call returning when its own requests are done, with the
  tokens each would get alone.  ``cancel`` from any thread is applied between steps.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from paged_tutorial.backends.base import Backend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig
from paged_tutorial.engine.admission import check_chat, check_on_step, check_on_token, \
    sampling_params
from paged_tutorial.engine.engine_core import StepReport
from paged_tutorial.engine.engine_parts import EngineParts, default_kv_cache_bytes
from paged_tutorial.engine.interrupts import SIGNALS
from paged_tutorial.engine.request import Request
from paged_tutorial.engine.request_registry import GenerationResult
from paged_tutorial.engine.sampling_params import SamplingParams, draw_seed, is_integer
from paged_tutorial.engine.token_stream import TokenStream
from paged_tutorial.loading.models import Model

__all__ = ["Engine", "GenerationResult", "StepReport", "TokenStream", "default_kv_cache_bytes"]


class Engine:
    def __init__(self, model: Model, backend: str | Backend = "auto", block_size: int = 16,
                 kv_cache_bytes: int | None = None, max_slots: int = 2,
                 max_seq_len: int | None = None, device: str | None = None,
                 debug: bool | None = None, cuda_graphs: bool | None = None,
                 allow_beyond_max_positions: bool = False, prefix_caching: bool = False,
                 cache_factory: Callable[[CacheConfig, torch.device], PagedKVCache]
                 | None = None, async_scheduling: bool | None = None):
        """``prefix_caching``: requests whose prompts begin with the same full blocks share
        those blocks (``prefix_cache.PrefixCachingKVCache``).  ``async_scheduling``: launch
        each decode step before the previous one is read back, so that the device does not
        wait for the host between steps (``engine_core.py``); the tokens are the same.  None
        (the default): on where decode steps replay CUDA graphs, off elsewhere.  ``cache_factory(cache_config,
        device)`` builds the paged cache instead (one with other allocation rules: the puzzles
        of chapters 06 and 09); with ``prefix_caching=True`` its allocator must be a
        ``PrefixCache``.  The parts and their checks: ``engine_parts.py``."""
        parts = EngineParts.build(model, backend, block_size, kv_cache_bytes, max_slots,
                                  max_seq_len, device, debug, cuda_graphs,
                                  allow_beyond_max_positions, prefix_caching, cache_factory,
                                  async_scheduling)
        vars(self).update(vars(parts))        # config, backend, cache, scheduler, core, ...
        self.lock = self.transaction.lock

    # --- description -----------------------------------------------------------------------
    @property
    def step_count(self) -> int:
        """Steps completed (notebooks and figures read it)."""
        return self.core.step_count

    @property
    def record_logits(self) -> bool:
        """Keep each step's logits (float32, on the CPU) in its StepReport."""
        return self.core.record_logits

    @record_logits.setter
    def record_logits(self, keep: bool) -> None:
        self.core.record_logits = bool(keep)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The ids that end a request (config + generation config + tokenizer, merged once
        at load)."""
        return self.scheduler.eos_token_ids

    @property
    def kv_cache_bytes(self) -> int:
        return self.cache_config.cache_bytes_used

    def describe(self) -> str:
        c = self.cache_config
        return (f"backend {self.backend.describe()}, {self.model.dtype}; KV cache "
                f"{c.cache_bytes_used / 2**20:.1f} MiB = {c.NUM_BLOCKS} blocks x {c.BLOCK_BYTES} B "
                f"(BLOCK_SIZE {c.BLOCK_SIZE}, KV_DIM {c.KV_DIM}, V_OFFSET {c.V_OFFSET}); "
                f"{self.max_slots} slots, max_seq_len {self.max_seq_len}"
                + ("; prefix caching on" if self.prefix_caching else ""))

    # --- requests ----------------------------------------------------------------------------
    def encode_prompt(self, prompt, chat: bool = True) -> list[int]:
        """A string (chat-templated unless chat=False) or token ids -> a list of token ids
        (``Admission.encode``: integer ids only, inside the vocabulary)."""
        return self.admission.encode(prompt, chat=chat)

    def add_request(self, prompt, params: SamplingParams | None = None, *,
                    max_tokens: int | None = None, temperature: float | None = None,
                    top_p: float | None = None, seed: int | None = None, chat: bool = True,
                    on_token: Callable | None = None, sample_key: int | None = None) -> Request:
        """Validate and queue one request; returns its Request (``request_id`` names it).
        Its sampling stream is keyed by (seed, sample_key), sample_key defaulting to the id;
        ``on_token(request_id, token_id, text_piece)`` is called for each token."""
        params = sampling_params(params, dict(max_tokens=max_tokens, temperature=temperature,
                                              top_p=top_p, seed=seed)).with_seed()
        request = self.admission.request(prompt, params, self.requests.new_id(), chat=chat,
                                         on_token=on_token, sample_key=sample_key)
        with self.lock.state("add_request"):
            self.requests.add(request)
            self.core.add_request(request)
        return request

    def cancel(self, request_id: int, *, forget: bool = False) -> None:
        """Stop a request now (between steps, if another thread is running one); a running
        request gives its blocks back at once.  Cancelling a finished request does nothing.
        ``forget=True``: the engine forgets the request too, as ``pop_result`` would, for a
        caller that wants no result (a stream closed unfinished).  Called inside a step on its
        own thread (a cache listener, a stream collected there), the cancel waits for the
        next step."""
        self.transaction.cancel(self.requests.get(request_id), forget)

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    def warm_up(self, every_batch_size: bool = False) -> None:
        """Serve one two-token prompt (a prefill and a decode step) and forget it, so that the
        first real request finds the kernels it needs compiled (or loaded from the disk
        cache) and, with CUDA graphs, the batch-1 decode graph captured; with
        ``every_batch_size``, the decode graph of every batch-size bucket (what a server wants
        before its first clients arrive; ``serve`` does it).  Call it before any request is
        queued; ``step_count`` counts its two steps."""
        if self.has_unfinished():
            raise RuntimeError("warm_up() runs before any request: this engine has requests "
                               "queued or running")
        request = self.add_request([1, 2], SamplingParams(max_tokens=2, ignore_eos=True),
                                   chat=False)
        graphs = self.model_runner.graphs
        while not request.finished:
            if every_batch_size and graphs is not None and request.output_ids:
                graphs.capture_every_bucket_next_step()       # the decode step captures them
            self.step()
        self.requests.forget([request])
        if graphs is not None:
            graphs.capture_every_bucket = False

    def step(self) -> StepReport:
        """Admit what fits and prefill it; otherwise decode every running request
        (``EngineCore.step`` inside a ``StepTransaction``).  The on_token callbacks of the
        step run after its commit."""
        return self.transaction.step()

    # --- results ---------------------------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        """Requests the engine holds: waiting, running, or finished with their result not
        taken yet (``pop_result``)."""
        return len(self.requests)

    def request_ids(self) -> list[int]:
        """The ids of the requests the engine holds (``num_requests`` of them)."""
        return list(self.requests.requests)

    def pop_result(self, request_id: int) -> GenerationResult:
        """The result of a finished request, which the engine then forgets (its id is no
        longer known).  A long-lived engine fed by ``add_request`` calls this for each request
        once it has finished, so that memory stays bounded; ``generate`` and streams do it
        themselves."""
        return self.requests.pop_result(request_id)

    def result(self, request_id: int) -> GenerationResult:
        """The result of a request so far (finish_reason "running" while it runs)."""
        return self.requests.result(request_id)

    # --- the one-call APIs ---------------------------------------------------------------------
    def run_until_done(self, on_step: Callable[[StepReport], None] | None = None) -> None:
        """Step until no request is waiting or running."""
        self.lock.refuse_reentry("run_until_done")
        check_on_step(on_step)
        while self.has_unfinished():
            report = self.step()
            if on_step is not None:
                self.lock.call_on_step(on_step, report)

    def _run(self, requests: list[Request], on_step) -> None:
        """Step until ``requests`` are all finished (other requests advance with them); an
        on_token exception of theirs is re-raised here."""
        unfinished = 0                  # requests before this index have finished
        while True:
            for request in requests:
                if request.callback_error is not None:
                    raise request.callback_error
            while unfinished < len(requests) and requests[unfinished].finished:
                unfinished += 1
            if unfinished == len(requests):
                return
            report = self.step()
            if on_step is not None:
                self.lock.call_on_step(on_step, report)

    def generate(self, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams]
                 | None = None, *, max_tokens: int | None = None,
                 temperature: float | None = None, top_p: float | None = None,
                 seed: int | None = None, chat: bool = True, on_token: Callable | None = None,
                 on_step: Callable[[StepReport], None] | None = None) -> list[GenerationResult]:
        """Generate for every prompt (continuous batching over the engine's slots).

        ``params`` is one SamplingParams for all prompts or one per prompt; the sampling
        keywords are a shorter way to give one SamplingParams for all (not both).  With one seed for
        the call (drawn if None), request i samples from the stream keyed by (seed, i), so
        results do not depend on what else the engine serves.  ``on_token(i, token_id,
        text_piece)`` is called as each token is produced, i the prompt's index;
        ``on_step(report)`` after each step.  Results come back in prompt order."""
        self.lock.refuse_reentry("generate")
        check_chat(chat)
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or (
                prompts and is_integer(prompts[0])):
            raise TypeError("generate takes a list of prompts: wrap a single prompt in a list")
        keywords = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
        if isinstance(params, Sequence):
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
            if any(v is not None for v in keywords.values()):
                raise TypeError("pass either params= or the sampling keywords, not both")
            per_prompt = [sampling_params(p, {}) for p in params]
        else:
            per_prompt = [sampling_params(params, keywords)] * len(prompts)
        call_seed = draw_seed()
        check_on_token(on_token)
        check_on_step(on_step)
        # every request admitted before any is queued, so a bad prompt loses nothing
        requests = [self.admission.request(
            prompt, p.with_seed(call_seed), self.requests.new_id(), chat=chat, sample_key=i,
            on_token=None if on_token is None else
            (lambda i: lambda _rid, tok, piece: on_token(i, tok, piece))(i))
            for i, (prompt, p) in enumerate(zip(prompts, per_prompt))]
        # One critical section for the whole call (entered before anything is queued, so an
        # interrupt while it swaps the handlers finds nothing to undo), open while it steps:
        # the cleanup below then runs in nested sections, which cannot be cut at their start.
        with SIGNALS.critical():
            try:
                with self.lock.state("generate"):
                    for request in requests:
                        self.requests.add(request)
                        self.core.add_request(request)
                with SIGNALS.open():
                    self._run(requests, on_step)
                return [GenerationResult.of(r) for r in requests]
            except BaseException:
                self.transaction.cancel_all(requests)
                raise
            finally:
                self.requests.forget(requests)

    def stream(self, prompt, params: SamplingParams | None = None, *,
               max_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, seed: int | None = None,
               chat: bool = True) -> TokenStream:
        """Submit one prompt now and return a TokenStream that yields its text piece by piece
        (iterate it to run the engine).  A prompt that cannot be served raises here."""
        self.lock.refuse_reentry("stream")
        request = self.add_request(prompt, params, max_tokens=max_tokens,
                                   temperature=temperature, top_p=top_p, seed=seed, chat=chat)
        return TokenStream(self, request)
