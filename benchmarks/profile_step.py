"""Where one engine step's time goes, kernel by kernel (torch.profiler), on the GPU:

    python benchmarks/profile_step.py [--out DIR]

Llama-3.2-1B shapes, random bf16 weights (as ``decode.py``), 128-token prompts.  Profiled:

- ``decode_graph_b1`` / ``decode_graph_b64``: one CUDA-graph replay of a decode step (the
  engine's default path) at batch 1 and 64;
- ``decode_eager_b1``: one decode step without graphs (every launch from Python), with the
  step's wall time beside its kernel time: the gap is host time;
- ``prefill_2x1024``: one prefill engine step of two 1024-token prompts;
- ``host``: host microseconds per call of small ops through each launch path of
  ``launch.py`` (and torch's own ops for scale), and a cProfile of eager decode steps.

For each: the wall time of the step (median of several, measured without the profiler), the
sum of kernel times, the number of kernels, and per kernel name its calls, total and mean
microseconds, sorted by total.  Numba's mangled kernel names are shortened to the Python
function's name.  Writes ``profile-<date>.json``.
"""

from __future__ import annotations

import argparse
import sys

from common import RESULTS
from paged_tutorial.measure.gpu_machine import setup_numba_env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for profile-<date>.json "
                   "(default benchmarks/results)")
    args = p.parse_args(argv)
    setup_numba_env()
    from paged_tutorial.measure import step_profile

    step_profile.run(args.out or RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
