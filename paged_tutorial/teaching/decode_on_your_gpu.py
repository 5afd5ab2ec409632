"""The decode ladder timed on the reader's own GPU, in the notebook's process, for notebook 08
to draw beside the committed measurement.

    from paged_tutorial.teaching import decode_on_your_gpu
    yours = decode_on_your_gpu.measure()        # a results.Measured, like the committed runs
    print(yours.describe())                     # on which GPU, or why nothing was measured
    yours.data                                  # decode.py's schema (None when not measured)

``measure`` calls ``quick_run`` of ``benchmarks/decode.py`` (found beside the results folder,
as ``results`` finds it): the same timing code as the committed run, with only the ladder's
variants and HF eager, about a minute on a recent GPU once the kernels are compiled (the first
run on a machine also compiles them).  Where kernels run in Numba's simulator (no CUDA GPU),
or the benchmark script is not beside the package, it measures nothing and says why.
"""

from __future__ import annotations

import importlib.util
import sys

from paged_tutorial.teaching.results import Measured, results_dir

__all__ = ["measure", "not_measured", "COMMAND"]

COMMAND = "python benchmarks/decode.py --quick"
#: the name the benchmark script is imported under (``decode`` alone could be anything)
MODULE_NAME = "paged_tutorial_decode_benchmark"


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


def benchmark_module():
    """``benchmarks/decode.py``, imported once (its folder put on ``sys.path`` for its sibling
    ``common.py``); FileNotFoundError when the repository's benchmarks are not here."""
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    folder = results_dir().parent
    script = folder / "decode.py"
    if not script.is_file():
        raise FileNotFoundError(f"benchmarks/decode.py is not beside the results folder "
                                f"({folder.name}/): clone the repository to time your GPU")
    common = sys.modules.get("common")
    if common is not None and getattr(common, "__file__", None) != str(folder / "common.py"):
        raise ImportError("another module named 'common' is already imported in this process, "
                          "and decode.py needs its own benchmarks/common.py: restart the kernel "
                          "and run this cell before importing it")
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(MODULE_NAME, script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE_NAME] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[MODULE_NAME]
            raise
    finally:
        sys.path.remove(str(folder))
    return module


def measure(hf: bool = True, hf_static: bool = False, batches=(1, 64)) -> Measured:
    """Time the decode ladder on this process's GPU (``quick_run`` of ``benchmarks/decode.py``):
    a ``Measured`` holding data in the committed file's schema, or, when there is no GPU or no
    benchmark script, none and the reason.  ``hf``: HF transformers eager beside it (needs
    ``transformers``); ``hf_static``: also its compiled static cache (20-30 s more per batch
    size)."""
    reason = gpu_missing_reason()
    if reason is not None:
        return not_measured(reason)
    try:
        decode = benchmark_module()
    except FileNotFoundError as exc:
        return not_measured(f"{exc}; the figures show the committed measurement only.")
    data = decode.quick_run(batches=tuple(batches), hf=hf, hf_static=hf_static)
    return Measured("decode on this GPU", None, data,
                    f"measured now on {data['gpu']} ({data['seconds']:.0f} s): the decode "
                    f"ladder and {'HF eager' if hf and 'hf_error' not in data else 'no HF'}, "
                    f"the same timing code as `{COMMAND}`")
