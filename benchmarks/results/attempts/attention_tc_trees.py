"""The fast and the tensor-core decode attention kernels of two checkouts, side by side on a GPU.

    python benchmarks/results/attempts/attention_tc_trees.py old=/path/to/old new=. [--rounds 2]

Each ``label=folder`` is a checkout of the package (a folder holding ``paged_tutorial/``).  Every
round runs each tree in a fresh child process, in the order given, with the folder first on
``sys.path``; a child builds ``measure.attention_bench``'s caches (Llama-3.2-1B attention
shapes, blocks scattered at random, seed 0) at ``CASES``, checks both kernels against the float32
reference, and times each twice through ``gpu_timers.graph_ms``, keeping the better time.  The
parent prints one ``RESULT`` line per child: microseconds per call.

Run this way (from a copy of the tree before ``kernels/split_kv.py`` in ``abtest/old``, the
tree with it as ``.``) it gave ``attention-tc-split-kv-calls-2026-12-07.json``, with the
cases other than 16 / 2048 of ``benchmarks/attention.py``.  The script then also read each
kernel's registers from its dispatcher after timing, which failed in the first round (a
dispatcher loaded from the kernel cache has no ``py_func``), so only the second round's records
were printed; the registers in that file come from ``ptxas -v`` on the CPU machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CASES = [(8, 1024), (32, 2048), (64, 1024), (64, 2048)]


def child(folder: str) -> None:
    sys.path.insert(0, str(Path(folder).resolve()))
    import torch

    import paged_tutorial
    from paged_tutorial.measure.gpu_machine import setup_numba_env
    setup_numba_env()
    from paged_tutorial.measure import attention_bench as ab
    from paged_tutorial.measure.gpu_timers import N_INNER, graph_ms

    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    res = {"tree": paged_tutorial.__file__, "us": {}}
    for batch, ctx in CASES:
        cache, n_layers, _ = ab.build_cache(batch, ctx, g)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        slots = torch.randperm(batch, generator=g, device="cuda").to(torch.int32)
        q0 = torch.randn(batch, ab.N_Q, ab.D, generator=g, device="cuda").to(torch.bfloat16)
        impls = ab.decode_impls(cache, None)
        ref = ab.reference(q0, cache, 0, seq_lens, slots)
        row = {}
        for name in ("fast", "tensor_core", "fast", "tensor_core"):
            fn = impls[name]
            q = q0.clone()
            fn(q, 0, seq_lens, slots)
            torch.cuda.synchronize()
            if not ab.rel_err(q, ref) < 1e-2:
                raise SystemExit(f"{name} at {batch}/{ctx}: rel err {ab.rel_err(q, ref)}")
            qs = [q0.clone() for _ in range(N_INNER)]
            us = graph_ms(lambda i: fn(qs[i], i % n_layers, seq_lens, slots), N_INNER) * 1e3
            row[name] = min(row.get(name, float("inf")), us)
        res["us"][f"{batch}/{ctx}"] = {k: round(v, 2) for k, v in row.items()}
        del cache
    print("RESULT " + json.dumps(res), flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1])
        return 0
    rounds = 2
    if "--rounds" in argv:
        i = argv.index("--rounds")
        rounds = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    trees = dict(spec.split("=", 1) for spec in argv)
    for _ in range(rounds):
        for label, folder in trees.items():
            out = subprocess.run([sys.executable, __file__, "--child", folder],
                                 capture_output=True, text=True, timeout=300)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            print(label, lines[-1] if lines else (out.stderr or out.stdout)[-600:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
