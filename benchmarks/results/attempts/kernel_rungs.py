"""The kernel rungs of one change set timed side by side in one process on a GPU.

    python benchmarks/results/attempts/kernel_rungs.py [--engine] [--rounds 3] [--out DIR]

1. **The greedy sampler's 16-byte loads**: the ``sample`` op alone on the LM head's bf16
   logits, and the LM head GEMV/GEMM followed by it (the sampler launched to overlap it, as
   in the engine), each captured ten times in a CUDA graph (``gpu_timers.graph_ms``), against
   the LM head alone: what is left after the LM head ends is what the sampler costs the step.
   ``SAMPLERS``: the 16-byte scan and the one-logit scan.  Ids checked against
   ``torch.argmax``.  (The run at 47d654c, ``kernel-rungs-2026-12-02-sampler.json``, timed
   each variant after its own backend's LM head: at batch 1 the ``scalar`` row's is cuBLAS.)
2. With ``--engine``, the engine's decode step (``decode_ladder.time_engine``: Llama-3.2-1B
   shapes, random bf16 weights, CUDA graphs, overlapped launches) for each of
   ``ENGINE_VARIANTS``, at batch 1 and 64, alternating for ``--rounds`` rounds; each variant's
   24 greedy tokens first, which must equal the first variant's.  (At 32e2f49 it compared the
   attention kernel loading its first past K/V rows before the wait, since reverted:
   ``kernel-rungs-2026-12-02-attention-prefetch.json``.)

Writes ``kernel-rungs-<date>.json`` (GPU name and date inside) to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from paged_tutorial.backends.numba_cuda import KernelOptions, NumbaBackend  # noqa: E402
from paged_tutorial.measure import decode_ladder as decode  # noqa: E402
from paged_tutorial.measure.gpu_timers import graph_ms  # noqa: E402

CHECK_TOKENS = 24
SAMPLER_BATCHES = (1, 8, 16, 64)
ENGINE_VARIANTS = {"default": KernelOptions(), "scalar_kernels": KernelOptions(vector=False)}


#: the sampler's scans: 16-byte loads where the rows allow (the default), or one logit per
#: load (``vector=False``; that backend's LM head would be cuBLAS at batch 1, so the LM head
#: is always the default backend's)
SAMPLERS = {"vector": KernelOptions(), "scalar": KernelOptions(vector=False)}


def engine_rows(model, rounds: int) -> dict:
    out = {}
    for batch in decode.BATCHES:
        prompts = decode.prompts_for(batch, decode.PROMPT_LEN, 1, model.config.vocab_size)
        row = {}
        for name, opts in ENGINE_VARIANTS.items():
            engine = decode.make_engine(model, batch, backend=NumbaBackend(options=opts))
            res = engine.generate(prompts, decode.exactly(CHECK_TOKENS), chat=False)
            row[name] = {"tokens": [r.token_ids for r in res], "ms": [], "gpu_ms": []}
            del engine
        first = next(iter(row.values()))["tokens"]
        for name in row:
            row[name]["tokens_equal_default"] = row[name].pop("tokens") == first
        for _ in range(rounds):
            for name, opts in ENGINE_VARIANTS.items():
                t = decode.time_engine(model, batch, backend=NumbaBackend(options=opts))
                row[name]["ms"].append(t["ms_per_step"])
                row[name]["gpu_ms"].append(t.get("gpu_ms_per_step"))
        for name in row:
            row[name]["median_ms"] = statistics.median(row[name]["ms"])
            row[name]["median_gpu_ms"] = statistics.median(row[name]["gpu_ms"])
        out[f"batch_{batch}"] = row
        print(f"batch {batch}: " + ", ".join(
            f"{n} {r['median_gpu_ms']:.4f} ms GPU ({r['median_ms']:.4f} wall, tokens equal "
            f"{r['tokens_equal_default']})" for n, r in row.items()), flush=True)
    return out


def sampler_rows(model) -> dict:
    w = model.output_weight
    lm = NumbaBackend()
    out = {}
    for batch in SAMPLER_BATCHES:
        g = torch.Generator(device="cuda").manual_seed(batch)
        x = torch.randn(batch, w.shape[1], generator=g, device="cuda").to(torch.bfloat16)
        temp = torch.zeros(batch, device="cuda")
        top_p = torch.ones(batch, device="cuda")
        u = torch.rand(batch, generator=g, device="cuda")
        logits = lm.linear(x, w)
        want = logits.float().argmax(dim=1)
        row = {"lm_head_us": graph_ms(lambda i: lm.linear(x, w)) * 1e3}
        for name, opts in SAMPLERS.items():
            be = NumbaBackend(options=opts)
            ids = be.sample(logits, temp, top_p, u)
            row[name] = {
                "ids_equal_torch_argmax": bool(torch.equal(ids, want)),
                "sample_us": graph_ms(lambda i: be.sample(logits, temp, top_p, u)) * 1e3,
                "lm_head_then_sample_us":
                    graph_ms(lambda i: be.sample(lm.linear(x, w), temp, top_p, u)) * 1e3,
            }
            row[name]["sample_after_lm_head_us"] = \
                row[name]["lm_head_then_sample_us"] - row["lm_head_us"]
        out[f"batch_{batch}"] = row
        print(f"sampler batch {batch}: " + json.dumps(row), flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent))
    p.add_argument("--engine", action="store_true")
    args = p.parse_args()
    model = decode.random_gpu_model()
    data = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "model": "Llama-3.2-1B shapes, random bf16 weights",
            "commit": os.environ.get("TREE_COMMIT"), "rounds": args.rounds,
            "sampler": sampler_rows(model)}
    if args.engine:
        data["engine"] = engine_rows(model, args.rounds)
    path = Path(args.out) / f"kernel-rungs-{data['date']}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
