"""One warp's ``mma_m16n8k16_bf16`` with every lane loading its fragments by the PTX layouts:
the kernel the simulator's and the GPU's tests of the instruction both launch."""

from __future__ import annotations

from numba import cuda

from paged_tutorial.backends.numba_cuda.device.mma import mma_m16n8k16_bf16


@cuda.jit
def mma_kernel(a32, bt32, c, d):
    """One warp: A [16, 16] bf16 as words [16, 8], B^T [8, 16] (B's columns) as words [8, 8],
    C and D [16, 8] float32; each lane loads its fragments by the PTX layouts."""
    lane = cuda.threadIdx.x
    g = lane >> 2
    t = lane & 3
    d0, d1, d2, d3 = mma_m16n8k16_bf16(
        a32[g * 8 + t], a32[(g + 8) * 8 + t], a32[g * 8 + t + 4], a32[(g + 8) * 8 + t + 4],
        bt32[g * 8 + t], bt32[g * 8 + t + 4],
        c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
        c[(g + 8) * 8 + 2 * t + 1])
    d[g * 8 + 2 * t] = d0
    d[g * 8 + 2 * t + 1] = d1
    d[(g + 8) * 8 + 2 * t] = d2
    d[(g + 8) * 8 + 2 * t + 1] = d3
