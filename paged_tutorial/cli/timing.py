"""The figures after each answer: where the time went (loading, compiling, the first token,
the decode rate), as a line on standard error and as a ``--json`` object's ``timings``."""

from __future__ import annotations

import sys
import time

KERNEL_CACHE_MODULE = "paged_tutorial.backends.numba_cuda.runtime.kernel_cache"


def plain_rate(rate: float) -> str:
    """A rate as a plain number, three significant digits below 1000 and whole above: 1110,
    690, 12.3, 0.25 -- never ``1.11e+03``."""
    if rate >= 1000:
        return f"{rate:.0f}"
    if rate >= 1e-4:
        return f"{rate:.3g}"
    return f"{rate:.4f}"


def compile_stats():
    """The numba backend's count of kernels compiled / loaded, if it was imported."""
    module = sys.modules.get(KERNEL_CACHE_MODULE)
    return module.COMPILE_STATS if module is not None else None


def compile_stats_now():
    """A copy of ``compile_stats()`` as it stands (None: the numba backend not imported)."""
    stats = compile_stats()
    return stats.snapshot() if stats is not None else None


class StartTiming:
    """The figures printed after each answer: ``loaded in X s, compiled in Y s (N kernels
    compiled, M from the cache), first token after Z s, R tok/s decode``.  Loading counts
    reading the weights; compiling, the time Numba spent compiling kernels or loading them
    from the disk cache (numba backend only); the first token, from the request's arrival
    (after the engine's warm-up); the rate, decode steps only (kernel compiles that happened
    while decoding are taken out)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.load_s = None
        self.compiles_before = compile_stats_now()   # a process may have compiled before

    def compiles_since_start(self):
        """The kernels compiled or loaded since this run started (None: no numba backend)."""
        now = compile_stats_now()
        if now is None or self.compiles_before is None:
            return now
        return now.since(self.compiles_before)

    def loaded(self) -> None:
        self.load_s = time.perf_counter() - self.start

    @staticmethod
    def decode_rate(result, compiling_while_decoding: float = 0.0) -> float | None:
        """Decode tokens per second, compile time taken out; None with fewer than 2 tokens."""
        n = len(result.token_ids)
        if n < 2 or result.total_time_s is None or result.time_to_first_token_s is None:
            return None
        decoding = result.total_time_s - result.time_to_first_token_s - \
            max(0.0, compiling_while_decoding)
        return (n - 1) / decoding if decoding > 0 else None

    def timings(self, result, compiling_while_decoding: float = 0.0, stats=None) -> dict:
        """The figures as a ``--json`` object's ``timings`` (seconds; None where not known)."""
        return {"load_s": self.load_s,
                "compile_s": stats.seconds if stats is not None else None,
                "first_token_s": result.time_to_first_token_s,
                "total_s": result.total_time_s,
                "decode_tokens_per_s": self.decode_rate(result, compiling_while_decoding)}

    def report(self, result, compiling_while_decoding: float = 0.0, stats=None) -> str:
        parts = []
        if self.load_s is not None:
            parts.append(f"loaded in {self.load_s:.2f} s")
        if stats is not None and (stats.compiled or stats.loaded):
            parts.append(f"compiled in {stats.seconds:.2f} s ({stats.compiled} kernels "
                         f"compiled, {stats.loaded} from the cache)")
        if result.time_to_first_token_s is not None:
            parts.append(f"first token after {result.time_to_first_token_s:.3f} s")
        rate = self.decode_rate(result, compiling_while_decoding)
        if rate is not None:
            parts.append(f"{plain_rate(rate)} tok/s decode")
        return "".join(f", {p}" for p in parts)
