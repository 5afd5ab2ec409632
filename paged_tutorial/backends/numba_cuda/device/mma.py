"""One tensor-core instruction: ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32``.

A warp multiplies a 16 x 16 bf16 matrix A by a 16 x 8 bf16 matrix B and adds a 16 x 8 float32
matrix C: ``D = A @ B + C``.  No lane holds a whole matrix; each holds a *fragment*, a few
registers at fixed places given by its lane id (PTX ISA, "Matrix Fragments for mma.m16n8k16
with floating point type"), with ``g = lane >> 2`` (the PTX's groupID, 0..7) and
``t = lane & 3`` (threadID_in_group, 0..3):

============  ==========================================  ============================
register      elements (low half = the lower index)       type
============  ==========================================  ============================
``a0``        A[g,     2t], A[g,     2t+1]                int32: two bf16
``a1``        A[g + 8, 2t], A[g + 8, 2t+1]                int32: two bf16
``a2``        A[g,     2t+8], A[g,     2t+9]              int32: two bf16
``a3``        A[g + 8, 2t+8], A[g + 8, 2t+9]              int32: two bf16
``b0``        B[2t,   g], B[2t+1, g]   (B is K x N)       int32: two bf16
``b1``        B[2t+8, g], B[2t+9, g]                      int32: two bf16
``c0, c1``    C[g,     2t], C[g,     2t+1]                float32
``c2, c3``    C[g + 8, 2t], C[g + 8, 2t+1]                float32
============  ==========================================  ============================

D comes back in C's places.  A word of two bf16 is what ``vector_io.pack2`` makes (and what an
int32 load of a bf16 array gives: element 2j in the low half).  "row.col": A is read by rows, B
by columns, which is what the fragments above say; nothing in memory is implied.

``mma_m16n8k16_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``:

- on the GPU, the PTX instruction itself through an llvmlite ``InlineAsm`` (the way
  ``vector_io`` emits its 16-byte loads), volatile like CUTLASS's ``asm volatile`` so that the
  compiler keeps it where every lane of the warp executes it.  It exists from compute capability
  8.0 (sm_80, PTX ISA 7.0); compiling it for an older target raises an error saying so.
- in the simulator, an emulation: every lane hands its ten operands to
  ``sim_shim.warp_collective`` (all 32 lanes must execute the same call, as ``.aligned``
  requires on hardware), the warp's A, B and C are put together from the fragments, D is
  computed once (products of bf16 are exact in float32; the sum is taken in float64 and rounded
  to float32 once, where the hardware's adder may round differently in the last bit) and each
  lane gets its four values.
"""

from __future__ import annotations

from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

#: the first compute capability with bf16 ``mma.sync`` (Ampere, sm_80)
FIRST_CC = (8, 0)

if SIMULATING:
    import numpy as np

    from paged_tutorial.backends.numba_cuda.device.sim_shim import warp_collective

    _LANE = np.arange(32)
    _G = _LANE >> 2
    _T = _LANE & 3

    def supported() -> bool:
        """The emulation runs anywhere."""
        return True

    def bf16_halves(words) -> tuple:
        """int32 words of two bf16 -> (low halves, high halves) as float32 arrays."""
        w = np.asarray(words, dtype=np.int64) & 0xFFFFFFFF
        lo = ((w & 0xFFFF) << 16).astype(np.uint32).view(np.float32)
        hi = (w & 0xFFFF0000).astype(np.uint32).view(np.float32)
        return lo, hi

    def warp_matrices(values):
        """The warp's A [16, 16], B [16, 8] and C [16, 8] (float32) from the 32 lanes'
        operands ``(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)``, by the fragment layouts."""
        words = np.array([[int(x) for x in v[:6]] for v in values], dtype=np.int64)
        accs = np.array([[float(x) for x in v[6:]] for v in values], dtype=np.float32)
        a = np.zeros((16, 16), np.float32)
        b = np.zeros((16, 8), np.float32)
        c = np.zeros((16, 8), np.float32)
        for r, (row, col) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):   # a0..a3
            lo, hi = bf16_halves(words[:, r])
            a[_G + row, 2 * _T + col] = lo
            a[_G + row, 2 * _T + col + 1] = hi
        for r, k in enumerate((0, 8)):                                      # b0, b1
            lo, hi = bf16_halves(words[:, 4 + r])
            b[2 * _T + k, _G] = lo
            b[2 * _T + k + 1, _G] = hi
        c[_G, 2 * _T] = accs[:, 0]
        c[_G, 2 * _T + 1] = accs[:, 1]
        c[_G + 8, 2 * _T] = accs[:, 2]
        c[_G + 8, 2 * _T + 1] = accs[:, 3]
        return a, b, c

    def _mma_warp(values):
        a, b, c = warp_matrices(values)
        d = (a.astype(np.float64) @ b.astype(np.float64) + c).astype(np.float32)
        return list(zip(d[_G, 2 * _T], d[_G, 2 * _T + 1], d[_G + 8, 2 * _T],
                        d[_G + 8, 2 * _T + 1]))

    def mma_m16n8k16_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A @ B + C for the warp; this lane's (d0, d1, d2, d3) (see the module
        docstring)."""
        return warp_collective("mma.sync", (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3),
                               _mma_warp)
else:                                            # pragma: no cover - GPU only
    from llvmlite import ir as _ir
    from numba import types as _types
    from numba.cuda.core import targetconfig as _targetconfig
    from numba.cuda.extending import intrinsic as _intrinsic

    def supported() -> bool:
        """This process's GPU has compute capability 8.0 or newer."""
        from numba import cuda

        return cuda.get_current_device().compute_capability >= FIRST_CC

    def _compiling_cc():
        """The compute capability of the compilation in progress (None: this GPU's)."""
        stack = _targetconfig.ConfigStack()
        cc = stack.top().compute_capability if stack else None
        return tuple(cc[:2]) if cc is not None else None

    _PTX = ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")

    @_intrinsic
    def mma_m16n8k16_bf16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A @ B + C for the warp; this lane's (d0, d1, d2, d3) (see the module
        docstring)."""
        args = (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
        sig = _types.UniTuple(_types.float32, 4)(*args)

        def codegen(context, builder, sig, llargs):
            cc = _compiling_cc()
            if cc is not None and cc < FIRST_CC:
                raise RuntimeError(
                    f"mma.sync.m16n8k16 with bf16 needs compute capability "
                    f"{FIRST_CC[0]}.{FIRST_CC[1]} (sm_80) or newer; this compilation is for "
                    f"{cc[0]}.{cc[1]}: use the CUDA-core kernels there")
            words = [context.cast(builder, v, t, _types.int32)
                     for v, t in zip(llargs[:6], sig.args[:6])]
            accs = [context.cast(builder, v, t, _types.float32)
                    for v, t in zip(llargs[6:], sig.args[6:])]
            i32, f32 = _ir.IntType(32), _ir.FloatType()
            fnty = _ir.FunctionType(_ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            asm = _ir.InlineAsm(fnty, _PTX, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
                                side_effect=True)
            res = builder.call(asm, words + accs)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_value(res, k) for k in range(4)])

        return sig, codegen
