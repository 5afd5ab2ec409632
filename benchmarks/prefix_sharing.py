"""Prefix caching: N requests that share a long system prompt, with and without sharing.

    python benchmarks/prefix_sharing.py                 # CPU: embedded SmolLM2, float32, torch
    python benchmarks/prefix_sharing.py --gpu --out /tmp/prefix-sharing-gpu.json
                                                        # GPU: random Llama-3.2-1B bf16, numba
    python benchmarks/prefix_sharing.py --tiny          # CPU: the GPU run's block geometry
                                                        # with a tiny model (host bookkeeping)

Each request is the same system prompt followed by its own question; all N are submitted at
once to an engine with N slots and generate a fixed number of tokens (EOS ignored).  The same
N requests are then submitted a second time, after the first wave has finished ("warm"): with
prefix caching, the system prompt's blocks are still cached then, although nobody uses them.
For each engine (prefix caching off / on) and each wave the script records:

- ``prefill_tokens``: tokens the prefill steps computed (K/V written);
- ``peak_blocks_used``: the most physical blocks referenced by block-table entries at once
  (a shared block counts once), and ``peak_blocks_cached`` (unused blocks kept for a prefix);
- ``ttft_s``: each request's time to first token (submission -> first token), and the wave's
  wall time;
- ``num_cached_tokens``: per request, prompt tokens served from shared blocks;
- ``prefill_phase_s``: the wave's prefill steps (those that give the first tokens) split into
  the engine's phases (``StepReport.phase_seconds``, summed over those steps): ``schedule``
  (admission and block allocation: the host bookkeeping), ``inputs`` (packing, block-table
  sync), ``forward`` (on a GPU: enqueueing the layers' kernels), ``sample`` (on a GPU: waiting
  for them and reading the tokens back), ``postprocess`` and ``release``;
- whether the greedy tokens equal those of the engine without prefix caching; on the GPU also
  in float32 (``same_tokens_float32``: the same weights and requests, one run of each wave),
  where they must be equal, while the timed run is in bfloat16.

Before measuring, each engine serves unrelated prompts once (kernel compilation, CUDA graph
capture).  Both waves run once with a cache listener that counts blocks (untimed: a listener
sees every one of the ~17 000 block-table entries a wave edits), then ``--repeats`` times
without it, the prefix cache emptied (``evict_unused``) before each cold wave; token and block
counts are the same every time, times are those of the fastest repeat (on a shared machine,
the one least disturbed), every repeat's kept too.
``load_average_1min`` (before, after) says how busy the machine was.  The GPU mode needs no
model file: Llama-3.2-1B's shapes with random weights, prompts as token ids.  ``--tiny`` keeps
that mode's block geometry (16 layers, the same requests, prompts and cache layout) with a
model too small to cost anything (hidden 64, 2 heads, vocabulary 512, float32, torch on the
CPU): what it measures is the host's work per step, which the GPU run pays too.
"""

from __future__ import annotations

import argparse
import os
import sys

from common import RESULTS
from paged_tutorial.measure import prefix_sharing_bench, prefix_sharing_workload


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true",
                    help="random Llama-3.2-1B weights in bf16 on the GPU (numba backend)")
    ap.add_argument("--tiny", action="store_true",
                    help="the --gpu run's block geometry (16 layers, 16 requests of 1056 "
                         "tokens sharing 1024) with a tiny float32 model on the CPU: the "
                         "host's bookkeeping per step")
    ap.add_argument("--requests", type=int, default=None,
                    help="N (default 8 on the CPU, 16 on the GPU)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="tokens each request generates (default 8 CPU, 32 GPU)")
    ap.add_argument("--system-tokens", type=int, default=1024,
                    help="--gpu / --tiny: length of the shared random system prompt")
    ap.add_argument("--question-tokens", type=int, default=32,
                    help="--gpu / --tiny: length of each request's own random question")
    ap.add_argument("--repeats", type=int, default=None,
                    help="run both waves this many times; times of the fastest (default 5 on "
                         "the CPU, 3 on the GPU: there the one-time kernel compilation dominates)")
    ap.add_argument("--out", default=None,
                    help="a .json file, or a folder for prefix-sharing-<cpu|gpu>-<date>.json "
                         "(default benchmarks/results/)")
    args = ap.parse_args(argv)

    if args.gpu and args.tiny:
        print("error: --gpu and --tiny are two different runs: pick one", file=sys.stderr)
        return 2
    mode = "gpu" if args.gpu else "tiny" if args.tiny else "cpu"
    try:
        work = prefix_sharing_workload.workload(mode, args.requests, args.max_tokens,
                                                args.system_tokens, args.question_tokens)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prefix_sharing_bench.run(work, args.repeats, args.out or RESULTS)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
