"""The decode ladder timed on the reader's own GPU, in the notebook's process, for notebook 08
to draw beside the committed measurement.

    from paged_tutorial.teaching import decode_on_your_gpu
    yours = decode_on_your_gpu.measure()        # a results.Measured, like the committed runs
    print(yours.describe())                     # on which GPU, or why nothing was measured
    yours.data                                  # decode.py's schema (None when not measured)

``measure`` calls ``quick_run`` of ``paged_tutorial.measure.decode_ladder``: the same timing
code as the committed run (``benchmarks/decode.py`` calls that module too), with only the
ladder's variants and HF eager, about a minute on a recent GPU once the kernels are compiled
(the first run on a machine also compiles them).  Where kernels run in Numba's simulator (no
CUDA GPU), it measures nothing and says why.
"""

from __future__ import annotations

from paged_tutorial.teaching.results import Measured

__all__ = ["measure", "not_measured", "COMMAND"]

COMMAND = "python benchmarks/decode.py --quick"


def not_measured(reason: str = "not run: set RUN_ON_THIS_GPU = True in the cell above and "
                               "run it again to time the ladder on this machine's GPU") -> Measured:
    """A ``Measured`` with no data and ``reason`` as its description."""
    return Measured("decode on this GPU", None, None, reason)


def gpu_missing_reason() -> str | None:
    """Why the benchmark cannot run in this process, or None when it can."""
    from paged_tutorial.backends.numba_cuda import SIMULATING

    if SIMULATING:
        return ("No CUDA GPU in this process (its kernels run in Numba's simulator): nothing was "
                "timed here, the figures show the committed measurement only.")
    import torch

    if not torch.cuda.is_available():
        return ("torch sees no CUDA GPU: nothing was timed here, the figures show the committed "
                "measurement only.")
    return None


def measure(hf: bool = True, hf_static: bool = False, batches=(1, 64)) -> Measured:
    """Time the decode ladder on this process's GPU (``decode_ladder.quick_run``): a
    ``Measured`` holding data in the committed file's schema, or, when there is no GPU, none
    and the reason.  ``hf``: HF transformers eager beside it (needs
    ``transformers``); ``hf_static``: also its compiled static cache (20-30 s more per batch
    size)."""
    reason = gpu_missing_reason()
    if reason is not None:
        return not_measured(reason)
    from paged_tutorial.measure import decode_ladder

    data = decode_ladder.quick_run(batches=tuple(batches), hf=hf, hf_static=hf_static)
    return Measured("decode on this GPU", None, data,
                    f"measured now on {data['gpu']} ({data['seconds']:.0f} s): the decode "
                    f"ladder and {'HF eager' if hf and 'hf_error' not in data else 'no HF'}, "
                    f"the same timing code as `{COMMAND}`")
