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
``dtypes.float_to_bf16_bits`` does.  The simulator gets plain Python functions with the same
meaning, so the kernels have one source.
"""

from __future__ import annotations

from numba import cuda, int32

from paged_tutorial.backends.numba_cuda.device.dtypes import float_to_bf16_bits
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING, libdevice

#: bf16 elements per 16-byte chunk, and int32 words per chunk
CHUNK_ELEMS = 8
CHUNK_WORDS = 4

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

