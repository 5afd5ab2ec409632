"""Overlapping one kernel's start with the previous kernel's end (Hopper's programmatic
dependent launch).

A decode step is a chain of short kernels, each reading what the one before wrote.  Launched
plainly, kernel N+1 starts only after every block of kernel N has finished and its writes are
flushed: the GPU idles while the last blocks of N drain and while N+1's blocks are scheduled
and issue their first loads.  At batch 1 most of a step's kernels last 2-15 us, so these ramps
are a large share of the step.

On compute capability 9.0 a kernel can be launched with *programmatic stream serialization*
(``runtime/launch.py``, ``overlapping``): its blocks may start while the previous kernel still
runs.  Two PTX instructions then order the work:

- ``wait_for_previous_grid()`` (``griddepcontrol.wait``): blocks until the previous kernel has
  completed and its memory is visible.  Everything before it may only read data that kernel does
  not write: a GEMV issues its *weight* loads before it (weights never change during a step)
  and reads the activations after it.
- ``allow_next_grid()`` (``griddepcontrol.launch_dependents``): lets the next kernel's blocks be
  scheduled once every block of this one has called it (or exited).  They then run their own
  prologue in the SM slots this kernel's finishing blocks give back.

Correctness rests on two rules, kept by every kernel launched this way:

- each block calls ``wait_for_previous_grid()`` before it reads any activation, and before it
  returns, so that a kernel can only complete after its predecessor did (which makes the
  ordering transitive along the chain);
- activations are read with coherent loads (``vector_io.load_u32x4``, plain array reads),
  never through the non-coherent read-only path (``load_u32x4_nc``, PTX ``ld.global.nc``):
  that path promises the data does not change during the kernel's lifetime, which an
  overlapped kernel's lifetime breaks, and the compiler may hoist such a load above the wait
  (``benchmarks/overlap_race.py`` shows the wrong tokens that follows; ``docs/measured.md``
  has its figures).  ``tests/kernels/test_overlap_loads.py`` keeps ``load_u32x4_nc`` to
  weights in the modules of overlapping kernels.

A kernel without the attribute (cuBLAS, torch's own kernels) waits for its
predecessor in full, as usual, and the instructions are no-ops when there is no programmatic
predecessor.  Code compiled for a compute capability below 9.0 (an older GPU, or
``cuda.compile(..., cc=(7, 5))`` for a T4 on any machine) has no such instructions at all: the
lowering reads the capability being compiled for, not the GPU in the machine.  In the
simulator both functions do nothing: its kernels run one after another.
"""

from __future__ import annotations

from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

if SIMULATING:
    def supported() -> bool:
        """The simulator runs kernels one after another: nothing to overlap."""
        return False

    def wait_for_previous_grid():
        """No-op in the simulator (kernels run one at a time there)."""
        return None

    def allow_next_grid():
        """No-op in the simulator."""
        return None
else:                                            # pragma: no cover - GPU only
    from llvmlite import ir as _ir
    from numba import types as _types
    from numba.cuda.core import targetconfig as _targetconfig
    from numba.cuda.extending import intrinsic as _intrinsic

    #: the first compute capability with programmatic dependent launch
    FIRST_CC = (9, 0)

    def supported() -> bool:
        """This process's GPU has compute capability 9.0 or newer: the instructions exist."""
        from numba import cuda

        return cuda.get_current_device().compute_capability >= FIRST_CC

    def _compiling_for_supported_cc() -> bool:
        """The compute capability of the compilation in progress (Numba's flags: the current
        device's for a kernel launch, the one asked for by ``cuda.compile(cc=...)``)."""
        stack = _targetconfig.ConfigStack()
        cc = stack.top().compute_capability if stack else None
        if cc is None:                            # not inside a compilation: this GPU's
            return supported()
        return tuple(cc[:2]) >= FIRST_CC

    def _instruction(ptx: str):
        @_intrinsic
        def instruction(typingctx):
            sig = _types.none()

            def codegen(context, builder, sig, args):
                if not _compiling_for_supported_cc():
                    return context.get_dummy_value()
                fnty = _ir.FunctionType(_ir.VoidType(), [])
                # a memory clobber: no load or store of the kernel moves across it
                asm = _ir.InlineAsm(fnty, ptx, "~{memory}", side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()

            return sig, codegen
        return instruction

    #: griddepcontrol.wait: the previous kernel has completed and its writes are visible
    wait_for_previous_grid = _instruction("griddepcontrol.wait;")
    #: griddepcontrol.launch_dependents: the next kernel may be scheduled
    allow_next_grid = _instruction("griddepcontrol.launch_dependents;")
