"""Paged decode attention (and prefill attention) on the GPU, side by side, in one command:

    python benchmarks/attention.py [--out DIR] [--sweep [--variants A,B] [--splits 0,1,4]]
                                   [--cases 1:1024,64:2048] [--skip-prefill]

Llama-3.2-1B attention shapes (32 query heads, 8 KV heads, head_dim 64, BLOCK_SIZE 16, bf16),
physical blocks scattered at random.  For each (batch, context):

- ``fast``: our Numba kernel (``attention_fast.py``, the engine's below batch 16),
- ``tensor_core``, ``tensor_core-prefetch``: our tensor-core Numba kernel
  (``attention_tc.py``; the engine's default, ``KernelOptions(attention="auto")``, takes it
  from ``attention_tc.MIN_BATCH`` sequences, where these columns measured it faster), as the
  engine runs it and with each warp loading its next block before computing the current one;
  ``tensor_core_speedup_vs_fast`` in each row,
- ``triton``: the Triton peer (``backends/triton_attention.py``),
- ``flashinfer``, ``flashinfer-tc``: FlashInfer's batch decode on CUDA cores and on tensor
  cores, reading our cache in place (``measure/flashinfer_peer.py``; where FlashInfer is not
  installed or cannot compile, the case's ``not_run`` says why),
- ``article``: the article-faithful Numba kernel (``attention.py``; target cases only: slow),
- ``sdpa``: torch SDPA on *contiguous* K/V (no paging; enable_gqa), the library baseline,
- ``floor``: K+V bytes / copy bandwidth measured in this run.

Every implementation is first checked against a float32 reference (||out - ref|| / ||ref||
< 1e-2) at every case.  Times: median of CUDA-graph replays (10 launches per graph, each on a
different layer's cache so that repeated launches do not read from L2).  ``--sweep`` also
times variants of the fast kernel (``SWEEP``: its ``KernelShape``; warps per block; splits),
which is how the package's choices (``attention_fast.CHOSEN_SHAPE``, ``FEW_WARPS_FROM_BLOCKS``)
were made; the whole sweep over every case takes more than 5 minutes (each case compiles every
variant anew), so ``--cases``, ``--variants`` and ``--splits`` narrow it.  Prefill: causal
attention of 2 x 1024-token prompts: the Numba kernel, the GPU default (one variable-length
FlashAttention call for the packed batch) and torch SDPA once per sequence.  Writes
``attention-<date>.json``, after every case.
"""

from __future__ import annotations

import argparse
import sys

from common import RESULTS
from paged_tutorial.measure.gpu_machine import setup_numba_env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for attention-<date>.json "
                   "(default benchmarks/results)")
    p.add_argument("--sweep", action="store_true", help="also time fast-kernel variants")
    p.add_argument("--best-out", default=None, help="write the best variant here (JSON)")
    p.add_argument("--cases", default=None,
                   help="only these cases, e.g. 1:1024,64:2048 (default: all of CASES)")
    p.add_argument("--variants", default=None,
                   help="--sweep only these SWEEP variants, comma-separated names")
    p.add_argument("--splits", default=None,
                   help="--sweep only these split counts, e.g. 0,1,4,16 (0: the package's "
                   "choice; default SWEEP_SPLITS)")
    p.add_argument("--skip-prefill", action="store_true")
    args = p.parse_args(argv)
    setup_numba_env()
    from paged_tutorial.measure import attention_bench

    try:
        cases = attention_bench.parse_cases(args.cases)
        sweep = attention_bench.sweep_for(args.variants, args.splits) if args.sweep else None
    except ValueError as exc:
        p.error(str(exc))
    attention_bench.run(cases, sweep, args.out or RESULTS, best_out=args.best_out,
                        skip_prefill=args.skip_prefill)
    return 0


if __name__ == "__main__":
    sys.exit(main())
