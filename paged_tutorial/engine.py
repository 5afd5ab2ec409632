"""Engine: requests in, tokens out.  request -> scheduler -> engine step -> backend ops -> cache.

``Engine.generate`` is the one-call API; ``add_request`` / ``step`` / ``cancel`` expose the loop
underneath for notebooks and tests that watch the cache change step by step.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from .backends import make_backend
from .backends.base import Backend
from .config import (CPU_KV_CACHE_BYTES_DEFAULT, GPU_KV_CACHE_BYTES_DEFAULT, CacheConfig)
from .kv_cache import PagedKVCache
from .models import Model
from .runner import LlamaRunner
from .sampling import request_uniform, validate_sampling
from .scheduler import Request, Scheduler, Status


@dataclass
class GenerationResult:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]                 # generated ids only (an EOS that ended it included)
    text: str
    finish_reason: str                   # eos | length | max_seq_len | prompt_too_long | cancelled
    num_preemptions: int = 0
    seed: int | None = None
    time_to_first_token_s: float | None = None
    total_time_s: float | None = None
    decode_tokens_per_s: float | None = None


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
    seconds: float = 0.0
    logits: torch.Tensor | None = None   # float32 [rows, vocab], kept when engine.record_logits


def default_kv_cache_bytes(cache_kwargs: dict, device: torch.device) -> int:
    """The article's 2 GiB on a GPU; on a CPU just what max_slots full-length sequences need,
    capped at 256 MiB."""
    if device.type == "cuda":
        return GPU_KV_CACHE_BYTES_DEFAULT
    probe = CacheConfig(**{**cache_kwargs, "kv_cache_bytes": 1 << 62})
    need = probe.block_table_entries * probe.BLOCK_BYTES
    return int(min(need, CPU_KV_CACHE_BYTES_DEFAULT))


class Engine:
    def __init__(self, model: Model, backend: str | Backend = "auto", block_size: int = 16,
                 kv_cache_bytes: int | None = None, max_slots: int = 2,
                 max_seq_len: int = 2048, device: str | None = None, debug: bool | None = None,
                 cuda_graphs: bool | None = None):
        if not isinstance(model, Model):
            raise TypeError(f"Engine needs a Model from paged_tutorial.load_model, "
                            f"got {type(model).__name__}")
        if not isinstance(max_seq_len, int) or max_seq_len < 1:
            raise ValueError(f"max_seq_len must be a positive integer, got {max_seq_len!r}")
        self.model = model
        self.config = model.config
        self.tokenizer = model.tokenizer
        self.backend = make_backend(backend, device, debug)
        cache_kwargs = dict(num_layers=self.config.num_hidden_layers,
                            num_kv_heads=self.config.num_key_value_heads,
                            head_dim=self.config.head_dim, dtype=model.dtype,
                            max_slots=max_slots, max_seq_len=max_seq_len, block_size=block_size)
        if kv_cache_bytes is None:
            kv_cache_bytes = default_kv_cache_bytes(cache_kwargs, self.backend.device)
        self.cache_config = CacheConfig(kv_cache_bytes=int(kv_cache_bytes), **cache_kwargs)
        self.cache = PagedKVCache(self.cache_config, self.backend.device)
        self.runner = LlamaRunner(model, self.backend, max_positions=max_seq_len)
        self.scheduler = Scheduler(self.cache, max_slots)
        self.max_slots, self.max_seq_len = max_slots, max_seq_len
        self.eos_ids = set(self.config.eos_token_ids) | (
            set(self.tokenizer.eos_token_ids) if self.tokenizer is not None else set())
        self._requests: dict[int, Request] = {}
        self._next_id = 0
        self._step_index = 0
        self.record_logits = False           # keep each step's logits in its StepReport
        # decode steps replay CUDA graphs (cuda_graphs.py): by default on the numba GPU backend
        if cuda_graphs is None:
            cuda_graphs = self.backend.name == "numba" and not getattr(
                self.backend, "check_inputs", False)
        self.graphs = None
        if cuda_graphs:
            from .cuda_graphs import DecodeGraphs
            self.graphs = DecodeGraphs(self.runner, self.cache, max_slots)

    # --- description -----------------------------------------------------------------------
    @property
    def kv_cache_bytes(self) -> int:
        return self.cache_config.cache_bytes_used

    def describe(self) -> str:
        c = self.cache_config
        return (f"backend {self.backend.describe()}, {self.model.dtype}; KV cache "
                f"{c.cache_bytes_used / 2**20:.1f} MiB = {c.NUM_BLOCKS} blocks x {c.BLOCK_BYTES} B "
                f"(BLOCK_SIZE {c.BLOCK_SIZE}, KV_DIM {c.KV_DIM}, V_OFFSET {c.V_OFFSET}); "
                f"{self.max_slots} slots, max_seq_len {self.max_seq_len}")

    # --- requests ----------------------------------------------------------------------------
    def encode_prompt(self, prompt, chat: bool = True) -> list[int]:
        """A string (chat-templated unless chat=False) or a list of token ids -> token ids."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("empty prompt: give some text or token ids")
            if self.tokenizer is None:
                raise ValueError(f"model {self.model.source!r} has no tokenizer files: pass "
                                 "prompts as lists of token ids")
            ids = self.tokenizer.apply_chat_template(prompt) if chat else \
                self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray, torch.Tensor)):
            ids = [int(t) for t in (prompt.tolist() if hasattr(prompt, "tolist") else prompt)]
            if not ids:
                raise ValueError("empty prompt: a token-id list needs at least one id")
        else:
            raise TypeError(f"a prompt is a string or a list of token ids, got "
                            f"{type(prompt).__name__}")
        vocab = self.config.vocab_size
        bad = [(i, t) for i, t in enumerate(ids) if not 0 <= t < vocab]
        if bad:
            i, t = bad[0]
            raise ValueError(f"token id {t} at position {i} is outside the vocabulary "
                             f"[0, {vocab}) ({len(bad)} bad id(s) in this prompt)")
        return ids

    def add_request(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0,
                    top_p: float = 1.0, seed: int | None = None, chat: bool = True,
                    on_token: Callable | None = None, sample_key: int | None = None) -> Request:
        """Validate and queue one request; returns its Request (``request_id`` names it).
        Its sampling stream is keyed by (seed, sample_key), sample_key defaulting to the id."""
        if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        validate_sampling(temperature, top_p)
        ids = self.encode_prompt(prompt, chat=chat)
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        request = Request(self._next_id, ids, int(max_new_tokens), float(temperature),
                          float(top_p), int(seed), on_token=on_token,
                          sample_key=self._next_id if sample_key is None else int(sample_key))
        self._next_id += 1
        self._requests[request.request_id] = request
        if self.tokenizer is not None:
            request.detok = self.tokenizer.stream()
        if len(ids) >= self.max_seq_len:
            self.scheduler.finish(request, "prompt_too_long")
            return request
        if max_new_tokens == 0:
            self.scheduler.finish(request, "length")
            return request
        worst = min(len(ids) + int(max_new_tokens), self.max_seq_len)
        blocks = self.cache_config.blocks_for_tokens(worst) * self.config.num_hidden_layers
        if blocks > self.cache_config.NUM_BLOCKS:
            del self._requests[request.request_id]
            raise ValueError(
                f"request needs up to {blocks} KV blocks ({worst} tokens x "
                f"{self.config.num_hidden_layers} layers) but the whole cache holds "
                f"{self.cache_config.NUM_BLOCKS}: raise kv_cache_bytes (now "
                f"{self.cache_config.kv_cache_bytes}) or lower max_new_tokens / the prompt")
        self.scheduler.add(request)
        return request

    def cancel(self, request_id: int) -> None:
        """Stop a request now; a running one gives its blocks back at once."""
        request = self._request(request_id)
        if request.status is not Status.FINISHED:
            self.scheduler.finish(request, "cancelled")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # --- one step ------------------------------------------------------------------------------
    def step(self) -> StepReport:
        """Admit what fits and prefill it; otherwise decode every running request."""
        t0 = time.perf_counter()
        index, self._step_index = self._step_index, self._step_index + 1
        admitted = self.scheduler.admit()
        if admitted:
            report = self._prefill(index, admitted)
        elif self.scheduler.running:
            report = self._decode(index)
        else:
            report = StepReport(index, "idle", [], [], 0)
        report.num_free_blocks = self.cache.num_free
        report.seconds = time.perf_counter() - t0
        return report

    def _device_ints(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(self.backend.device)

    def _prefill(self, index: int, requests: list[Request]) -> StepReport:
        tokens, positions, slots, cu, last_rows = [], [], [], [0], []
        for r in requests:
            ids = r.all_ids                  # a recomputed request replays what it generated
            tokens += ids
            positions += range(len(ids))
            slots += [r.slot] * len(ids)
            cu.append(cu[-1] + len(ids))
            last_rows.append(cu[-1] - 1)
        block_table = self.cache.device_block_table()
        logits = self.runner.forward(
            self._device_ints(tokens), self._device_ints(positions), self._device_ints(slots),
            self.cache, block_table, prefill_cu_seqlens=cu,
            logit_rows=torch.tensor(last_rows, device=self.backend.device))
        for r in requests:
            r.num_cached = r.total_len
        report = StepReport(index, "prefill", [r.request_id for r in requests],
                            [r.slot for r in requests], len(tokens))
        self._sample_and_advance(requests, logits, report)
        return report

    def _decode(self, index: int) -> StepReport:
        preempted = self.scheduler.reserve_decode_blocks()
        requests = list(self.scheduler.running)
        report = StepReport(index, "decode", [r.request_id for r in requests],
                            [r.slot for r in requests], len(requests),
                            preempted=[r.request_id for r in preempted])
        if not requests:
            return report
        positions = [r.num_cached for r in requests]
        next_ids = None
        if self.graphs is not None:
            logits, next_ids = self.graphs.run(
                [r.output_ids[-1] for r in requests], positions, [r.slot for r in requests],
                *self._sampling_inputs(requests))
        else:
            block_table = self.cache.device_block_table()
            logits = self.runner.forward(
                self._device_ints([r.output_ids[-1] for r in requests]),
                self._device_ints(positions), self._device_ints([r.slot for r in requests]),
                self.cache, block_table,
                decode_seq_lens=self._device_ints([p + 1 for p in positions]))
        for r in requests:
            r.num_cached += 1
        self._sample_and_advance(requests, logits, report, next_ids)
        return report

    @staticmethod
    def _sampling_inputs(requests: list[Request]):
        """Host lists (temperature, top_p, uniform) per request; greedy requests never use
        their uniform, so it is not drawn for them."""
        return ([r.temperature for r in requests], [r.top_p for r in requests],
                [request_uniform(r.seed, r.sample_key, len(r.output_ids))
                 if r.temperature > 0 else 0.0 for r in requests])

    def _sample_and_advance(self, requests: list[Request], logits, report: StepReport,
                            next_ids: list[int] | None = None) -> None:
        dev = self.backend.device
        if self.record_logits:
            report.logits = logits.detach().cpu()
        if next_ids is None:                 # (a CUDA graph step sampled already)
            temperature, top_p, uniforms = (torch.tensor(x, dtype=torch.float32).to(dev)
                                            for x in self._sampling_inputs(requests))
            next_ids = self.backend.sample(logits, temperature, top_p, uniforms).tolist()
        now = time.perf_counter()
        for r, token in zip(requests, next_ids):
            r.output_ids.append(int(token))
            report.new_tokens[r.request_id] = int(token)
            if r.first_token_time is None:
                r.first_token_time = now
            piece = r.detok.step(int(token)) if r.detok is not None else ""
            if piece:
                r.text_parts.append(piece)
            if r.on_token is not None:
                r.on_token(r.request_id, int(token), piece)
            reason = None
            if int(token) in self.eos_ids:
                reason = "eos"
            elif len(r.output_ids) >= r.max_new_tokens:
                reason = "length"
            elif r.total_len >= self.max_seq_len:
                reason = "max_seq_len"
            if reason:
                self.scheduler.finish(r, reason)
                report.finished.append(r.request_id)

    # --- results ---------------------------------------------------------------------------------
    def _request(self, request_id: int) -> Request:
        request = self._requests.get(request_id)
        if request is None:
            raise ValueError(f"no request with id {request_id} (ids so far: 0.."
                             f"{self._next_id - 1})")
        return request

    def result(self, request_id: int) -> GenerationResult:
        """The result of a request so far (finish_reason "running" while it runs)."""
        r = self._request(request_id)
        if self.tokenizer is not None:
            text = self.tokenizer.decode(r.output_ids)
        else:
            text = ""
        decode_tps = None
        if r.first_token_time and r.finish_time and len(r.output_ids) > 1:
            span = r.finish_time - r.first_token_time
            decode_tps = (len(r.output_ids) - 1) / span if span > 0 else None
        return GenerationResult(
            request_id=r.request_id, prompt_token_ids=list(r.prompt_ids),
            token_ids=list(r.output_ids), text=text, finish_reason=r.finish_reason or "running",
            num_preemptions=r.num_preemptions, seed=r.seed,
            time_to_first_token_s=(r.first_token_time - r.arrival_time)
            if r.first_token_time else None,
            total_time_s=(r.finish_time - r.arrival_time) if r.finish_time else None,
            decode_tokens_per_s=decode_tps)

    def run_until_done(self, on_step: Callable[[StepReport], None] | None = None) -> None:
        while self.scheduler.has_work():
            report = self.step()
            if on_step is not None:
                on_step(report)

    def generate(self, prompts: Sequence, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, chat: bool = True,
                 on_token: Callable | None = None,
                 on_step: Callable[[StepReport], None] | None = None) -> list[GenerationResult]:
        """Generate for every prompt (continuous batching over the engine's slots).

        ``on_token(request_index, token_id, text_piece)`` is called as each token is produced;
        ``request_index`` is the prompt's position in ``prompts``.  Results come back in prompt
        order.  With ``seed``, request i samples from the stream keyed by (seed, i)."""
        if isinstance(prompts, (str, bytes)) or (prompts and isinstance(prompts[0], int)):
            raise TypeError("generate takes a list of prompts: wrap a single prompt in a list")
        if self.scheduler.has_work():
            raise RuntimeError("generate() needs an idle engine; finish or cancel pending "
                               "requests first")
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        # validate everything before queueing anything, so a bad prompt loses nothing
        encoded = [self.encode_prompt(p, chat=chat) for p in prompts]
        requests = []
        try:
            for i, ids in enumerate(encoded):
                cb = None
                if on_token is not None:
                    cb = (lambda i: lambda _rid, tok, piece: on_token(i, tok, piece))(i)
                # the random stream is keyed by prompt position, so results do not depend on
                # how many requests this engine served before
                requests.append(self.add_request(ids, max_new_tokens, temperature, top_p,
                                                 seed=seed, chat=False, on_token=cb,
                                                 sample_key=i))
        except Exception:
            for r in requests:
                self.scheduler.finish(r, "cancelled")
            raise
        self.run_until_done(on_step)
        return [self.result(r.request_id) for r in requests]

    def stream(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0,
               top_p: float = 1.0, seed: int | None = None, chat: bool = True) -> Iterator[str]:
        """Yield the answer's text piece by piece as tokens are produced."""
        pieces: list[str] = []
        request = self.add_request(prompt, max_new_tokens, temperature, top_p, seed, chat,
                                   on_token=lambda _rid, _tok, piece: pieces.append(piece))
        while request.status is not Status.FINISHED:
            self.step()
            while pieces:
                piece = pieces.pop(0)
                if piece:
                    yield piece
        self._last_stream_result = self.result(request.request_id)
