"""How long a fresh process takes to answer: the command line and the Python API, each run twice
in new processes (the first with an empty kernel cache folder, the second finding the kernels
the first compiled), plus the embedded GGUF loaded by this package and by transformers, side
by side.

    python benchmarks/cold_start.py                  # on a GPU: --backend numba
    python benchmarks/cold_start.py --backend torch --max-tokens 4 --skip-hf   # CPU smoke

Each process reports the seconds from its start to: ``import torch`` done, the model loaded,
the engine ready (created and warmed up: kernels compiled or loaded from the cache), the
first token of the answer; and the decode rate (tokens after the first / their time).  For the
command line (``python -m paged_tutorial PROMPT --backend B``, run through ``runpy`` so that
the import of torch can be timed) the load / compile figures are its own stderr report's, and
the moments its stderr lines start mark the phases between: ``backend_ready_s`` (the
"loading ..." line: package imports, the backend made and, for numba, test-launched, CUDA
started), then the load, then ``engine_ready_s`` (the "[backend ...]" line: the engine created,
its KV cache allocated, warmed up).  Of the kernel seconds, ``kernel_key_s`` went into cache
keys and ``first_kernel_lookup_s`` is the first lookup (Numba's one-time CUDA target set-up).
The goal on the H200: the second process has its first token within 3 s of ``import torch``
finishing (``first_token_after_torch_s``).

The GGUF comparison loads the embedded SmolLM2 in float32 with this package and with
transformers (``LlamaForCausalLM.from_pretrained(gguf_file=...)``, which dequantizes on the
host; moved to the GPU after), onto the CPU and, where there is one, the GPU; a loader that
fails leaves its list empty and its reason under ``gguf_load_s.errors``.  The options the run
was given are kept under ``options``.

Writes ``cold-start-<date>.json`` (date and device inside) into ``--out`` (default
``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is the capital of France?"

# --- the child processes ------------------------------------------------------------------------

CLI_CHILD = r"""
import json, runpy, sys, time
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter() - t0

class FirstWrite:                       # when the answer's first piece reaches stdout
    def __init__(self, stream):
        self.stream, self.first = stream, None
    def write(self, text):
        if self.first is None and text.strip():
            self.first = time.perf_counter() - t0
        return self.stream.write(text)
    def flush(self):
        self.stream.flush()
    def isatty(self):
        return False

class LineTimes:                        # when each stderr line starts (the CLI's phase lines)
    def __init__(self, stream):
        self.stream, self.times, self.at_line_start = stream, [], True
    def write(self, text):
        if self.at_line_start and text:
            self.times.append([time.perf_counter() - t0, text[:40]])
        if text:
            self.at_line_start = text.endswith("\n")
        return self.stream.write(text)
    def flush(self):
        self.stream.flush()
    def isatty(self):
        return False

out = sys.stdout = FirstWrite(sys.stdout)
err = sys.stderr = LineTimes(sys.stderr)
argv = json.loads(sys.argv[1])
sys.argv = ["paged_tutorial", *argv]
code = 0
try:
    runpy.run_module("paged_tutorial", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
sys.stdout, sys.stderr = out.stream, err.stream
# the CLI prints "loading ..." once its backend is made (and test-launched), "[backend ...]"
# once the engine is created and warmed up
starts = {"loading": "backend_ready_s", "[backend": "engine_ready_s"}
phases = {name: next((t for t, text in err.times if text.startswith(prefix)), None)
          for prefix, name in starts.items()}
cache = sys.modules.get("paged_tutorial.backends.numba_cuda.runtime.kernel_cache")
stats = {} if cache is None else {
    "kernel_load_s": cache.COMPILE_STATS.load_seconds,
    "kernel_key_s": cache.COMPILE_STATS.key_seconds,
    "first_kernel_lookup_s": cache.COMPILE_STATS.first_lookup_seconds}
print("\nCOLD_START " + json.dumps({"import_torch_s": t_torch, "first_token_s": out.first,
                                    **phases, **stats,
                                    "total_s": time.perf_counter() - t0, "exit": code}))
"""

API_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter() - t0
import paged_tutorial as pt
args = json.loads(sys.argv[1])
t_import = time.perf_counter() - t0
model = pt.load_model(args["model"], device="cuda" if torch.cuda.is_available() else None)
t_load = time.perf_counter() - t0
engine = pt.Engine(model, backend=args["backend"])
t_engine = time.perf_counter() - t0
engine.warm_up()
t_ready = time.perf_counter() - t0
first = []
result = engine.generate([args["prompt"]], max_tokens=args["max_tokens"], seed=0,
                         chat=args["chat"],
                         on_token=lambda *a: first or first.append(time.perf_counter() - t0))[0]
stats = sys.modules.get("paged_tutorial.backends.numba_cuda.runtime.kernel_cache")
stats = stats.COMPILE_STATS if stats is not None else None
print("COLD_START " + json.dumps({
    "import_torch_s": t_torch, "import_package_s": t_import, "loaded_s": t_load,
    "engine_created_s": t_engine, "engine_ready_s": t_ready,
    "first_token_s": first[0] if first else None, "total_s": time.perf_counter() - t0,
    "decode_tokens_per_s": result.decode_tokens_per_s, "tokens": len(result.token_ids),
    "dtype": model.dtype, "dtype_reason": model.dtype_reason, "answer": result.text,
    "kernels_compiled": stats.compiled if stats else 0,
    "kernels_from_cache": stats.loaded if stats else 0,
    "compile_s": stats.seconds if stats else 0.0,
    "kernel_key_s": stats.key_seconds if stats else 0.0,
    "first_kernel_lookup_s": stats.first_lookup_seconds if stats else None}))
"""

GGUF_CHILD = r"""
import json, sys, time
import torch
import paged_tutorial as pt
from paged_tutorial.loading.models import find_embedded_smollm2
path = find_embedded_smollm2()
reps, with_hf = int(sys.argv[1]), sys.argv[2] == "1"
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

def timed(load, device):
    if device != "cpu":
        torch.cuda.synchronize()
    t = time.perf_counter()
    model = load(device)
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - t

def ours(device):
    return pt.load_model("smollm2-135m", "float32", device=device)

def hf(device):              # transformers dequantizes on the host, then the model moves
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                             dtype=torch.float32)
    return model.to(device)

times = {f"ours_{d}": [] for d in devices}
times.update({f"hf_{d}": [] for d in devices})
errors = {}
if not with_hf:
    errors["hf"] = "skipped (--skip-hf)"
for device in devices:
    for _ in range(reps):
        times[f"ours_{device}"].append(timed(ours, device))
        if with_hf and "hf" not in errors:
            try:
                times[f"hf_{device}"].append(timed(hf, device))
            except Exception as exc:            # recorded: the comparison says why it is empty
                errors["hf"] = f"{type(exc).__name__}: {exc}"[:2000]
print("COLD_START " + json.dumps({"times": times, "errors": errors}))
"""

CLI_REPORT = re.compile(r"loaded in (?P<load>[0-9.]+) s(, compiled in (?P<compile>[0-9.]+) s "
                        r"\((?P<compiled>\d+) kernels compiled, (?P<cached>\d+) from the cache\))?"
                        r"(, first token after (?P<ttft>[0-9.]+) s)?(, (?P<tps>[0-9.e+]+) tok/s "
                        r"decode)?")


def _run(code: str, args: list[str], env: dict, timeout: int) -> tuple[dict, str, str]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("COLD_START ")),
                None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"child failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    data = json.loads(line[len("COLD_START "):])
    if isinstance(data, dict) and "total_s" in data:
        data["wall_s"] = wall
    return data, done.stdout, done.stderr


def _after_torch(data: dict) -> None:
    if data.get("first_token_s") is not None:
        data["first_token_after_torch_s"] = data["first_token_s"] - data["import_torch_s"]


def cli_run(args, env) -> dict:
    argv = [args.prompt, "--backend", args.backend, "--model", args.model,
            "--max-tokens", str(args.max_tokens), "--seed", "0"] + \
        (["--no-chat"] if args.no_chat else [])
    data, stdout, stderr = _run(CLI_CHILD, [json.dumps(argv)], env, args.timeout)
    if data["exit"] != 0:
        raise RuntimeError(f"the CLI failed:\n{stderr[-4000:]}")
    data["answer"] = stdout.split("\nCOLD_START ")[0].strip()
    report = next((m for m in map(CLI_REPORT.search, reversed(stderr.splitlines())) if m), None)
    if report is not None:
        for key, name, cast in (("load", "loaded_in_s", float), ("compile", "compile_s", float),
                                ("compiled", "kernels_compiled", int),
                                ("cached", "kernels_from_cache", int),
                                ("ttft", "request_first_token_s", float),
                                ("tps", "decode_tokens_per_s", float)):
            if report.group(key) is not None:
                data[name] = cast(report.group(key))
    data["stderr_lines"] = [x for x in stderr.splitlines() if x.startswith(("loading", "["))]
    _after_torch(data)
    return data


def api_run(args, env) -> dict:
    data, _, _ = _run(API_CHILD, [json.dumps({"model": args.model, "backend": args.backend,
                                              "prompt": args.prompt,
                                              "max_tokens": args.max_tokens,
                                              "chat": not args.no_chat})],
                      env, args.timeout)
    _after_torch(data)
    return data


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default=None, help="default: numba on a GPU, else torch")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--no-chat", action="store_true", help="the prompt without chat template")
    ap.add_argument("--gguf-reps", type=int, default=2, help="GGUF loads of each loader")
    ap.add_argument("--skip-hf", action="store_true", help="time only this package's GGUF load")
    ap.add_argument("--skip-gguf", action="store_true", help="no GGUF load comparison")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per child process")
    ap.add_argument("--out", default=None, help="folder for cold-start-<date>.json")
    args = ap.parse_args(argv)
    device = device_name()
    args.backend = args.backend or ("numba" if device != "cpu" else "torch")

    results = {"date": dt.date.today().isoformat(), "device": device, "backend": args.backend,
               "model": args.model, "prompt": args.prompt,
               "max_tokens": args.max_tokens, "python": sys.version.split()[0],
               "options": vars(args)}
    with tempfile.TemporaryDirectory(prefix="cold-start-kernels-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONUNBUFFERED": "1"}
        if args.backend == "numba":
            env.pop("NUMBA_ENABLE_CUDASIM", None)
        for name, run in (("cli", cli_run), ("api", api_run)):
            empty_folder(cache)                     # the first process finds an empty cache
            first = run(args, env)
            second = run(args, env)
            results[name] = {"first_process": first, "second_process": second}
            print(f"{name}: first token after torch {_fmt(first)} s (first process), "
                  f"{_fmt(second)} s (second)", file=sys.stderr)
    if not args.skip_gguf:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        data, _, _ = _run(GGUF_CHILD, [str(args.gguf_reps), "0" if args.skip_hf else "1"],
                          env, args.timeout)
        results["gguf_load_s"] = {k: {"each": v, "best": min(v) if v else None}
                                  for k, v in data["times"].items()}
        results["gguf_load_s"]["errors"] = data["errors"]
        for key, value in results["gguf_load_s"].items():
            if key.startswith("ours_"):
                other = results["gguf_load_s"][key.replace("ours_", "hf_")]["best"]
                print(f"GGUF load to {key[5:]}: ours {value['best']:.2f} s, transformers "
                      + (f"{other:.2f} s" if other is not None
                         else data["errors"].get("hf", "?")), file=sys.stderr)
    second = results["cli"]["second_process"].get("first_token_after_torch_s")
    results["target"] = {"second_process_first_token_after_torch_s": second,
                         "goal_s": 3.0, "met": second is not None and second <= 3.0}
    from paged_tutorial.measure.result_files import write_json

    write_json(results, "cold-start", args.out or RESULTS)
    return 0


def empty_folder(folder: str) -> None:
    """Empty ``folder`` (kept: it is the kernel cache the children share)."""
    for entry in Path(folder).iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _fmt(data: dict) -> str:
    value = data.get("first_token_after_torch_s")
    return "?" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
