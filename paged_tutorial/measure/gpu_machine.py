"""The GPU being measured: what it is, and its two ceilings (copy bandwidth, bf16 matmul rate)
measured in the same run as the figures they bound."""

from __future__ import annotations

import datetime as dt
import os

import torch

from paged_tutorial.measure.gpu_timers import events_ms


def gpu_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"gpu": torch.cuda.get_device_name(0), "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1), "torch": torch.__version__,
            "cuda": torch.version.cuda, "date": dt.date.today().isoformat()}


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


def setup_numba_env() -> None:
    """Stop a GPU benchmark that would time Numba's simulator instead of the GPU."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        raise SystemExit("benchmarks run on the GPU: unset NUMBA_ENABLE_CUDASIM")
