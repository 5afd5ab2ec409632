"""Wrong tokens from a race, looked for under load: many processes at once run the tiny engine
on the GPU and count the runs whose tokens differ.

    python benchmarks/overlap_race.py [--procs 12] [--seconds 55] [--out DIR]
    python benchmarks/overlap_race.py --backend torch --device cpu --procs 2 --seconds 5

Each process grades puzzle ``06.table_sync`` with its worked solution
(``table_sync.grade_on``) again and again for ``--seconds``: a stock engine and an engine whose
device block table the solution writes serve the same three requests on the tiny Llama, and
a grading fails when their tokens differ.  Alone, a race between kernels rarely shows; twelve
processes sharing one GPU make it show.  This is how the overlapped launches' rule was found
(``device/grid_dependency.py``: activations are read with coherent loads): with the
previous kernel's output read through the non-coherent path, 160 of 195 gradings failed on an
H200, with coherent loads none of 219.  Writes ``overlap-race-<date>.json`` (gradings, failed,
the first failures, whether overlapped launches were on); exits 1 when any grading failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time

from common import write_json


def worker(seconds: float, backend: str, device: str) -> dict:
    """Grade for ``seconds``; one JSON line of counts on stdout."""
    import paged_tutorial.teaching.exercises as ex
    from paged_tutorial.teaching.chapters.ch06_block_lifetime.table_sync import grade_on

    solution = ex.reveal("06.table_sync").code
    end = time.time() + seconds
    gradings, failures = 0, []
    while time.time() < end:
        gradings += 1
        try:
            grade_on(solution, backend=backend, device=device)
        except Exception as exc:                     # a wrong grading: keep what it said
            failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    return {"gradings": gradings, "failed": len(failures), "failures": failures[:3]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=12, help="processes at once (default 12)")
    p.add_argument("--seconds", type=float, default=55.0,
                   help="seconds each process grades for, its start-up included (default 55)")
    p.add_argument("--backend", default="numba")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None, help="folder for overlap-race-<date>.json "
                   "(default benchmarks/results)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.procs < 1 or args.seconds <= 0:
        p.error("--procs must be at least 1 and --seconds positive")
    if args.worker:
        print(json.dumps(worker(args.seconds, args.backend, args.device)), flush=True)
        return 0
    cmd = [sys.executable, __file__, "--worker", "--seconds", str(args.seconds),
           "--backend", args.backend, "--device", args.device]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.time()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(args.procs)]
    runs = []
    for proc in procs:
        out, err = proc.communicate()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            runs.append({"gradings": 0, "failed": 0, "error": err.strip()[-400:]})
        else:
            runs.append(json.loads(lines[-1]))
    data = {"benchmark": "overlap_race", "date": dt.date.today().isoformat(),
            "command": " ".join(["python", "benchmarks/overlap_race.py"] + (argv or sys.argv[1:])),
            "backend": args.backend, "device": args.device, "procs": args.procs,
            "seconds_each": args.seconds, "overlapped_launches": True,
            "gradings": sum(r["gradings"] for r in runs),
            "failed": sum(r["failed"] for r in runs),
            "processes_that_did_not_run": sum(1 for r in runs if "error" in r),
            "first_failures": [f for r in runs for f in r.get("failures", [])][:5],
            "errors": [r["error"] for r in runs if "error" in r][:2],
            "seconds": round(time.time() - t0, 1)}
    if args.device == "cuda":
        import torch

        data["gpu"] = torch.cuda.get_device_name(0)
    path = write_json(data, "overlap-race", args.out)
    print(f"{data['gradings']} gradings, {data['failed']} with wrong tokens, "
          f"{data['processes_that_did_not_run']} processes did not run; wrote {path}")
    return 1 if data["failed"] or data["processes_that_did_not_run"] else 0


if __name__ == "__main__":
    sys.exit(main())
