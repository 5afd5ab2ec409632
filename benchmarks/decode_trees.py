"""One change at a time: the numba engine's decode step in several checkouts, side by side.

    python benchmarks/decode_trees.py before=/path/to/old step1=/path/to/mid after=. \
        [--rounds 2] [--out DIR]

Each ``label=folder`` is a checkout of the package (a folder holding ``paged_tutorial/``).
Every round runs each tree in a fresh child process, in the order given, with the folder in
front of ``sys.path``, so the trees alternate and share the GPU's state (clocks, heat) as
fairly as one machine allows.  A child builds the decode ladder's model (Llama-3.2-1B shapes,
random bf16 weights, seed 0) and, at batch 1 and 64, first generates 24 greedy tokens per
request (compared with the first tree's: a change meant to be faster must not change them),
then times ``decode_ladder.time_engine`` (the default engine: graphs, overlapped launches), median ms
per step and the graph replay's GPU time.  The floors (the weights, and the weights plus the
K/V rows read at the mean context, over the copy speed measured at the end of the run, as
``decode.py`` computes them) give each tree's wall time as a ratio to the floor.  Writes ``decode-trees-<date>.json``: per tree its
folder, git commit, every round's figures, their medians, and whether its tokens equal the
first tree's.  Each tree must hold ``paged_tutorial/measure/decode_ladder.py`` (the child
times with the tree's own copy).  Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import tree_commit, write_json

BATCHES = (1, 64)
CHECK_TOKENS = 24


def child(folder: str) -> None:
    """In a child process: this tree's tokens and timings, one JSON line on stdout."""
    sys.path.insert(0, str(Path(folder).resolve()))
    import paged_tutorial
    from paged_tutorial.measure import decode_ladder as decode

    here = str(Path(paged_tutorial.__file__).resolve())
    if not here.startswith(str(Path(folder).resolve())):
        raise SystemExit(f"{folder}: imported paged_tutorial from {here}")
    model = decode.random_gpu_model()
    cfg = model.config
    out = {"weight_bytes": decode.weight_bytes(model),
           "kv_bytes_per_token": 2 * cfg.num_hidden_layers * cfg.kv_dim * 2,
           "mean_context": decode.PROMPT_LEN + decode.NEW_TOKENS / 2}
    for batch in BATCHES:
        engine = decode.make_engine(model, batch)
        prompts = decode.prompts_for(batch, decode.PROMPT_LEN, 1, model.config.vocab_size)
        results = engine.generate(prompts, decode.exactly(CHECK_TOKENS), chat=False)
        del engine
        out[str(batch)] = {"tokens": [r.token_ids for r in results],
                           **decode.time_engine(model, batch)}
    print("RESULT " + json.dumps(out), flush=True)


def run_child(folder: Path, timeout: float) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", str(folder)],
                         capture_output=True, text=True, timeout=timeout,
                         cwd=Path(__file__).resolve().parent)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode or not lines:
        return {"error": (res.stderr or res.stdout)[-600:]}
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="*", metavar="LABEL=FOLDER")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per child process")
    p.add_argument("--out", default=None, help="folder for decode-trees-<date>.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    trees = {}
    for spec in args.trees:
        label, sep, folder = spec.partition("=")
        if not sep or not label or not (Path(folder) / "paged_tutorial").is_dir():
            raise SystemExit(f"{spec!r}: give label=folder, the folder holding paged_tutorial/")
        trees[label] = Path(folder).resolve()
    if len(trees) < 2:
        raise SystemExit("give at least two trees, e.g. before=../old after=.")
    t0 = time.time()
    runs = {label: [] for label in trees}
    for r in range(args.rounds):
        for label, folder in trees.items():
            res = run_child(folder, args.timeout)
            runs[label].append(res)
            print(f"round {r} {label}: " + json.dumps(
                {b: {k: v for k, v in x.items() if k != "tokens"}
                 for b, x in res.items() if isinstance(x, dict)} if "error" not in res
                else res), flush=True)
    first = next(iter(trees))
    reference = next((x for x in runs[first] if "error" not in x), None)
    from paged_tutorial.measure.gpu_machine import ceilings, gpu_info

    data = {**gpu_info(), "model": "Llama-3.2-1B shapes, random bf16 weights",
            "check_tokens": CHECK_TOKENS, "rounds": args.rounds, "trees": {}}
    if reference is not None:                    # the floors, from this run's copy speed
        bandwidth = ceilings()["copy_bandwidth_gbs"] * 1e9
        data["copy_bandwidth_gbs"] = bandwidth / 1e9
        data["weight_floor_ms_per_step"] = reference["weight_bytes"] / bandwidth * 1e3
        data["floor_ms_per_step"] = {
            b: (reference["weight_bytes"] + b * reference["mean_context"]
                * reference["kv_bytes_per_token"]) / bandwidth * 1e3 for b in BATCHES}
    for label, folder in trees.items():
        good = [x for x in runs[label] if "error" not in x]
        entry = {"folder": os.path.relpath(folder), "commit": tree_commit(folder),
                 "errors": [x["error"] for x in runs[label] if "error" in x]}
        for b in map(str, BATCHES):
            ms = [x[b]["ms_per_step"] for x in good]
            gpu = [x[b]["gpu_ms_per_step"] for x in good if "gpu_ms_per_step" in x[b]]
            floor = data.get("floor_ms_per_step", {}).get(int(b))
            entry[f"batch_{b}"] = {
                "ms_per_step": statistics.median(ms) if ms else None,
                "gpu_ms_per_step": statistics.median(gpu) if gpu else None,
                "ms_per_step_over_floor": statistics.median(ms) / floor
                if ms and floor else None,
                "rounds_ms_per_step": ms, "rounds_gpu_ms_per_step": gpu,
                "tokens_equal_first_tree": bool(reference) and bool(good) and all(
                    x[b]["tokens"] == reference[b]["tokens"] for x in good)}
        data["trees"][label] = entry
    data["seconds"] = round(time.time() - t0, 1)
    write_json(data, "decode-trees", args.out)
    print("floors (ms per step):", data.get("floor_ms_per_step"))
    for label, e in data["trees"].items():
        print(label, {b: (e[f"batch_{b}"]["ms_per_step"], e[f"batch_{b}"]["gpu_ms_per_step"],
                          e[f"batch_{b}"]["ms_per_step_over_floor"],
                          e[f"batch_{b}"]["tokens_equal_first_tree"]) for b in BATCHES})
    return 0 if all(not e["errors"] for e in data["trees"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
