"""Engine: requests in, tokens out -- a thin loop over the scheduler and the model runner.

    request -> Scheduler.schedule -> ModelRunner.run -> Scheduler.postprocess -> callbacks

``generate`` and ``stream`` are the one-call APIs; ``add_request`` / ``step`` / ``cancel``
expose the loop underneath for notebooks and tests that watch the cache change step by step.

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
  ``step``/``generate``/``stream`` from inside a callback (``on_token``, ``on_step``) raises a
  RuntimeError; ``cancel`` and ``add_request`` are allowed there.
- **Validated at the edge.**  Every argument of ``add_request``/``generate``/``stream`` is
  checked before anything is queued.  A request that still cannot go on for a reason of its
  own (``RequestError``: its random stream or its detokenizer fails) is finished with
  ``finish_reason "error"`` and the others are served.
- **Bounded memory.**  The engine keeps a request until its result is taken: ``generate`` and
  streams take theirs; with ``add_request``, ``pop_result(request_id)`` returns a finished
  request's result and forgets it (``result`` only reads).  A stream dropped unfinished is
  cancelled and forgotten.
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

import inspect
import itertools
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from paged_tutorial.backends import make_backend
from paged_tutorial.backends.base import Backend
from paged_tutorial.config import CPU_KV_CACHE_BYTES_DEFAULT, GPU_KV_CACHE_BYTES_DEFAULT, CacheConfig
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.engine.devices import check_device
from paged_tutorial.engine.interrupts import SIGNALS, from_signal
from paged_tutorial.engine.model_runner import ModelRunner
from paged_tutorial.loading.models import Model
from paged_tutorial.cache.prefix_cache import PrefixCache, PrefixCachingKVCache
from paged_tutorial.engine.request import Request, RequestError
from paged_tutorial.engine.sampling_params import SamplingParams, check_sample_key, draw_seed, \
    is_integer
from paged_tutorial.engine.scheduler import Scheduler


@dataclass
class GenerationResult:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]                 # generated ids only (an EOS that ended it included)
    text: str                            # exactly the concatenation of the streamed pieces
    finish_reason: str                   # eos | length | max_seq_len | prompt_too_long |
    #                                      cancelled | error (see ``error``)
    num_preemptions: int = 0
    seed: int | None = None
    time_to_first_token_s: float | None = None
    total_time_s: float | None = None
    decode_tokens_per_s: float | None = None
    num_cached_tokens: int = 0           # prompt tokens served from shared prefix blocks
    error: str | None = None             # what went wrong, when finish_reason is "error"


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


def default_kv_cache_bytes(cache_kwargs: dict, device: torch.device) -> int:
    """The article's 2 GiB on a GPU; on a CPU just what max_slots full-length sequences need,
    capped at 256 MiB."""
    if device.type == "cuda":
        return GPU_KV_CACHE_BYTES_DEFAULT
    probe = CacheConfig(**{**cache_kwargs, "kv_cache_bytes": 1 << 62})
    need = probe.block_table_entries * probe.BLOCK_BYTES
    return int(min(need, CPU_KV_CACHE_BYTES_DEFAULT))


def _positive_int(name: str, value) -> int:
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_chat(chat) -> None:
    if not isinstance(chat, bool):
        raise TypeError(f"chat must be True or False, got {chat!r}")


def _check_on_token(on_token) -> None:
    """on_token(index_or_id, token_id, text_piece): refuse what cannot be called that way now,
    rather than at the first token."""
    if on_token is None:
        return
    if not callable(on_token):
        raise TypeError(f"on_token must be callable, got {type(on_token).__name__}")
    try:
        inspect.signature(on_token).bind(0, 0, "")
    except TypeError as exc:
        raise TypeError(f"on_token is called as on_token(request, token_id, text_piece): "
                        f"{exc}") from None
    except ValueError:          # builtins without a signature: trust them
        pass


class TokenStream:
    """The text of one request, piece by piece, as the engine produces it.

    Iterating steps the engine (other requests in it advance too).  ``close()`` -- or leaving
    a ``for`` loop early and dropping the stream, or a ``with`` block -- cancels the request if
    it is still running and frees its blocks.  ``result`` is the GenerationResult once the
    request has ended; its ``text`` is exactly what was streamed."""

    def __init__(self, engine: "Engine", request: Request):
        self._engine = engine
        self._request = request
        self._cursor = 0
        self.result: GenerationResult | None = None
        if request.finished:
            self._end()

    @property
    def request_id(self) -> int:
        return self._request.request_id

    def __iter__(self) -> "TokenStream":
        return self

    def __next__(self) -> str:
        request = self._request
        while True:
            if self._cursor < len(request.text_pieces):
                piece = request.text_pieces[self._cursor]
                self._cursor += 1
                if piece:
                    return piece
                continue
            if request.finished:
                self._end()
                raise StopIteration
            try:
                self._engine.step()
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Cancel the request if it has not finished; keep the result (the engine forgets the
        request)."""
        if self.result is None:
            if not self._request.finished:
                self._engine._cancel(self._request, forget=True)
            if self._request.finished:
                self._end()

    def _end(self) -> None:
        if self.result is None:
            self.result = self._engine.result(self._request.request_id)
            self._engine._forget([self._request])

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:           # interpreter shutdown: nothing left to free
            pass


class Engine:
    def __init__(self, model: Model, backend: str | Backend = "auto", block_size: int = 16,
                 kv_cache_bytes: int | None = None, max_slots: int = 2,
                 max_seq_len: int | None = None, device: str | None = None,
                 debug: bool | None = None, cuda_graphs: bool | None = None,
                 allow_beyond_max_positions: bool = False, prefix_caching: bool = False,
                 cache_factory: Callable[[CacheConfig, torch.device], PagedKVCache]
                 | None = None):
        """``prefix_caching``: requests whose prompts begin with the same full blocks share
        those blocks (``prefix_cache.PrefixCachingKVCache``).  ``cache_factory(cache_config,
        device)`` builds the paged cache instead (one with other allocation rules: the puzzles
        of chapters 06 and 09); with ``prefix_caching=True`` its allocator must be a
        ``PrefixCache``."""
        if not isinstance(model, Model):
            raise TypeError(f"Engine needs a Model from paged_tutorial.load_model, "
                            f"got {type(model).__name__}")
        max_slots = _positive_int("max_slots", max_slots)
        block_size = _positive_int("block_size", block_size)
        positions = model.config.max_position_embeddings
        if max_seq_len is None:
            max_seq_len = min(2048, positions)
        max_seq_len = _positive_int("max_seq_len", max_seq_len)
        if max_seq_len > positions and not allow_beyond_max_positions:
            raise ValueError(
                f"max_seq_len={max_seq_len} exceeds the model's max_position_embeddings "
                f"({positions}): RoPE was trained only up to there.  Lower max_seq_len, or pass "
                f"allow_beyond_max_positions=True if you mean to go past it")
        if kv_cache_bytes is not None:
            kv_cache_bytes = _positive_int("kv_cache_bytes", kv_cache_bytes)
        if not isinstance(prefix_caching, bool):
            raise TypeError(f"prefix_caching must be True or False, got {prefix_caching!r}")
        check_device(device)
        self.config = model.config
        self.tokenizer = model.tokenizer
        self.backend = make_backend(backend, device, debug)
        cache_kwargs = dict(num_layers=self.config.num_hidden_layers,
                            num_kv_heads=self.config.num_key_value_heads,
                            head_dim=self.config.head_dim, dtype=model.dtype,
                            max_slots=max_slots, max_seq_len=max_seq_len, block_size=block_size)
        if kv_cache_bytes is None:
            kv_cache_bytes = default_kv_cache_bytes(cache_kwargs, self.backend.device)
        self.cache_config = CacheConfig(kv_cache_bytes=kv_cache_bytes, **cache_kwargs)
        # the weights once, on the backend's device (the caller's CPU copy, if any, is theirs)
        self.model = model.to(self.backend.device)
        # with prefix caching, full prompt blocks are shared between requests (prefix_cache.py)
        if cache_factory is None:
            cache_factory = PrefixCachingKVCache if prefix_caching else PagedKVCache
        self.cache = cache_factory(self.cache_config, self.backend.device)
        if not isinstance(self.cache, PagedKVCache) or self.cache.config != self.cache_config:
            raise TypeError("cache_factory(cache_config, device) must return a PagedKVCache "
                            "built from the cache_config it was given")
        if prefix_caching and not isinstance(self.cache.allocator, PrefixCache):
            raise TypeError("prefix_caching=True needs a cache whose allocator is a PrefixCache "
                            "(a PrefixCachingKVCache): the cache_factory built one with a "
                            + type(self.cache.allocator).__name__)
        self.prefix_caching = isinstance(self.cache.allocator, PrefixCache)
        self.scheduler = Scheduler(self.cache.allocator, max_slots, max_seq_len,
                                   eos_token_ids=self.config.eos_token_ids)
        # decode steps replay CUDA graphs (cuda_graphs.py): by default on a backend that can
        # be captured (numba, torch) on a GPU, without host-side input checks
        if cuda_graphs is None:
            cuda_graphs = (self.backend.graph_capturable and self.backend.device.type == "cuda"
                           and not self.backend.check_inputs)
        self.model_runner = ModelRunner(self.model, self.backend, self.cache, max_slots,
                                        max_seq_len, cuda_graphs=bool(cuda_graphs))
        self.max_slots, self.max_seq_len = max_slots, max_seq_len
        self.step_count = 0                  # steps completed (public: notebooks and viz)
        self.record_logits = False           # keep each step's logits in its StepReport
        self._requests: dict[int, Request] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()        # one step at a time
        self._owner: int | None = None       # thread holding the lock, while it does
        self._dispatching = False            # that thread is running on_token callbacks
        self._in_callback = threading.local()  # .depth > 0: this thread is in an on_step
        #: request id -> forget it too; cancels asked for mid-step, applied at the next one
        self._deferred_cancels: dict[int, bool] = {}

    # --- description -----------------------------------------------------------------------
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

    # --- locking ---------------------------------------------------------------------------
    def _refuse_reentry(self, what: str) -> None:
        if self._owner == threading.get_ident() or getattr(self._in_callback, "depth", 0):
            raise RuntimeError(
                f"engine.{what}() was called from inside a callback (on_token, on_step, or a "
                "cache listener) while this engine is running on the same thread.  Collect "
                "what you need in the callback and call it after generate()/the step returns; "
                "cancel() and add_request() are allowed inside callbacks")

    @contextmanager
    def _state_lock(self, what: str):
        """Hold the engine's state for a change, as a critical section: take the lock, or --
        on the thread running a step, while it runs callbacks -- go ahead (the step has
        committed)."""
        me = threading.get_ident()
        if self._owner == me:
            if not self._dispatching:
                raise RuntimeError(f"engine.{what}() cannot be called from a cache listener: "
                                   "listeners observe, they must not change the engine")
            with SIGNALS.critical():
                yield
            return
        with self._lock:
            try:
                self._owner = me
                with SIGNALS.critical():
                    yield
            finally:
                self._owner = None

    # --- requests ----------------------------------------------------------------------------
    def encode_prompt(self, prompt, chat: bool = True) -> list[int]:
        """A string (chat-templated unless chat=False) or token ids -> a list of token ids.

        Token ids must be integers: a list/tuple of ints (numpy integers are fine), or an
        integer numpy array or torch tensor.  Floats, strings and bools are refused rather
        than rounded."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("empty prompt: give some text or token ids")
            if self.tokenizer is None:
                raise ValueError(f"model {self.model.source!r} has no tokenizer files: pass "
                                 "prompts as lists of token ids")
            ids = self.tokenizer.apply_chat_template(prompt) if chat else \
                self.tokenizer.encode(prompt)
        elif isinstance(prompt, (np.ndarray, torch.Tensor)):
            if prompt.ndim != 1:
                raise ValueError(f"a token-id array must be 1-D, got shape {tuple(prompt.shape)}")
            kind = prompt.numpy().dtype.kind if isinstance(prompt, torch.Tensor) \
                and prompt.device.type == "cpu" else getattr(prompt.dtype, "kind", None)
            if isinstance(prompt, torch.Tensor):
                ok = not prompt.dtype.is_floating_point and not prompt.dtype.is_complex \
                    and prompt.dtype != torch.bool
            else:
                ok = kind in ("i", "u")
            if not ok:
                raise TypeError(f"token ids must be integers, got an array of {prompt.dtype}: "
                                "convert it with .astype(int) only if the values are ids")
            ids = [int(t) for t in prompt.tolist()]
        elif isinstance(prompt, (list, tuple)):
            bad = [(i, t) for i, t in enumerate(prompt) if not is_integer(t)]
            if bad:
                i, t = bad[0]
                raise TypeError(f"token ids must be integers; position {i} holds {t!r} "
                                f"({type(t).__name__})")
            ids = [int(t) for t in prompt]
        else:
            raise TypeError(f"a prompt is a string or a list of token ids, got "
                            f"{type(prompt).__name__}")
        if not ids:
            raise ValueError("empty prompt: a token-id list needs at least one id")
        vocab = self.config.vocab_size
        bad = [(i, t) for i, t in enumerate(ids) if not 0 <= t < vocab]
        if bad:
            i, t = bad[0]
            raise ValueError(f"token id {t} at position {i} is outside the vocabulary "
                             f"[0, {vocab}) ({len(bad)} bad id(s) in this prompt)")
        return ids

    def _check_fits(self, ids: list[int], params: SamplingParams) -> None:
        """Refuse a request that could not fit even in an empty cache."""
        if len(ids) >= self.max_seq_len:
            return                                   # finished at once: prompt_too_long
        worst = min(len(ids) + params.max_new_tokens, self.max_seq_len)
        blocks = self.cache_config.blocks_for_tokens(worst) * self.config.num_hidden_layers
        if blocks > self.cache_config.NUM_BLOCKS:
            raise ValueError(
                f"request needs up to {blocks} KV blocks ({worst} tokens x "
                f"{self.config.num_hidden_layers} layers) but the whole cache holds "
                f"{self.cache_config.NUM_BLOCKS}: raise kv_cache_bytes (now "
                f"{self.cache_config.kv_cache_bytes}) or lower max_new_tokens / the prompt")

    def _new_request(self, ids: list[int], params: SamplingParams, sample_key: int | None,
                     on_token: Callable | None) -> Request:
        request_id = next(self._ids)
        request = Request(request_id, ids, params,
                          sample_key=request_id if sample_key is None else sample_key,
                          on_token=on_token)
        if self.tokenizer is not None:
            request.detokenizer = self.tokenizer.stream()
        return request

    def _queue(self, request: Request) -> None:
        """Register and queue (caller holds the state lock)."""
        self._requests[request.request_id] = request
        if len(request.prompt_ids) >= self.max_seq_len:
            self.scheduler.finish(request, "prompt_too_long")
        elif request.params.max_new_tokens == 0:
            self.scheduler.finish(request, "length")
        else:
            self.scheduler.add(request)

    @staticmethod
    def _params(params: SamplingParams | None, keywords: dict) -> SamplingParams:
        """``params``, or a SamplingParams made of the sampling keywords given (not both)."""
        given = {k: v for k, v in keywords.items() if v is not None}
        if params is not None:
            if not isinstance(params, SamplingParams):
                raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
            if given:
                raise TypeError(f"pass either params= or {', '.join(sorted(given))}=, not both")
            return params
        return SamplingParams(**given)

    def add_request(self, prompt, params: SamplingParams | None = None, *,
                    max_new_tokens: int | None = None, temperature: float | None = None,
                    top_p: float | None = None, seed: int | None = None, chat: bool = True,
                    on_token: Callable | None = None, sample_key: int | None = None) -> Request:
        """Validate and queue one request; returns its Request (``request_id`` names it).
        Its sampling stream is keyed by (seed, sample_key), sample_key defaulting to the id;
        ``on_token(request_id, token_id, text_piece)`` is called for each token."""
        params = self._params(params, dict(max_new_tokens=max_new_tokens,
                                           temperature=temperature, top_p=top_p, seed=seed))
        params = params.with_seed()
        check_sample_key(sample_key)
        _check_chat(chat)
        _check_on_token(on_token)
        ids = self.encode_prompt(prompt, chat=chat)
        self._check_fits(ids, params)
        request = self._new_request(ids, params, sample_key, on_token)
        with self._state_lock("add_request"):
            self._queue(request)
        return request

    def cancel(self, request_id: int) -> None:
        """Stop a request now (between steps, if another thread is running one); a running
        request gives its blocks back at once.  Cancelling a finished request does nothing."""
        self._cancel(self._request(request_id), forget=False)

    def _cancel(self, request: Request, forget: bool) -> None:
        """Cancel a request.  Mid-step (a cache listener, or a stream garbage-collected while
        this thread holds the engine) the cancel waits for the next step, and ``forget``
        makes that step drop the request too (no stream is left to take its result)."""
        if self._owner == threading.get_ident() and not self._dispatching:
            self._deferred_cancels[request.request_id] = \
                forget or self._deferred_cancels.get(request.request_id, False)
            return
        with self._state_lock("cancel"):
            self.scheduler.finish(request, "cancelled")

    def _cancel_all(self, requests: list[Request]) -> None:
        """Cancel those of ``requests`` the engine still runs, in one critical section."""
        with self._state_lock("cancel"):
            for request in requests:
                if not request.finished and self._requests.get(request.request_id) is request:
                    self.scheduler.finish(request, "cancelled")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def warm_up(self) -> None:
        """Serve one two-token prompt (a prefill and a decode step) and forget it, so that the
        first real request finds the kernels it needs compiled (or loaded from the disk
        cache) and, with CUDA graphs, the batch-1 decode graph captured.  Call it before any
        request is queued; ``step_count`` counts its two steps."""
        if self.has_unfinished():
            raise RuntimeError("warm_up() runs before any request: this engine has requests "
                               "queued or running")
        request = self.add_request([1, 2], SamplingParams(max_new_tokens=2, ignore_eos=True),
                                   chat=False)
        while not request.finished:
            self.step()
        self._forget([request])

    # --- one step ------------------------------------------------------------------------------
    def step(self) -> StepReport:
        """Admit what fits and prefill it; otherwise decode every running request."""
        self._refuse_reentry("step")
        with self._lock:
            try:
                self._owner = threading.get_ident()
                return self._step()
            finally:
                self._owner = None
                self._dispatching = False

    def _step(self) -> StepReport:
        """One step, as one critical section (``interrupts.py``) opened for the model run (an
        interrupt there rolls the batch back) and for the callbacks, after the commit."""
        t0 = time.perf_counter()
        token_ids: list[int] = []
        phases = {}
        with SIGNALS.critical():
            self._apply_deferred_cancels()
            try:
                batch = self.scheduler.schedule()
            except BaseException:            # a cache listener raised: undo the admissions
                self.scheduler.abort_schedule()
                raise
            phases["schedule"] = time.perf_counter() - t0
            if batch is None:
                report = StepReport(self.step_count, "idle", [], [], 0)
            else:
                report = StepReport(self.step_count, batch.kind,
                                    [r.request_id for r in batch.requests],
                                    [r.slot for r in batch.requests], batch.num_tokens,
                                    preempted=[r.request_id for r in batch.preempted])
            if batch is not None and batch.requests:
                try:
                    with SIGNALS.open():
                        self.backend.begin_step(self.step_count)
                        token_ids, logits = self.model_runner.run(batch)
                except RequestError as failure:     # one request's own fault: drop it alone
                    with SIGNALS.critical():
                        self.scheduler.rollback(batch, count=False)
                        self._fail(failure.request, str(failure))
                    report.finished = [failure.request.request_id]
                except BaseException:
                    with SIGNALS.critical():
                        self.scheduler.rollback(batch)
                    raise
                else:
                    phases.update(self.model_runner.phase_seconds)
                    t_post = time.perf_counter()
                    self.scheduler.postprocess(batch, token_ids)
                    self._detokenize(batch.requests, token_ids)
                    phases["postprocess"] = time.perf_counter() - t_post
                    report.finished = [r.request_id for r in batch.requests if r.finished]
                    report.new_tokens = {r.request_id: t
                                         for r, t in zip(batch.requests, token_ids)}
                    if self.record_logits:
                        report.logits = logits.detach().float().cpu()
            self.step_count += 1
            t_release = time.perf_counter()
            self.scheduler.release_retired()   # last: a raising cache listener finds all done
            phases["release"] = time.perf_counter() - t_release
            report.num_free_blocks = self.cache.num_free
            report.num_evictable_blocks = self.cache.num_evictable_blocks
            report.phase_seconds = phases
            report.seconds = time.perf_counter() - t0
            if token_ids:
                with SIGNALS.open():
                    self._dispatch(batch.requests, token_ids)
        return report

    def _apply_deferred_cancels(self) -> None:
        pending, self._deferred_cancels = self._deferred_cancels, {}
        for request_id, forget in sorted(pending.items()):
            request = self._requests.get(request_id)
            if request is not None:
                self.scheduler.finish(request, "cancelled")
                if forget:
                    self._requests.pop(request_id, None)

    def _fail(self, request: Request, message: str) -> None:
        """Finish one request with finish_reason "error" (the others go on)."""
        if not request.finished:
            request.error = message
            self.scheduler.finish(request, "error")

    def _detokenize(self, requests: list[Request], token_ids: list[int]) -> None:
        """Append each new token's text piece; a finished request's last piece also carries
        whatever bytes the incremental detokenizer still held (so the pieces add up to
        ``tokenizer.decode(output_ids)``)."""
        for request, token in zip(requests, token_ids):
            if request.detokenizer is None:
                request.text_pieces.append("")
                continue
            try:
                piece = request.detokenizer.step(int(token))
                if request.finished:
                    emitted = request.text + piece
                    full = self.tokenizer.decode(request.output_ids)
                    if full.startswith(emitted):
                        piece += full[len(emitted):]
            except Exception as exc:             # noqa: BLE001 - this request's own fault
                request.text_pieces.append("")
                self._fail(request, str(RequestError(request, exc)))
                continue
            request.text_pieces.append(piece)

    def _dispatch(self, requests: list[Request], token_ids: list[int]) -> None:
        """Run on_token callbacks after the step has committed.  A callback's exception
        (KeyboardInterrupt included: it was raised by that caller's code) cancels its
        request and is kept for the call that submitted it to re-raise, in its own thread."""
        self._dispatching = True
        try:
            for request, token in zip(requests, token_ids):
                if request.on_token is None or request.callback_error is not None:
                    continue
                try:
                    request.on_token(request.request_id, int(token), request.text_pieces[-1])
                except BaseException as exc:      # noqa: BLE001 - handed to the caller
                    if from_signal(exc):              # Ctrl-C: the stepping thread's
                        raise
                    request.callback_error = exc
                    with SIGNALS.critical():
                        self.scheduler.finish(request, "cancelled")
        finally:
            self._dispatching = False

    # --- results ---------------------------------------------------------------------------------
    def _request(self, request_id: int) -> Request:
        request = self._requests.get(request_id) if is_integer(request_id) else None
        if request is None:
            raise ValueError(f"no request with id {request_id!r} here (ids are given by "
                             "add_request; generate() and finished streams forget theirs)")
        return request

    def _forget(self, requests: list[Request]) -> None:
        with SIGNALS.critical():
            for request in requests:
                self._requests.pop(request.request_id, None)

    @property
    def num_requests(self) -> int:
        """Requests the engine holds: waiting, running, or finished with their result not
        taken yet (``pop_result``)."""
        return len(self._requests)

    def pop_result(self, request_id: int) -> GenerationResult:
        """The result of a finished request, which the engine then forgets (its id is no
        longer known).  A long-lived engine fed by ``add_request`` calls this for each request
        once it has finished, so that memory stays bounded; ``generate`` and streams do it
        themselves."""
        request = self._request(request_id)
        if not request.finished:
            raise ValueError(f"request {request_id} is still {request.status.value}: step the "
                             "engine until it finishes, or cancel() it, before pop_result()")
        result = self.result(request_id)
        self._forget([request])
        return result

    def result(self, request_id: int) -> GenerationResult:
        """The result of a request so far (finish_reason "running" while it runs)."""
        r = self._request(request_id)
        decode_tps = None
        if r.first_token_time and r.finish_time and len(r.output_ids) > 1:
            span = r.finish_time - r.first_token_time
            decode_tps = (len(r.output_ids) - 1) / span if span > 0 else None
        return GenerationResult(
            request_id=r.request_id, prompt_token_ids=list(r.prompt_ids),
            token_ids=list(r.output_ids), text=r.text,
            finish_reason=r.finish_reason or "running", num_preemptions=r.num_preemptions,
            seed=r.params.seed,
            time_to_first_token_s=(r.first_token_time - r.arrival_time)
            if r.first_token_time else None,
            total_time_s=(r.finish_time - r.arrival_time) if r.finish_time else None,
            decode_tokens_per_s=decode_tps, num_cached_tokens=r.num_cached_tokens or 0,
            error=r.error)

    def run_until_done(self, on_step: Callable[[StepReport], None] | None = None) -> None:
        """Step until no request is waiting or running."""
        while self.scheduler.has_work():
            report = self.step()
            if on_step is not None:
                self._call_on_step(on_step, report)

    def _call_on_step(self, on_step, report: StepReport) -> None:
        """``on_step(report)``, with re-entry into the engine refused while it runs."""
        self._in_callback.depth = getattr(self._in_callback, "depth", 0) + 1
        try:
            on_step(report)
        finally:
            self._in_callback.depth -= 1

    def _run(self, requests: list[Request], on_step) -> None:
        """Step until ``requests`` are all finished (other requests advance with them); an
        on_token exception of theirs is re-raised here."""
        while True:
            for request in requests:
                if request.callback_error is not None:
                    raise request.callback_error
            if all(r.finished for r in requests):
                return
            report = self.step()
            if on_step is not None:
                self._call_on_step(on_step, report)

    def generate(self, prompts: Sequence, params: SamplingParams | Sequence[SamplingParams]
                 | None = None, *, max_new_tokens: int | None = None,
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
        self._refuse_reentry("generate")
        _check_chat(chat)
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or (
                prompts and is_integer(prompts[0])):
            raise TypeError("generate takes a list of prompts: wrap a single prompt in a list")
        if isinstance(params, Sequence):
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} SamplingParams for {len(prompts)} prompts")
            per_prompt = [self._params(p, {}) for p in params]
            if any(v is not None for v in (max_new_tokens, temperature, top_p, seed)):
                raise TypeError("pass either params= or the sampling keywords, not both")
        else:
            one = self._params(params, dict(max_new_tokens=max_new_tokens,
                                            temperature=temperature, top_p=top_p, seed=seed))
            per_prompt = [one] * len(prompts)
        call_seed = draw_seed()
        per_prompt = [p.with_seed(call_seed) for p in per_prompt]
        _check_on_token(on_token)
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be callable, got {type(on_step).__name__}")
        # validate everything before queueing anything, so a bad prompt loses nothing
        encoded = [self.encode_prompt(p, chat=chat) for p in prompts]
        for ids, p in zip(encoded, per_prompt):
            self._check_fits(ids, p)
        requests = []
        for i, (ids, p) in enumerate(zip(encoded, per_prompt)):
            callback = None
            if on_token is not None:
                callback = (lambda i: lambda _rid, tok, piece: on_token(i, tok, piece))(i)
            requests.append(self._new_request(ids, p, sample_key=i, on_token=callback))
        # One critical section for the whole call (entered before anything is queued, so an
        # interrupt while it swaps the handlers finds nothing to undo), open while it steps:
        # the cleanup below then runs in nested sections, which cannot be cut at their start.
        with SIGNALS.critical():
            try:
                with self._state_lock("generate"):
                    for request in requests:
                        self._queue(request)
                with SIGNALS.open():
                    self._run(requests, on_step)
                return [self.result(r.request_id) for r in requests]
            except BaseException:
                self._cancel_all(requests)
                raise
            finally:
                self._forget(requests)

    def stream(self, prompt, params: SamplingParams | None = None, *,
               max_new_tokens: int | None = None, temperature: float | None = None,
               top_p: float | None = None, seed: int | None = None,
               chat: bool = True) -> TokenStream:
        """Submit one prompt now and return a TokenStream that yields its text piece by piece
        (iterate it to run the engine).  A prompt that cannot be served raises here."""
        self._refuse_reentry("stream")
        request = self.add_request(prompt, params, max_new_tokens=max_new_tokens,
                                   temperature=temperature, top_p=top_p, seed=seed, chat=chat)
        if request.finish_reason == "prompt_too_long":
            self._forget([request])
            raise ValueError(f"the prompt has {len(request.prompt_ids)} tokens and max_seq_len "
                             f"is {self.max_seq_len}: there is no room for an answer.  Shorten "
                             f"the prompt or build the Engine with a larger max_seq_len")
        return TokenStream(self, request)

