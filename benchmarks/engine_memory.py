"""Peak host memory of building an engine: the weights held once (``loading/packed_weights.py``)
vs a revision that concatenated q/k/v and gate/up into new tensors while the engine kept the
model (``--before REF``).

Each measurement runs in a fresh process (peak RSS cannot be reset inside one): import torch and
the package, build random float32 weights of a model's shapes on the CPU, build an Engine on the
torch backend, run one short generate, and report the peak resident set size.  ``--before REF``
also measures the package as it was at git revision REF (checked out into a temporary worktree).

    python benchmarks/engine_memory.py --before 556fb72
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from common import write_json  # noqa: E402
MODELS = ("smollm2_135m_config", "llama_3_2_1b_config")

CHILD = r"""
import json, resource, sys
import torch
import paged_tutorial as pt
from paged_tutorial import config as C
def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
cfg = getattr(C, sys.argv[1])()
base = peak_mib()
model = pt.random_model(cfg, dtype="float32", seed=0)
after_model = peak_mib()
weights_mib = sum(t.numel() * t.element_size() for n, t in model.weights.items()) / 2**20
engine = pt.Engine(model, backend="torch", max_slots=1, max_seq_len=64,
                   kv_cache_bytes=16 * 2**20)
engine.generate([[1, 2, 3, 4]], max_tokens=2)
print(json.dumps({"config": sys.argv[1], "peak_rss_after_import_mib": round(base),
                  "peak_rss_after_weights_mib": round(after_model),
                  "peak_rss_after_engine_mib": round(peak_mib()),
                  "hf_named_weights_mib": round(weights_mib)}))
"""


def measure(package_root: Path, config_name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(package_root), "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", CHILD, config_name], env=env, check=True,
                         capture_output=True, text=True, cwd=package_root)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row["engine_minus_weights_mib"] = (row["peak_rss_after_engine_mib"]
                                       - row["peak_rss_after_weights_mib"])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", help="git revision to measure as 'before' (e.g. 556fb72)")
    ap.add_argument("--out", default=None, help="a .json file, or a folder for "
                    "engine-memory-<date>.json (default benchmarks/results)")
    args = ap.parse_args()
    result = {"what": "peak host RSS (MiB) of random float32 weights + Engine(torch backend, "
                      "1 slot, 16 MiB cache) + one 2-token generate, each in a fresh process",
              "date": date.today().isoformat(), "machine": f"{platform.machine()}, "
              f"{os.cpu_count()} cores", "python": platform.python_version(), "rows": []}
    roots = [("after", ROOT, None)]
    tmp = None
    if args.before:
        tmp = tempfile.mkdtemp(prefix="paged-before-")
        subprocess.run(["git", "worktree", "add", "--detach", tmp, args.before], cwd=ROOT,
                       check=True, capture_output=True)
        roots.insert(0, ("before", Path(tmp), args.before))
    try:
        for label, root, rev in roots:
            for name in MODELS:
                row = {"code": label, "revision": rev or "working tree", **measure(root, name)}
                print(row, flush=True)
                result["rows"].append(row)
    finally:
        if tmp:
            subprocess.run(["git", "worktree", "remove", "--force", tmp], cwd=ROOT, check=False)
    write_json(result, "engine-memory", args.out, indent=2)


if __name__ == "__main__":
    main()
