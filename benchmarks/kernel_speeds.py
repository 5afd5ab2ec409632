"""The small kernels of a step against the bandwidth they should reach, and the GEMV against
cuBLAS, on the GPU, in one command:

    python benchmarks/kernel_speeds.py [--out DIR]

Llama-3.2-1B shapes, bf16.  For each op and token count T (1 and 64: decode; 2048: a
2 x 1024 prefill) the bytes it must move (each input read once, each output written once), the
time of our kernel (median of CUDA-graph replays, 10 calls per graph on rotating inputs), of the
scalar kernel it replaced (``KernelOptions(vector=False)``) and of torch's ops for the same
function, and the % of the copy bandwidth measured in this run.  Every result is checked first
(against the scalar kernel: bit for bit, norms within one rounding; the GEMV against
float32 products).  The GEMV
table is how ``gemv.MAX_ROWS`` was chosen.  Writes ``kernels-<date>.json``.
"""

from __future__ import annotations

import argparse
import sys

from common import RESULTS
from paged_tutorial.measure.gpu_machine import setup_numba_env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for kernels-<date>.json "
                   "(default benchmarks/results)")
    args = p.parse_args(argv)
    setup_numba_env()
    from paged_tutorial.measure import kernel_bench

    kernel_bench.run(args.out or RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
