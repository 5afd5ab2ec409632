"""How long the article's decode kernel takes in Numba's CUDA simulator, on a fixed case:

    python benchmarks/sim_speed.py [--repeats N] [--out DIR] [--no-write]

One SmolLM2-135M layer's decode attention (9 query heads over 3 kv heads, head_dim 64, one
sequence of 38 cached tokens, float32, random K/V): ``attention.decode`` with the article's parts,
as the chapter notebooks and ``your_kernel()`` run it.  Two smaller probes isolate the cost of
the simulator's waits: a 64-thread block passing 200 ``syncthreads``, and one passing 200
``shfl_xor_sync``.  For each, the wall time and the process's CPU time (user + system) of the
fastest of ``--repeats`` runs; the CPU time says more on a busy machine.  The output is checked
against the torch backend.  Writes ``sim-speed-<date>.json`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch

import paged_tutorial.backends.numba_cuda  # noqa: F401  (decides: simulator, when no GPU)
from numba import cuda

from paged_tutorial.backends.numba_cuda.device import sim_shim
from paged_tutorial.backends.numba_cuda.kernels import attention
from paged_tutorial.backends.torch_ref import TorchBackend
from paged_tutorial.cache.paged_cache import PagedKVCache
from paged_tutorial.config import CacheConfig
from paged_tutorial.measure.result_files import write_json
from paged_tutorial.measure.wall_clock import fastest

RESULTS = Path(__file__).resolve().parent / "results"
N_WAITS = 200


def smollm2_layer(repeats: int) -> dict:
    heads, kv_heads, head_dim, context = 9, 3, 64, 38
    config = CacheConfig(num_layers=1, num_kv_heads=kv_heads, head_dim=head_dim,
                         dtype="float32", kv_cache_bytes=8 * 2 * 16 * kv_heads * head_dim * 4,
                         max_slots=1, max_seq_len=64)
    cache = PagedKVCache(config, torch.device("cpu"))
    cache.ensure_capacity(0, context)
    g = torch.Generator().manual_seed(0)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g))
    q = torch.randn(1, heads, head_dim, generator=g)
    table = cache.device_block_table()
    scale = head_dim ** -0.5
    reference = TorchBackend().decode_attention(q.clone(), cache, table, 0,
                                                torch.tensor([context]), torch.tensor([0]),
                                                scale)
    attention.decode(q.clone(), cache, table, 0, [context], [0], scale)      # compile once
    out = q.clone()

    def run():
        out.copy_(q)
        attention.decode(out, cache, table, 0, [context], [0], scale)

    timing = fastest(run, repeats)
    error = float((out - reference).abs().max())
    if not error < 1e-5:
        raise AssertionError(f"the simulated kernel disagrees with the torch backend: {error}")
    return {"case": f"{heads} q heads / {kv_heads} kv heads, head_dim {head_dim}, {context} "
                    "tokens, float32", **timing, "max_abs_error": error}


@cuda.jit
def _barriers(out, n):
    v = 0
    for _ in range(n):
        cuda.syncthreads()
        v += 1
    out[cuda.threadIdx.x] = v


@cuda.jit
def _shuffles(out, n):
    v = cuda.threadIdx.x
    for _ in range(n):
        v = cuda.shfl_xor_sync(0xFFFFFFFF, v, 1)
    out[cuda.threadIdx.x] = v


def probe(kernel, repeats: int) -> dict:
    out = np.zeros(64, np.int64)

    def run():
        with sim_shim.fast_thread_switching():
            kernel[1, 64](out, N_WAITS)

    timing = fastest(run, repeats)
    per = {f"{k[:-2]}_us_per_thread_wait": round(1e6 * v / (64 * N_WAITS), 1)
           for k, v in timing.items()}
    return {**timing, **per}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if not sim_shim.SIMULATING:
        sys.exit("sim_speed.py measures Numba's CUDA simulator: run it where no GPU is visible "
                 "or with NUMBA_ENABLE_CUDASIM=1")
    result = {
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "python": platform.python_version(),
        "smollm2_layer": smollm2_layer(args.repeats),
        "syncthreads_200x64": probe(_barriers, args.repeats),
        "shfl_xor_200x64": probe(_shuffles, args.repeats),
    }
    print(json.dumps(result, indent=2))
    if not args.no_write:
        write_json(result, "sim-speed", args.out, indent=2)


if __name__ == "__main__":
    main()
