"""CUDA graphs for the decode step: one captured graph per batch-size bucket.

A decode step of Llama-3.2-1B is ~150 small kernel launches (16 layers x norms, GEMMs, RoPE +
cache write, attention, SwiGLU) plus sampling.  Launched one by one from Python, each costs
20-40 us of host time, far more than most of them run on the GPU.  A CUDA graph records the
whole step once and replays it with one call: the GPU then runs the kernels back to back.

What a graph needs, and how this module provides it:

- **Static inputs.**  A graph replays fixed addresses.  Token ids, positions, slots, sequence
  lengths and the sampling parameters live in one device buffer (``[8, max_batch]`` int32,
  the float rows as bit patterns), filled before each replay by *one* host-to-device copy from
  pinned memory; the ``StepInputs`` a captured forward reads are views of that buffer, so a
  replay reads what the copy wrote.  A step launched before the previous one was read back
  (asynchronous scheduling, ``engine_core.py``) takes its token ids from the previous
  replay's sampled ids on the device: the buffer's ``source_rows`` row says which, and one
  gather after the copy writes them.  The host side is two pinned buffers used in turn, so
  filling step n + 1 never overwrites the inputs of step n before the GPU has copied them.  The block table is already a persistent device tensor that
  ``PagedKVCache.device_block_table()`` updates in place (only the dirty entries).
- **Static outputs.**  The logits and the sampled ids are tensors allocated during capture;
  each replay overwrites them.  The graph also packs the ids and, per row, whether its logits
  are all finite into one small int32 tensor, copied after the replay into pinned memory (two
  buffers used in turn) with an event behind it: ``launch`` queues all of that and returns,
  ``collect`` waits for the event and reads the lists.
- **Buckets.**  One graph per batch size in ``buckets`` (1, 2, 4, 8, then steps of 16); a step
  with B sequences runs the smallest bucket >= B.  The extra rows repeat row 0 (same token,
  slot and position), so they write the very K/V values row 0 writes and read only what row 0
  reads: no other sequence's cache is touched.  Their outputs are ignored.
- **No host work inside the graph.**  Numba launches go to ``cuda.external_stream`` of torch's
  current stream, so they are captured with the GEMMs; the backends' host-side input checks
  (``check_inputs``) are off on the GPU, and nothing in the decode path reads device values on
  the host (the torch backend samples every row at once, ``backends/batched_sampling.py``).
- **Capture lazily.**  A bucket's graph is captured the first time a step needs it, after one
  eager warm-up run of the same step on a side stream (it compiles the kernels and sets up
  cuBLAS; its cache writes are the ones the replay repeats).  All graphs share one memory
  pool: only one replays at a time, and its outputs are read before the next replay.
  ``capture_every_bucket_next_step()`` makes the next step capture every bucket it can pad
  to, its rows repeated as padding (a server's warm-up, as vLLM captures its graphs at start:
  the first clients do not wait for captures while the batch grows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from paged_tutorial.step_inputs import StepInputs

ROWS_INT = ("token_ids", "positions", "slots", "seq_lens", "source_rows")
ROWS_FLOAT = ("temperature", "top_p", "uniforms")


def default_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 48, ... up to ``max_batch`` (always included)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch]
    sizes += list(range(16, max_batch, 16))
    return sorted(set(sizes + [max_batch]))


class DecodeGraphs:
    """Replays captured decode steps of a ``DecoderNetwork`` (model/decoder.py) on a CUDA backend."""

    def __init__(self, network, cache, max_batch: int, buckets: list[int] | None = None):
        backend = network.backend
        if backend.device.type != "cuda" or not backend.graph_capturable:
            raise ValueError(f"CUDA graphs are captured for a graph-capturable backend (numba, "
                             f"torch) on a GPU only, got {backend.describe()}: pass "
                             f"cuda_graphs=False")
        if backend.check_inputs:
            raise ValueError(f"CUDA graphs cannot capture the {backend.name} backend's "
                             "host-side input checks (check_inputs / debug=True): turn them "
                             "off, or pass cuda_graphs=False")
        self.network, self.cache, self.backend = network, cache, backend
        self.max_batch = max_batch
        self.buckets = sorted(buckets) if buckets else default_buckets(max_batch)
        if self.buckets[-1] < max_batch:
            raise ValueError(f"buckets {self.buckets} do not reach max_batch {max_batch}")
        n_rows = len(ROWS_INT) + len(ROWS_FLOAT)
        # two pinned input buffers and two pinned read-back buffers, used in turn
        self._host = [torch.zeros((n_rows, max_batch), dtype=torch.int32, pin_memory=True)
                      for _ in range(2)]
        self._read_host = [torch.zeros(2 * max_batch, dtype=torch.int32, pin_memory=True)
                           for _ in range(2)]
        self._turn = 0
        self._dev = torch.zeros((n_rows, max_batch), dtype=torch.int32, device=backend.device)
        ints = self._dev[:len(ROWS_INT)]
        floats = self._dev[len(ROWS_INT):].view(torch.float32)
        self.inputs = {name: ints[i] for i, name in enumerate(ROWS_INT)}
        self.inputs.update({name: floats[i] for i, name in enumerate(ROWS_FLOAT)})
        self.graphs: dict[int, tuple] = {}      # bucket -> (graph, logits, read_back)
        self._pool = None
        self.replays = 0
        self.capture_every_bucket = False       # one-shot: the next step captures them all

    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} exceeds the largest bucket {self.buckets[-1]}")

    # --- one step -------------------------------------------------------------------------
    def _fill(self, n: int, bucket: int, token_ids, positions, slots, temperature, top_p,
              uniforms, source_rows=None) -> None:
        host = self._host[self._turn]
        h = host.numpy()
        pos = np.asarray(positions, dtype=np.int32)
        rows = (token_ids, pos, slots, pos + 1, source_rows if source_rows is not None else 0)
        for i, values in enumerate(rows):
            h[i, :n] = values
            h[i, n:bucket] = h[i, 0]            # padding rows repeat row 0
        hf = h[len(ROWS_INT):].view(np.float32)
        for i, values in enumerate((temperature, top_p, uniforms)):
            hf[i, :n] = values
            hf[i, n:bucket] = hf[i, 0]
        self._dev.copy_(host, non_blocking=True)

    def _forward(self, bucket: int):
        x = {name: t[:bucket] for name, t in self.inputs.items()}
        # the host ints of a StepInputs would be frozen into the graph: none are given
        # (max_seq_len None: the kernels read each length from seq_lens)
        inputs = StepInputs("decode", x["token_ids"], x["positions"], x["slots"], x["slots"],
                            x["seq_lens"], self.cache.device_block_table(), num_seqs=bucket,
                            max_query_len=1)
        logits = self.network.forward(inputs, self.cache)
        next_ids = self.backend.sample(logits, x["temperature"], x["top_p"], x["uniforms"])
        return logits, next_ids

    def _capture(self, bucket: int) -> None:
        side = torch.cuda.Stream(self.backend.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(bucket)               # warm-up: compiles, sets up cuBLAS
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread's unsafe calls break the capture; another thread of
        # the process (a second engine, a notebook's widgets, a test) may use CUDA meanwhile
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits, next_ids = self._forward(bucket)
            read_back = torch.stack((next_ids.reshape(-1).int(),
                                     torch.isfinite(logits).all(dim=-1).int()))
        if self._pool is None:
            self._pool = graph.pool()
        self.graphs[bucket] = (graph, logits, read_back)

    def capture_every_bucket_next_step(self) -> None:
        self.capture_every_bucket = True

    def launch(self, token_ids, positions, slots, temperature, top_p, uniforms,
               after: "GraphRun | None" = None, source_rows: list[int] | None = None
               ) -> "GraphRun":
        """Queue one decode step for n = len(positions) sequences (host lists) and return at
        once.  With ``after`` (a step launched earlier, not necessarily read back yet) row i
        takes its token id from row ``source_rows[i]`` of that step's sampled ids on the
        device, and ``token_ids`` is not read."""
        n = len(positions)
        bucket = self.bucket_for(n)
        if after is None:
            source_rows = None
        elif source_rows is None or len(source_rows) != n:
            raise ValueError(f"launch after another step needs one source row per sequence "
                             f"({n}), got {source_rows!r}")
        else:
            token_ids = [0] * n                 # placeholders: the gather below writes them
        self.cache.device_block_table()         # send dirty entries before the replay
        if self.capture_every_bucket:
            self.capture_every_bucket = False
            for other in self.buckets:
                if other >= n and other not in self.graphs:
                    self._fill(n, other, token_ids, positions, slots, temperature, top_p,
                               uniforms, source_rows)
                    self._gather(after, other)
                    self._capture(other)
        self._fill(n, bucket, token_ids, positions, slots, temperature, top_p, uniforms,
                   source_rows)
        self._gather(after, bucket)
        if bucket not in self.graphs:
            self._capture(bucket)
        graph, logits, read_back = self.graphs[bucket]
        graph.replay()
        self.replays += 1
        host = self._read_host[self._turn][:2 * bucket].view(2, bucket)
        host.copy_(read_back, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self._turn ^= 1
        return GraphRun(n, logits[:n], read_back[0, :n], host, done)

    def _gather(self, after: "GraphRun | None", bucket: int) -> None:
        """The token ids of a step launched after ``after``: its sampled ids, picked by the
        ``source_rows`` the fill just copied (one kernel, queued behind that step)."""
        if after is not None:
            torch.index_select(after.token_ids, 0, self.inputs["source_rows"][:bucket],
                               out=self.inputs["token_ids"][:bucket])

    @staticmethod
    def collect(run: "GraphRun"):
        """Wait for a launched step and read it back: (its logits [n, V], a view into the
        graph's output valid until the next replay; the sampled token ids and, per row,
        whether its logits are all finite, as host lists)."""
        run.done.synchronize()
        ids, finite = run.read_host.tolist()
        return run.logits, ids[:run.n], [bool(f) for f in finite[:run.n]]


@dataclass
class GraphRun:
    """A replay queued by ``DecodeGraphs.launch``, not read back yet."""
    n: int                              # sequences (the bucket may be larger)
    logits: torch.Tensor                # [n, V] the graph's output (the next replay overwrites)
    token_ids: torch.Tensor             # [n] int32, the sampled ids on the device
    read_host: torch.Tensor             # [2, bucket] pinned: ids and finite flags, once done
    done: torch.cuda.Event              # recorded after the read-back copy
