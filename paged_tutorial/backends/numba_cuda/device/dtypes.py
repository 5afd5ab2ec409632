"""Storage dtypes, written once: per-dtype device helpers ``load``, ``store`` and ``rnd``.

Tensors are stored as bfloat16 (default), float16 or float32; every kernel computes in float32.
A kernel never names a dtype: its factory receives a ``DtypeOps`` and calls

- ``load(a, i)``     -> element ``i`` of array ``a`` as float32,
- ``store(a, i, x)`` -> writes float32 ``x`` into ``a[i]``, rounded to nearest-even,
- ``rnd(x)``         -> ``x`` rounded to the storage dtype and back to float32 (what torch does
  between two ops on bf16 tensors, e.g. HF rounding cos/sin to the model dtype).

bfloat16 has no type in the Numba simulator (and is awkward in numba-cuda), so bf16 tensors are
handed to kernels as their bit patterns (``t.view(torch.int16)``): a bf16 is the upper half of a
float32, so ``bits << 16`` reinterpreted as float32 is its value, and float32 -> bf16 is
round-to-nearest-even on the float's bits (NaN -> 0x7FC0, as ``c10::BFloat16`` does).  The
reinterpretation uses ``libdevice.float_as_int / int_as_float`` on the GPU and NumPy views in
the simulator (``sim_shim.libdevice``): the same source for both.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from numba import cuda
try:        # numba-cuda 0.30 (Linux, Windows) has its own copy of Numba's type system
    from numba.cuda.types import float16, float32, int16, int32
except ImportError:         # numba-cuda 0.20.1 (macOS: simulator only) uses Numba's
    from numba.types import float16, float32, int16, int32

from paged_tutorial.backends.numba_cuda.device.sim_shim import libdevice

# --- bfloat16 (as int16 bit patterns) ----------------------------------------------------


@cuda.jit(device=True)
def bf16_bits_to_float(bits):
    """bf16 bit pattern (int16, sign-extended) -> float32: the bits become the float's top half."""
    return libdevice.int_as_float(int32(int32(bits) << int32(16)))


@cuda.jit(device=True)
def float_to_bf16_bits(x):
    """float32 -> bf16 bit pattern (as a signed 16-bit value), round to nearest even."""
    x = float32(x)
    if x != x:                                    # NaN stays NaN (canonical quiet NaN)
        return int16(0x7FC0)
    bits = libdevice.float_as_int(x)              # int32, negative for negative floats
    # Add 0x7FFF plus the lowest kept bit, then drop the low half: ties go to even.  In signed
    # arithmetic the result is already the int16 pattern (no overflow: NaNs were excluded).
    return int16((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16)


@cuda.jit(device=True)
def load_bf16(a, i):
    return bf16_bits_to_float(a[i])


@cuda.jit(device=True)
def store_bf16(a, i, x):
    a[i] = float_to_bf16_bits(x)


@cuda.jit(device=True)
def rnd_bf16(x):
    return bf16_bits_to_float(float_to_bf16_bits(x))


# --- float16 -----------------------------------------------------------------------------


@cuda.jit(device=True)
def load_f16(a, i):
    return float32(a[i])


@cuda.jit(device=True)
def store_f16(a, i, x):
    a[i] = float16(x)


@cuda.jit(device=True)
def rnd_f16(x):
    return float32(float16(x))


# --- float32 -----------------------------------------------------------------------------


@cuda.jit(device=True)
def load_f32(a, i):
    return float32(a[i])


@cuda.jit(device=True)
def store_f32(a, i, x):
    a[i] = float32(x)


@cuda.jit(device=True)
def rnd_f32(x):
    return float32(x)


class DtypeOps(NamedTuple):
    """What a kernel factory needs to know about one storage dtype."""

    name: str                 # "bfloat16" | "float16" | "float32"
    torch_dtype: torch.dtype  # the tensors' dtype
    kernel_dtype: torch.dtype  # what the kernel sees (bf16 -> int16 bit patterns)
    load: object
    store: object
    rnd: object


DTYPE_OPS = {
    "bfloat16": DtypeOps("bfloat16", torch.bfloat16, torch.int16, load_bf16, store_bf16, rnd_bf16),
    "float16": DtypeOps("float16", torch.float16, torch.float16, load_f16, store_f16, rnd_f16),
    "float32": DtypeOps("float32", torch.float32, torch.float32, load_f32, store_f32, rnd_f32),
}
_BY_TORCH = {ops.torch_dtype: ops for ops in DTYPE_OPS.values()}


def ops_for(dtype: torch.dtype) -> DtypeOps:
    """The helpers for a torch dtype, or a clear error for an unsupported one."""
    try:
        return _BY_TORCH[dtype]
    except KeyError:
        raise TypeError(f"numba backend: unsupported tensor dtype {dtype}; use one of "
                        f"{[str(d) for d in _BY_TORCH]}") from None
