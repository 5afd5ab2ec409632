"""Helpers shared by ``attention.py`` and ``decode.py``: the GPU's two ceilings measured in the
same run, timing by CUDA-graph replay with events, and where results go."""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def gpu_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": dt.date.today().isoformat()}


def events_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` (already compiled), timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def graph_ms(fn, n_inner: int = 10, reps: int = 20) -> float:
    """Median milliseconds per call of ``fn(i)``: ``n_inner`` calls (i = 0..n_inner-1, e.g. to
    rotate among input sets) are captured in one CUDA graph, whose replays are timed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(n_inner, 2)):
            fn(i)                                       # compile / warm up outside capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n_inner):
            fn(i)
    return events_ms(graph.replay, reps=reps) / n_inner


def ceilings() -> dict:
    """Copy bandwidth (bytes read + written, 1 GiB device-to-device) and the bf16 matmul rate
    (8192^3, random data), measured now on this GPU."""
    n = 1 << 29                                           # 2^29 bf16 = 1 GiB
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = events_ms(lambda: dst.copy_(src), reps=20)
    copy_gbs = 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
    ms = events_ms(lambda: torch.matmul(a, b, out=c), reps=20)
    tflops = 2 * m ** 3 / (ms * 1e-3) / 1e12
    return {"copy_bandwidth_gbs": round(copy_gbs, 1), "bf16_matmul_tflops": round(tflops, 1)}


def write_json(data: dict, stem: str, out: str | None) -> Path:
    folder = Path(out) if out else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}-{data['date']}.json"
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return path


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def setup_numba_env() -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise SystemExit("benchmarks run on the GPU: unset NUMBA_ENABLE_CUDASIM")


def tree_commit(folder: Path) -> str | None:
    """The short git commit of the checkout holding ``folder`` (None outside a git checkout)."""
    try:
        res = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return res.stdout.strip() or None
