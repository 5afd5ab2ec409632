"""16-byte loads and stores, and bf16 packing: what the bandwidth-bound kernels are built from.

Hopper reaches its memory bandwidth when each lane moves 16 bytes per instruction;
Numba alone emits at most 8-byte accesses for array elements.  Two tiny intrinsics emit the
PTX vector instructions, the way numba-cuda makes its own cache-hint loads (``cuda.ldcs``):

- ``load_u32x4(a, i)`` / ``load_u32x4_nc(a, i)``: four consecutive int32 ``a[i..i+3]``
  (``ld.global.v4.u32``; ``_nc``: through the non-coherent read-only cache, for data that
  nothing writes while the kernel runs: weights, or a KV cache read by a kernel launched
  plainly).  A kernel launched to overlap its predecessor (``grid_dependency.py``) runs while
  that kernel still writes its output, so it reads that output with ``load_u32x4``: the
  compiler may move an ``_nc`` load above ``wait_for_previous_grid()``, and the read-only
  cache may hold what the memory held before;
- ``store_u32x4(a, i, w0, w1, w2, w3)``: ``st.global.v4.u32``.

``a`` is an int32 array and ``i % 4 == 0`` with ``a``'s data 16-byte aligned: the backend
checks the alignment on the host and takes the scalar kernels when it does not hold.  A bf16
tensor travels as int32 words of two bf16 each (little-endian: element 2j in the low half);
``unpack2`` / ``pack2`` convert a word from / to two float32, rounding to nearest even as
``dtypes.float_to_bf16_bits`` does.  ``unpack2_f16`` / ``pack2_f16`` do the same for a word of
two float16 (libdevice's ``half2float`` / ``float2half_rn``, round to nearest even as a float16
store does), and ``chunk_codec(dtype_name)`` turns the four words of a chunk into float32 values
and back for any storage dtype (8 bf16 or float16, 4 float32: ``chunk_elems``).  The simulator
gets plain Python functions with the same meaning, so the kernels have one source.
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int16, int32

from paged_tutorial.backends.numba_cuda.device.dtypes import float_to_bf16_bits
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING, libdevice

#: bytes per vector access
CHUNK_BYTES = 16
#: bf16 elements per 16-byte chunk, and int32 words per chunk
CHUNK_ELEMS = 8
CHUNK_WORDS = 4


def chunk_elems(itemsize: int) -> int:
    """Elements of ``itemsize`` bytes in one 16-byte chunk (8 for 2-byte dtypes, 4 for float32)."""
    return CHUNK_BYTES // itemsize


if SIMULATING:
    def load_u32x4(a, i):
        """Four consecutive int32 a[i..i+3] (i % 4 == 0)."""
        return (a[i], a[i + 1], a[i + 2], a[i + 3])

    load_u32x4_nc = load_u32x4

    def store_u32x4(a, i, w0, w1, w2, w3):
        """a[i..i+3] = w0..w3 (i % 4 == 0)."""
        a[i] = w0
        a[i + 1] = w1
        a[i + 2] = w2
        a[i + 3] = w3
else:                                            # pragma: no cover - GPU only
    from llvmlite import ir as _ir
    from numba import types as _types
    from numba.cuda import cgutils as _cgutils
    from numba.cuda.extending import intrinsic as _intrinsic

    def _element_pointer(context, builder, array_type, index_type, array, index):
        ary = context.make_array(array_type)(context, builder, value=array)
        idx = context.cast(builder, index, index_type, _types.intp)
        return _cgutils.get_item_pointer(context, builder, array_type, ary, [idx])

    def _make_load(opcode: str, ordered: bool):
        @_intrinsic
        def load(typingctx, array, index):
            sig = _types.UniTuple(_types.int32, 4)(array, index)

            def codegen(context, builder, sig, args):
                ptr = _element_pointer(context, builder, sig.args[0], sig.args[1], *args)
                i32 = _ir.IntType(32)
                fnty = _ir.FunctionType(_ir.LiteralStructType([i32] * 4), [ptr.type])
                asm = _ir.InlineAsm(fnty, opcode + " {$0, $1, $2, $3}, [$4];",
                                    "=r,=r,=r,=r,l", side_effect=ordered)
                res = builder.call(asm, [ptr])
                return context.make_tuple(builder, sig.return_type,
                                          [builder.extract_value(res, k) for k in range(4)])

            return sig, codegen
        return load

    #: four int32 in one load, kept in program order with the kernel's stores
    load_u32x4 = _make_load("ld.global.v4.u32", True)
    #: ... through the read-only (non-coherent) cache, free to move: only for data that no
    #: kernel writes during this kernel's lifetime (never an overlapped predecessor's output)
    load_u32x4_nc = _make_load("ld.global.nc.v4.u32", False)

    @_intrinsic
    def store_u32x4(typingctx, array, index, w0, w1, w2, w3):
        sig = _types.none(array, index, w0, w1, w2, w3)

        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig.args[0], sig.args[1], args[0],
                                   args[1])
            i32 = _ir.IntType(32)
            words = [context.cast(builder, v, t, _types.int32)
                     for v, t in zip(args[2:], sig.args[2:])]
            fnty = _ir.FunctionType(_ir.VoidType(), [ptr.type, i32, i32, i32, i32])
            asm = _ir.InlineAsm(fnty, "st.global.v4.u32 [$0], {$1, $2, $3, $4};",
                                "l,r,r,r,r", side_effect=True)
            builder.call(asm, [ptr] + words)
            return context.get_dummy_value()

        return sig, codegen


@cuda.jit(device=True)
def unpack2(w):
    """An int32 word holding two bf16 (element 2j low) -> (float32, float32)."""
    return (libdevice.int_as_float(int32(w << 16)),
            libdevice.int_as_float(int32((w >> 16) << 16)))


@cuda.jit(device=True)
def pack2(lo, hi):
    """Two float32 -> one int32 word of two bf16 (round to nearest even)."""
    return int32((int32(float_to_bf16_bits(lo)) & 0xFFFF) | (int32(float_to_bf16_bits(hi)) << 16))


@cuda.jit(device=True)
def unpack2_f16(w):
    """An int32 word holding two float16 (element 2j low) -> (float32, float32)."""
    return (libdevice.half2float(int16(int32(w << 16) >> 16)),
            libdevice.half2float(int16(w >> 16)))


@cuda.jit(device=True)
def pack2_f16(lo, hi):
    """Two float32 -> one int32 word of two float16 (round to nearest even)."""
    return int32((int32(libdevice.float2half_rn(lo)) & 0xFFFF)
                 | (int32(libdevice.float2half_rn(hi)) << 16))


@functools.lru_cache(maxsize=None)
def chunk_codec(dtype_name: str):
    """Device functions ``(decode, encode)`` for one storage dtype's 16-byte chunks:
    ``decode(w0, w1, w2, w3, out)`` writes the chunk's ``chunk_elems`` values as float32 into
    ``out[0..]``, ``encode(vals)`` returns the four words holding ``vals[0..]`` rounded to the
    dtype (nearest even), the bits a scalar ``store`` of each value would write."""
    if dtype_name == "float32":
        @cuda.jit(device=True)
        def decode(w0, w1, w2, w3, out):
            out[0] = libdevice.int_as_float(w0)
            out[1] = libdevice.int_as_float(w1)
            out[2] = libdevice.int_as_float(w2)
            out[3] = libdevice.int_as_float(w3)

        @cuda.jit(device=True)
        def encode(vals):
            return (libdevice.float_as_int(float32(vals[0])),
                    libdevice.float_as_int(float32(vals[1])),
                    libdevice.float_as_int(float32(vals[2])),
                    libdevice.float_as_int(float32(vals[3])))

        return decode, encode
    if dtype_name == "bfloat16":
        unpack, pack = unpack2, pack2
    elif dtype_name == "float16":
        unpack, pack = unpack2_f16, pack2_f16
    else:
        raise ValueError(f"chunk_codec: no 16-byte chunks for dtype {dtype_name!r}")

    @cuda.jit(device=True)
    def decode(w0, w1, w2, w3, out):
        a, b = unpack(w0)
        out[0] = a
        out[1] = b
        a, b = unpack(w1)
        out[2] = a
        out[3] = b
        a, b = unpack(w2)
        out[4] = a
        out[5] = b
        a, b = unpack(w3)
        out[6] = a
        out[7] = b

    @cuda.jit(device=True)
    def encode(vals):
        return (pack(vals[0], vals[1]), pack(vals[2], vals[3]), pack(vals[4], vals[5]),
                pack(vals[6], vals[7]))

    return decode, encode
