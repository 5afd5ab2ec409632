"""``KernelOptions``: which of ``NumbaBackend``'s kernels and fusions a backend uses.

The defaults are the engine's fastest path on this process's device; each switch turns one
optimisation off, so the benchmark ladder (``benchmarks/decode.py``, notebook 08) can time the
engine with and without it, and the tests can check a fast kernel against the plain one it
replaces.  One frozen object, passed as ``NumbaBackend(options=...)``.
"""

from __future__ import annotations

import dataclasses

#: the decode attention kernels: "auto" (the default: "tensor_core" for a batch of at least
#: ``attention_tc.MIN_BATCH`` sequences where it can run, "fast" otherwise), "fast"
#: (``kernels/attention_fast.py``), "article" (``kernels/attention.py``, the article's kernel)
#: or "tensor_core" (``kernels/attention_tc.py``: mma.sync on bf16; where it cannot run the
#: backend takes "fast" and says why in ``NumbaBackend.attention_fallback``)
ATTENTION_KERNELS = ("auto", "fast", "article", "tensor_core")
#: the prefill attention kernels: "sdpa" (torch's flash kernel, ``kernels/prefill_sdpa.py``)
#: or "numba" (``kernels/prefill.py``)
PREFILL_KERNELS = ("sdpa", "numba")


@dataclasses.dataclass(frozen=True)
class KernelOptions:
    """- ``attention``: the decode attention kernel (``ATTENTION_KERNELS``; "tensor_core" needs
      a bfloat16 cache, head_dim % 16 == 0, at most 16 query heads per KV head and compute
      capability 8.0, else "fast" runs, with a warning; "auto" takes it, without a warning,
      for batches where it measured faster);
    - ``prefill``: the prefill attention (``PREFILL_KERNELS``; None: "sdpa" on a GPU, "numba"
      in the simulator);
    - ``vector``: bf16 rows take the 16-byte kernels (``device/vector_io.py``) when aligned,
      and so does ``rope_write_kv`` in every dtype; False: always the scalar kernels (the
      reference the vector kernels are tested against);
    - ``gemv``: the Numba GEMV (``kernels/gemv.py``) replaces cuBLAS for bf16 at up to
      ``gemv.MAX_ROWS`` rows (None: on a GPU only; in the simulator every output row is a
      Python warp);
    - ``fuse_epilogues``: with the GEMV, RoPE and the cache write happen in the QKV GEMV's
      epilogue and the SwiGLU in the gate/up GEMV's (``gemv.py``); False: kernels of their
      own;
    - ``fuse_norms``: with the fused epilogues, a decoder layer is five kernels: the RMSNorms
      computed in the QKV and gate/up GEMVs' prologues (after their first weight loads are
      issued) and the residual adds in the output and down projections' epilogues; False
      (the default: on the H200 it measured slower, ``docs/measured.md``): the adds and
      norms as one ``add_rms_norm`` kernel before each of those GEMVs;
    - ``gemv_wave``: the GEMVs launch one block of ``gemv.WAVE_WARPS`` warps per row block
      (no loop): each block lets the next kernel be scheduled at its entry, issues all of its
      weight loads, holds them in registers and only then waits for the previous kernel; with
      ``fuse_norms`` each warp normalises the activations itself.  False: at most
      ``gemv.BLOCKS_PER_SM`` blocks per SM, each looping over row blocks
      (``gemv.wave_grid``);
    - ``overlap``: kernels written for it start under the previous kernel's tail
      (``device/grid_dependency.py``; on GPUs older than compute capability 9.0 they are
      launched plainly whatever this says).
    """

    attention: str = "auto"
    prefill: str | None = None
    vector: bool = True
    gemv: bool | None = None
    fuse_epilogues: bool = True
    fuse_norms: bool = False
    gemv_wave: bool = True
    overlap: bool = True

    def __post_init__(self):
        if self.attention not in ATTENTION_KERNELS:
            raise ValueError(f"KernelOptions: attention={self.attention!r}; choose one of "
                             f"{ATTENTION_KERNELS}")
        if self.prefill not in (None, *PREFILL_KERNELS):
            raise ValueError(f"KernelOptions: prefill={self.prefill!r}; choose one of "
                             f"{PREFILL_KERNELS} (or None for the device's default)")
