"""The engine's host time per decode step, measured on a CPU (no GPU needed):

    python benchmarks/host_step.py [--batches 1 64] [--steps 200] [--rounds 3]
                                   [--baseline DIR] [--text] [--profile] [--out DIR]

On a GPU with CUDA graphs a decode step is one graph replay plus everything the engine does
in Python around it: scheduling, building the step's inputs, appending the tokens, the stop
checks, the text, the callbacks and the StepReport.  That host part is what this measures,
with a model whose forward costs next to nothing: a one-layer random Llama of width 16 on
the torch backend, whose decode attention reads nothing (``FreeForwardBackend``: the tokens
it produces do not matter here, only the bookkeeping around them).  ``batch`` requests
decode together in a ``batch``-slot engine, through ``generate`` with an ``on_step``
callback, as ``benchmarks/decode.py`` times the GPU.

Host microseconds per step = the wall time of ``generate``'s steps (each ``Engine.step``
and the loop around it) minus the model runner's ``forward`` and ``sample`` phases (the part
a CUDA graph replays on the GPU); of a round's steps the 20th percentile (other processes
only ever slow a step down), of the rounds the least disturbed one, the median beside it.  Each tree runs in its own process, the trees alternating
round by round (``--baseline DIR``: another checkout, e.g. ``git worktree add /tmp/main-base
main``), so that both see the same machine.  ``--text`` gives the requests a tokenizer (the
embedded SmolLM2's, its vocabulary sizing the model) and an ``on_token`` callback, so the
text is produced too.  ``--profile``: the top functions of a cProfile of 100 decode steps at
the largest batch, for this checkout, all of them and the host's alone (the model's code
left out; cProfile's own cost per call inflates loops of small calls).  Writes ``host-step-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import tree_commit, write_json

HERE = Path(__file__).resolve().parent
PROMPT_LEN = 16
WARMUP_STEPS = 20
TOP = 15


# --- the child: one tree, one batch -------------------------------------------------------------

def free_forward_backend():
    """The torch backend with a decode attention that reads nothing and a greedy sample in
    one op: the forward of a tiny model then costs a few torch calls."""
    from paged_tutorial.backends.torch_ref import TorchBackend

    class FreeForwardBackend(TorchBackend):
        name = "free-forward"

        def decode_attention(self, q, cache, block_table, layer, seq_lens, active_slots,
                             scale, max_seq_len=None):
            return q

        def sample(self, logits, temperature, top_p, uniforms):
            return logits.argmax(dim=-1)

    return FreeForwardBackend("cpu", check_inputs=False)


def tiny_model(text: bool):
    import paged_tutorial as pt
    from paged_tutorial.config import ModelConfig
    from paged_tutorial.loading.models import Model, random_model

    tokenizer = pt.load_model("smollm2-135m").tokenizer if text else None
    vocab = tokenizer.vocab_size if text else 256
    config = ModelConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=8, max_position_embeddings=4096, eos_token_ids=(2,))
    model = random_model(config)
    return Model(model.config, model.weights, tokenizer, model.dtype, model.source)


def child(batch: int, steps: int, text: bool, profile: bool) -> dict:
    import torch

    torch.set_num_threads(1)
    import paged_tutorial as pt

    engine = pt.Engine(tiny_model(text), backend=free_forward_backend(), max_slots=batch,
                       max_seq_len=PROMPT_LEN + WARMUP_STEPS + steps + 8)
    vocab = engine.config.vocab_size
    prompts = [[(7 * i + 3 * j) % (vocab - 3) + 3 for j in range(PROMPT_LEN)]
               for i in range(batch)]
    params = pt.SamplingParams(max_tokens=WARMUP_STEPS + steps, ignore_eos=True)
    marks, reports = [], []

    def on_step(report):
        marks.append(time.perf_counter())
        reports.append(report)

    on_token = (lambda i, token, piece: None) if text else None
    profiler = None
    if profile:
        import cProfile
        profiler = cProfile.Profile()

        def on_step(report, _record=on_step):      # noqa: F811 - profile the decode steps
            _record(report)
            n = len(reports)
            if n == WARMUP_STEPS:
                profiler.enable()
            elif n == WARMUP_STEPS + 100:
                profiler.disable()

    engine.generate(prompts, params, chat=False, on_step=on_step, on_token=on_token)
    # step i's wall time: from the end of step i-1 to the end of step i (the loop included)
    host, wall, model = [], [], []
    for i in range(WARMUP_STEPS + 1, len(reports)):
        report = reports[i]
        if report.kind != "decode" or report.num_tokens != batch:
            continue
        w = marks[i] - marks[i - 1]
        m = report.phase_seconds.get("forward", 0.0) + report.phase_seconds.get("sample", 0.0)
        wall.append(w)
        model.append(m)
        host.append(w - m)
    phases = {}
    for report in reports[WARMUP_STEPS + 1:]:
        if report.kind == "decode":
            for name, sec in report.phase_seconds.items():
                phases.setdefault(name, []).append(sec)
    out = {"batch": batch, "steps": len(host),
           "host_us_per_step": low(host) * 1e6,
           "host_us_median": statistics.median(host) * 1e6,
           "wall_us_per_step": low(wall) * 1e6,
           "forward_and_sample_us": low(model) * 1e6,
           "phase_us": {k: low(v) * 1e6 for k, v in phases.items()}}
    if profiler is not None:
        out["profile_top"] = top_functions(profiler)
        out["profile_top_host"] = top_functions(profiler, host_only=True)
    return out


def low(values: list[float]) -> float:
    """The 20th percentile: on a shared machine a step is often slowed by other processes
    (never sped up), so the lower part of the distribution is the engine's own cost."""
    return statistics.quantiles(values, n=5)[0]


#: code a CUDA graph replays on the GPU (the forward and sampling, this script's backend
#: among them), left out of the host view
MODEL_CODE = ("/paged_tutorial/model/", "/paged_tutorial/backends/", "/torch/",
              "/benchmarks/host_step.py")


def top_functions(profiler, host_only: bool = False) -> list[dict]:
    """The functions with the most time of their own (tottime), file paths shortened.
    ``host_only``: without the model's code (``MODEL_CODE``), and a built-in function
    counted only for the time it spent called from the rest."""
    import pstats

    def is_model(path: str) -> bool:
        return any(part in path for part in MODEL_CODE)

    stats = pstats.Stats(profiler).stats
    rows = []
    for (path, line, func), (cc, nc, tt, ct, callers) in stats.items():
        if host_only:
            if is_model(path):
                continue
            if path == "~":                  # a built-in: its time from host callers only
                parts = [v for caller, v in callers.items() if not is_model(caller[0])]
                nc, tt, ct = (sum(v[i] for v in parts) for i in (1, 2, 3))
                if not nc:
                    continue
        where = path.split("paged_tutorial/")[-1] if "paged_tutorial/" in path else \
            Path(path).name if path != "~" else ""
        rows.append({"function": f"{where}:{line}({func})" if where else func,
                     "calls": nc, "tottime_us": tt * 1e6, "cumtime_us": ct * 1e6})
    rows.sort(key=lambda r: -r["tottime_us"])
    return rows[:TOP]


# --- the parent: trees alternating ---------------------------------------------------------------

def run_child(tree: Path, batch: int, steps: int, text: bool, profile: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(HERE / "host_step.py"), "--child", "--batches", str(batch),
           "--steps", str(steps)] + (["--text"] if text else []) + \
        (["--profile"] if profile else [])
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(HERE))
    if res.returncode != 0:
        raise RuntimeError(f"{tree}: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another checkout to time alternately")
    ap.add_argument("--text", action="store_true", help="a tokenizer and on_token callbacks")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.batches[0], args.steps, args.text, args.profile)))
        return
    trees = {"this": HERE.parent}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    runs = {name: {b: [] for b in args.batches} for name in trees}
    for r in range(args.rounds):
        for batch in args.batches:
            for name, tree in trees.items():
                res = run_child(tree, batch, args.steps, args.text, False)
                runs[name][batch].append(res)
                print(f"round {r} B={batch} {name}: host {res['host_us_per_step']:.1f} us/step "
                      f"(wall {res['wall_us_per_step']:.1f})", file=sys.stderr)
    data = {"date": datetime.date.today().isoformat(), "machine": os.uname().machine,
            "cpus": os.cpu_count(), "steps": args.steps, "rounds": args.rounds,
            "text": args.text, "prompt_len": PROMPT_LEN,
            "what": "host microseconds per decode step (wall minus forward and sample): the "
                    "20th percentile over a round's steps, the least disturbed round "
                    "(host_us_per_step, its phases) and the median round",
            "trees": {}}
    for name, tree in trees.items():
        rows = []
        for batch in args.batches:
            rs = runs[name][batch]
            best = min(rs, key=lambda r: r["host_us_per_step"])
            rows.append({"batch": batch,
                         "host_us_per_step": best["host_us_per_step"],
                         "host_us_median_round": statistics.median(r["host_us_per_step"]
                                                                   for r in rs),
                         "wall_us_per_step": best["wall_us_per_step"],
                         "rounds": [round(r["host_us_per_step"], 1) for r in rs],
                         "phase_us": {k: round(v, 1) for k, v in best["phase_us"].items()}})
        data["trees"][name] = {"commit": tree_commit(tree), "rows": rows}
    if args.profile:
        prof = run_child(trees["this"], max(args.batches), 120, args.text, True)
        data["profile"] = {"batch": max(args.batches), "steps": 100,
                           "top_by_tottime": prof["profile_top"],
                           "top_host_by_tottime": prof["profile_top_host"]}
    for name, tree in data["trees"].items():
        for row in tree["rows"]:
            print(f"{name} ({tree['commit']}) B={row['batch']}: "
                  f"{row['host_us_per_step']:.1f} us host per step")
    stem = "host-step-text" if args.text else "host-step"
    write_json(data, stem, args.out)


if __name__ == "__main__":
    main()
