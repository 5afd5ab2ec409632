"""The article's fourth limit, measured: the whole block table copied host -> device in every
decode layer (``src/main.cpp:876``, with the TODO at ``:551``) against this engine's one sync
of the changed entries per step (``PagedKVCache.device_block_table``).

``WholeTableCopyBackend`` wraps any backend and forwards every operation to it.  With
``copy_whole_table=True`` it first copies the *whole* host table (``cache.block_table``, an
ordinary -- pageable -- numpy array) into the device table that the layer's decode attention
is about to read, as ``main.cpp:876`` does right before ``pagedAttentionKernel`` (``:878``).
A copy from pageable memory is synchronous for the host: it waits for all the work already
queued on the stream, then for the copy itself (torch runs it as ``cudaMemcpyAsync`` +
``cudaStreamSynchronize``, which is what ``cudaMemcpy`` does on the default stream).  So the
article's engine drains the GPU once per layer, 16 times per generated token.  The copies
write the values the device table already holds, so the tokens do not change (checked).

``measure_decode(model, ...)`` runs the same greedy requests twice through a fresh ``Engine``
each time -- copies on, copies off, both eager and behind the same wrapper -- and returns the
median milliseconds per decode step of each, the copies made, and the entries the engine's own
sync sent.  ``time_one_copy`` times a single whole-table copy on an idle device and behind
queued work.  The committed measurement (``benchmarks/table_copy.py`` on a GPU) is
``results.newest("table-copy")``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from paged_tutorial.backends import make_backend
from paged_tutorial.backends.base import Backend
from paged_tutorial.backends.recording import RecordingBackend

INT32_BYTES = 4


class WholeTableCopyBackend(RecordingBackend):
    """Forwards every op to ``inner`` (a ``RecordingBackend`` that records nothing); with
    ``copy_whole_table`` each ``decode_attention`` is preceded by the article's copy of the
    whole host block table into the device table it reads.  ``copies`` counts them."""

    def __init__(self, inner: Backend | str = "torch", copy_whole_table: bool = True):
        super().__init__(inner, ops=())
        self.copy_whole_table = bool(copy_whole_table)
        self.copies = 0
        way = "whole table per layer" if self.copy_whole_table else "changed entries only"
        self.name = f"table-copy[{way}]({self.inner.name})"

    def describe(self) -> str:
        way = ("plus a whole-table host->device copy before each decode layer"
               if self.copy_whole_table else "forwarding only")
        return f"{self.inner.describe()}, {way}"

    def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots, scale,
                         max_seq_len=None):
        if self.copy_whole_table:
            host = torch.from_numpy(cache.block_table)          # pageable host memory
            block_table.copy_(host)                             # main.cpp:876
            self.copies += 1
        return self.inner.decode_attention(q, cache, block_table, layer, seq_lens,
                                           active_slots, scale, max_seq_len)


@dataclass
class DecodeRun:
    """One arm of ``measure_decode``."""
    ms_per_step: list[float]         # wall time of each timed decode step
    tokens: list[list[int]]          # every request's generated ids
    copies: int                      # whole-table copies made (0 with copies off)
    entries_synced: int              # block-table entries the engine's own sync carried
    decode_steps: int                # decode steps run, warm-up included

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.ms_per_step))


def _prompts(vocab_size: int, batch: int, prompt_len: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, vocab_size, prompt_len)] for _ in range(batch)]


def run_decode(model, backend: Backend, *, batch: int, prompt_len: int, steps: int,
               warmup: int, max_seq_len: int, kv_cache_bytes: int | None, seed: int = 0,
               cuda_graphs: bool = False) -> DecodeRun:
    """Serve ``batch`` greedy requests of ``prompt_len`` random tokens (no EOS) on a fresh
    ``Engine(model, backend)``; time ``steps`` decode steps after ``warmup`` untimed ones."""
    from paged_tutorial.engine.llm_engine import Engine
    from paged_tutorial.engine.sampling_params import SamplingParams

    if prompt_len + warmup + steps + 1 > max_seq_len:
        raise ValueError(f"prompt_len + warmup + steps = {prompt_len + warmup + steps} does not "
                         f"fit max_seq_len {max_seq_len}: shorten the run")
    engine = Engine(model, backend=backend, max_slots=batch, max_seq_len=max_seq_len,
                    kv_cache_bytes=kv_cache_bytes, cuda_graphs=cuda_graphs)
    params = SamplingParams(max_tokens=warmup + steps + 1, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params).request_id
           for p in _prompts(model.config.vocab_size, batch, prompt_len, seed)]
    synced_before = engine.cache.dirty_entries_synced
    times, decode_steps = [], 0
    while engine.has_unfinished():
        engine.backend.synchronize()
        t0 = time.perf_counter()
        report = engine.step()
        engine.backend.synchronize()
        elapsed = (time.perf_counter() - t0) * 1e3
        if report.kind == "decode" and len(report.request_ids) == batch:
            decode_steps += 1
            if decode_steps > warmup:
                times.append(elapsed)
    copies = getattr(engine.backend, "copies", 0)
    return DecodeRun(times[:steps], [engine.result(i).token_ids for i in ids], copies,
                     engine.cache.dirty_entries_synced - synced_before, decode_steps)


def time_one_copy(table_entries: int, device: str | torch.device, repeats: int = 50,
                  queued_work_ms: float = 2.0) -> dict:
    """Milliseconds of one whole-table copy (``table_entries`` int32 from pageable host memory
    into a device tensor), median of ``repeats``: on an idle device, and when issued right
    after ``queued_work_ms`` of GPU work (on a GPU the copy's host call then lasts until that
    work is done: the article's copy drains the queue).  On a CPU both are plain memcpys."""
    device = torch.device(device)
    host = torch.from_numpy(np.full(table_entries, -1, dtype=np.int32))
    dev = torch.full((table_entries,), -1, dtype=torch.int32, device=device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def median_ms(fn) -> float:
        fn()
        sync()
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
            sync()
        return float(statistics.median(times))

    idle = median_ms(lambda: dev.copy_(host))
    out = {"copy_idle_ms": idle}
    if device.type == "cuda":
        a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
        c = torch.empty_like(a)

        def queue(reps: int) -> None:
            for _ in range(reps):
                torch.matmul(a, a, out=c)          # queued: the host does not wait for it

        def work_ms(reps: int) -> float:
            return median_ms(lambda: (queue(reps), sync()))

        reps = max(1, round(queued_work_ms / max(work_ms(1), 1e-3)))

        def queue_then_copy() -> float:
            queue(reps)
            t1 = time.perf_counter()
            dev.copy_(host)                        # ... but the pageable copy waits for it
            return (time.perf_counter() - t1) * 1e3

        queue_then_copy()
        behind = []
        for _ in range(repeats):
            sync()
            behind.append(queue_then_copy())
        sync()
        out.update(queued_work_ms=work_ms(reps),
                   copy_behind_queued_work_ms=float(statistics.median(behind)))
    return out


def measure_decode(model, backend: str | Backend = "auto", *, batch: int = 2,
                   prompt_len: int = 128, steps: int = 32, warmup: int = 4,
                   max_seq_len: int = 2048, kv_cache_bytes: int | None = None,
                   with_graphs: bool | None = None, seed: int = 0) -> dict:
    """The article's per-layer whole-table copies against changed-entries-only sync, on real
    decode steps of ``model``: both arms eager, through the same wrapper, same requests.
    ``with_graphs`` adds the stock engine with CUDA graphs (default: where the backend compiles
    kernels, the numba backend on a GPU)."""
    def fresh() -> Backend:              # one backend per engine: no state carried between arms
        return make_backend(backend) if isinstance(backend, str) else backend

    inner = fresh()
    num_layers = model.config.num_hidden_layers
    arms = {}
    for copies in (True, False):
        arms[copies] = run_decode(model, WholeTableCopyBackend(fresh(), copy_whole_table=copies),
                                  batch=batch, prompt_len=prompt_len, steps=steps,
                                  warmup=warmup, max_seq_len=max_seq_len,
                                  kv_cache_bytes=kv_cache_bytes, seed=seed)
    article, engine = arms[True], arms[False]
    if article.tokens != engine.tokens:
        raise AssertionError("the whole-table copies changed the generated tokens: the copy "
                             "must write the values the device table already holds")
    if article.copies != article.decode_steps * num_layers:
        raise AssertionError(f"{article.copies} whole-table copies for {article.decode_steps} "
                             f"decode steps of {num_layers} layers")
    from paged_tutorial.config import CacheConfig

    table_entries = CacheConfig.for_model(model.config, dtype=model.dtype, max_slots=batch,
                                          max_seq_len=max_seq_len).block_table_entries
    result = {
        "model_layers": num_layers,
        "backend": inner.describe(),
        "batch": batch, "prompt_len": prompt_len, "timed_decode_steps": len(engine.ms_per_step),
        "table_entries": table_entries, "table_bytes": table_entries * INT32_BYTES,
        "copies_per_decode_step": num_layers,
        "article_ms_per_step": round(article.median_ms, 4),
        "engine_ms_per_step": round(engine.median_ms, 4),
        "per_copy_ms_from_steps": round((article.median_ms - engine.median_ms) / num_layers, 5),
        "engine_entries_synced": engine.entries_synced,
        "article_entries_copied": article.copies * table_entries,
        "tokens_identical": True,
    }
    result.update({k: round(v, 5) for k, v in
                   time_one_copy(table_entries, inner.device).items()})
    if with_graphs is None:
        with_graphs = inner.compiles_kernels      # the numba backend on a GPU
    if with_graphs:
        graphs = run_decode(model, fresh(), batch=batch, prompt_len=prompt_len, steps=steps,
                            warmup=warmup, max_seq_len=max_seq_len,
                            kv_cache_bytes=kv_cache_bytes, seed=seed, cuda_graphs=True)
        result["engine_graphs_ms_per_step"] = round(graphs.median_ms, 4)
    return result
