"""The names notebooks 03-05 imported from ``viz.kernels`` before the split, kept so the
notebooks of the first round still run; their new homes:

- figures by chapter: ``viz.addresses`` (03), ``viz.warps`` (04, with its demo kernels),
  ``viz.softmax`` (05);
- the references the kernels are graded against: ``paged_tutorial.oracles``
  (``kernel_read_trace``, ``poisoned_copy``, ``online_softmax_trace``, ``oracle_decode``, ...);
- running the article's kernel: ``backends.numba_cuda.attention.decode``;
- recording a kernel's memory accesses: ``backends.numba_cuda.access_log``.

``record_decode_calls`` (which replaced a backend's method) is gone: wrap the backend in the
engine's recording backend instead.  This module goes when the notebooks are rewritten.
"""

from __future__ import annotations

import contextlib

from ..backends.numba_cuda import access_log
from ..backends.numba_cuda.access_log import AccessLog
from ..backends.numba_cuda.attention import decode as article_decode
from ..backends.numba_cuda.sim_shim import SIMULATING
from ..oracles import (ReadTrace, clone_cache, exact_attention, kernel_device,
                       kernel_read_trace, online_softmax_attention, online_softmax_trace,
                       oracle_decode, poisoned_copy, quiet_nan_arithmetic)
from .addresses import plot_address_by_token, plot_buffer_reads
from .softmax import plot_online_softmax_trace, plot_softmax_error
from .warps import (OFFSETS, WARP_SIZE, article_two_warp_dot, package_warp_sum,
                    plot_lane_diagram, shared_memory_races, shfl_down_model, shuffle_chain)

__all__ = [
    "SIMULATING", "ReadTrace", "kernel_read_trace", "article_decode", "quiet_nan_arithmetic",
    "clone_cache", "poisoned_copy", "kernel_device", "AccessLog", "log_kernel_accesses",
    "shuffle_chain", "shfl_down_model", "package_warp_sum", "article_two_warp_dot", "OFFSETS",
    "WARP_SIZE", "online_softmax_trace", "exact_attention", "online_softmax_attention",
    "oracle_decode", "shared_memory_races", "plot_buffer_reads", "plot_address_by_token",
    "plot_lane_diagram", "plot_online_softmax_trace", "plot_softmax_error",
]


@contextlib.contextmanager
def log_kernel_accesses(optional: bool = False, **tensors):
    """``access_log.record_kernel_accesses(**tensors)``; with ``optional=True`` it yields an
    empty dict on a GPU (where accesses cannot be recorded) instead of raising."""
    if optional and not access_log.AVAILABLE:
        yield {}
        return
    with access_log.record_kernel_accesses(**tensors) as logs:
        yield logs
