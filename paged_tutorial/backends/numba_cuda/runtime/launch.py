"""Glue between torch tensors and Numba kernels, identical for the GPU and the simulator.

- ``as_kernel_array(t)``: a torch tensor -> what a kernel receives, sharing memory (results
  land in the torch tensor).  bf16 goes as its int16 bit patterns (``dtypes.py``).  In the
  simulator: the tensor's NumPy view wrapped so the simulator does not copy it in and out (or,
  while ``access_log.record_kernel_accesses`` names the tensor, a stand-in that records every
  element access); on the GPU: a ``GpuArray`` (pointer, shape, Numba type: see "Launching on
  the GPU" below).
- ``rows(t)``: a 1-D kernel view over a tensor whose rows may be strided (e.g. q sliced out of a
  fused QKV projection) plus the row stride, in elements.  Each row itself must be contiguous.
  ``rows(t, words=True)``: the same as int32 words (two bf16 per word) for the 16-byte kernels.
- ``launch(kernel, grid, block, *args)``: on the GPU the kernel goes onto torch's current stream,
  so it is ordered with the surrounding torch ops and can be captured in a CUDA graph; in the
  simulator it runs with a short thread switch interval (``sim_shim.fast_thread_switching``).
- Launch sizes differ on purpose: the same kernel runs with 256-thread blocks on the GPU and
  with 64-thread blocks, and few of them, in the simulator, where every thread is a Python
  thread.  Kernels are written with grid-stride loops so that both are correct.

Launching on the GPU: why not ``kernel[grid, block, stream](*args)``
--------------------------------------------------------------------
Numba's launch path converts every argument on every call: ``cuda.as_cuda_array`` on a torch
tensor builds a device-array object from ``__cuda_array_interface__``, the dispatcher types each
argument to pick the compiled overload, then marshals each one into ctypes values.  For a
15-argument kernel that is far more host time than the kernel runs at decode sizes (the
figures are in ``docs/measured.md``, host time per launch).  The launcher here does that work
once per *signature*:

- a tensor argument becomes a ``GpuArray``: its data pointer, shape and Numba type, read from
  the tensor's attributes (no views, no interface dictionaries);
- the first launch of a kernel with a given tuple of argument types compiles it
  (``dispatcher.compile``, as Numba's own first call does) and keeps the compiled kernel and
  how each argument becomes parameter values (an array is meminfo, parent, nitems, itemsize,
  data, shape..., strides...; Python ints are int64, floats float64), as Numba would pass them;
- each launch packs the values into one reusable parameter buffer and calls the driver's
  ``cuLaunchKernel`` (CUDA Python binding) on torch's current stream (``_RawLauncher``), or
  ``cuLaunchKernelEx`` for an overlapped launch.  Return codes are checked.

Anything the launcher cannot take (other argument kinds, a kernel compiled for debugging or
cooperative launch, a launcher that fails on its first launch: the error is kept in
``FAST_LAUNCH_ERRORS``) goes through Numba's own launch, which is always correct.

Nothing is cached by pointer, so a freed and reused allocation cannot leave a stale argument
behind.  Arguments of other kinds (Numba device arrays, a non-contiguous view) go through
Numba's ordinary launch.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

import torch
from numba import cuda

from paged_tutorial.backends.numba_cuda.runtime import access_log
from paged_tutorial.backends.numba_cuda.device import sim_shim
from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

#: threads per block for row kernels (one block per row) and grid-stride elementwise kernels
ROW_THREADS = 64 if SIMULATING else 256
ELEMWISE_THREADS = 64 if SIMULATING else 256
SAMPLE_THREADS = 64 if SIMULATING else 512
#: the simulator runs a grid block after block: a few blocks that loop beat many small ones
SIM_MAX_BLOCKS = 2
GPU_MAX_BLOCKS = 65535 * 16

if SIMULATING:
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
else:                                              # pragma: no cover - GPU only
    from cuda.bindings import driver as _cudrv
    from numba.cuda import types as _nbtypes
    from numba.cuda.cudadrv.devices import get_context as _get_context

    if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:
        # Decode launches are small by nature (grid = batch x heads); Numba would warn on each
        # new launch shape.  Set the variable to 1 to see the warnings again.  (Set in the
        # environment too: Numba re-reads its config from NUMBA_* variables when they change.)
        from numba.cuda.core import config as _numba_config

        os.environ["NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS"] = "0"
        _numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0


def _bits_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


# --- kernel arguments on the GPU -------------------------------------------------------------

#: torch dtype -> (NumPy dtype name the kernel sees, itemsize); bf16 travels as int16 bits
_KERNEL_DTYPES = {torch.bfloat16: ("int16", 2), torch.float16: ("float16", 2),
                  torch.float32: ("float32", 4), torch.float64: ("float64", 8),
                  torch.int16: ("int16", 2), torch.int32: ("int32", 4),
                  torch.int64: ("int64", 8), torch.uint8: ("uint8", 1),
                  torch.int8: ("int8", 1), torch.bool: ("bool", 1)}
_array_types: dict = {}


def _array_type(dtype_name: str, ndim: int):
    """The Numba type Numba itself gives a C-contiguous device array (layout 'C')."""
    key = (dtype_name, ndim)
    t = _array_types.get(key)
    if t is None:
        import numpy as np
        from numba.cuda.np import numpy_support

        t = _array_types[key] = _nbtypes.Array(numpy_support.from_dtype(np.dtype(dtype_name)),
                                               ndim, "C")
    return t


class GpuArray:
    """A C-contiguous device array as a kernel argument: pointer, shape, dtype and the values
    of Numba's array parameter block (``abi``); ``key`` stands for its Numba type in the
    launchers' cache (a short string: hashing it is cheap, unlike a Numba type).  Holds its
    tensor while it lives (an argument lives for one launch), and exposes
    ``__cuda_array_interface__`` so that Numba's ordinary launch path accepts it too."""

    __slots__ = ("ptr", "shape", "dtype_name", "key", "abi", "owner")

    def __init__(self, ptr: int, shape: tuple, dtype_name: str, itemsize: int, owner=None):
        self.ptr, self.shape, self.dtype_name, self.owner = ptr, shape, dtype_name, owner
        if len(shape) == 1:                      # the common case, kept short
            n = shape[0]
            self.key = _KEYS_1D[dtype_name]
            self.abi = (0, 0, n, itemsize, ptr, n, itemsize)
            return
        self.key = f"{dtype_name}/{len(shape)}"
        strides, step = [], itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= n
        self.abi = (0, 0, step // itemsize, itemsize, ptr, *shape, *reversed(strides))

    @property
    def nbtype(self):
        return _array_type(self.dtype_name, len(self.shape))

    @property
    def __cuda_array_interface__(self):
        import numpy as np

        return {"shape": self.shape, "strides": None, "data": (self.ptr, False),
                "typestr": np.dtype(self.dtype_name).str, "version": 3}


_KEYS_1D = {name: f"{name}/1" for name, _ in _KERNEL_DTYPES.values()}


def _gpu_array(t: torch.Tensor, shape: tuple, dtype=None) -> GpuArray:
    if not t.is_cuda:
        raise ValueError(f"numba backend: tensors must be on the GPU, got {t.device}")
    name, size = _KERNEL_DTYPES[dtype or t.dtype]
    return GpuArray(t.data_ptr(), shape, name, size, t)


def as_kernel_array(t: torch.Tensor):
    """Zero-copy kernel argument for tensor ``t`` (any strides)."""
    if SIMULATING:
        t = _bits_view(t.detach())
        if t.device.type != "cpu":
            raise ValueError("numba-sim backend: tensors must be on the CPU, got "
                             f"{t.device}")
        # a recording stand-in while access_log.record_kernel_accesses names this tensor
        return access_log.stand_in(t, FakeCUDAArray(t.numpy()))
    if t.is_contiguous() and t.dtype in _KERNEL_DTYPES:
        return _gpu_array(t, tuple(t.shape))
    t = _bits_view(t.detach())
    if t.device.type != "cuda":
        raise ValueError(f"numba backend: tensors must be on the GPU, got {t.device}")
    return cuda.as_cuda_array(t)


def _row_layout(t: torch.Tensor, name: str) -> tuple[int, int]:
    """(row stride, elements in the span from row 0 to the end of the last row) of a tensor
    [R, ...] whose rows are each contiguous."""
    if t.dim() < 1:
        raise ValueError(f"{name}: expected at least 1 dimension")
    shape, strides = t.shape, t.stride()
    if t.dim() == 1:
        return 1, shape[0]
    expected = 1
    for n, s in zip(reversed(shape[1:]), reversed(strides[1:])):
        if n != 1 and s != expected:
            raise ValueError(f"{name}: each row must be contiguous (got strides "
                             f"{tuple(strides)}); pass .contiguous()")
        expected *= n
    row_stride = strides[0]
    span = 0 if shape[0] == 0 else (shape[0] - 1) * row_stride + expected
    return row_stride, span


def rows(t: torch.Tensor, name: str = "tensor", words: bool = False):
    """(1-D kernel view starting at row 0, row stride) for a tensor [R, ...] whose rows are
    each contiguous; rows may be strided (a column slice of a wider matrix).  With ``words``
    (2-byte dtypes whose rows start at even elements): the view is int32 words and the stride
    counts words."""
    row_stride, span = _row_layout(t, name)
    if words:
        if t.element_size() != 2 or row_stride % 2 or span % 2:
            raise ValueError(f"{name}: a word view needs 2-byte elements and an even row "
                             f"stride and span, got {t.dtype}, stride {row_stride}")
        if SIMULATING:
            flat_t = t.as_strided((span,), (1,), t.storage_offset())
            return as_kernel_array(flat_t.view(torch.int32)), row_stride // 2
        return _gpu_array(t, (span // 2,), torch.int32), row_stride // 2
    if SIMULATING:
        flat_t = t.as_strided((span,), (1,), t.storage_offset())
        return as_kernel_array(flat_t), row_stride
    return _gpu_array(t, (span,)), row_stride


def flat(t: torch.Tensor, name: str = "tensor"):
    """1-D kernel view of a contiguous tensor."""
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (got strides {tuple(t.stride())})")
    if SIMULATING:
        return as_kernel_array(t.reshape(-1))
    return _gpu_array(t, (t.numel(),))


def words(t: torch.Tensor, name: str = "tensor"):
    """A contiguous 2-byte tensor as a 1-D kernel array of int32 words (two elements each)."""
    if not t.is_contiguous() or t.element_size() != 2 or t.numel() % 2:
        raise ValueError(f"{name}: a word view needs a contiguous tensor of 2-byte elements "
                         f"and an even size, got {t.dtype} {tuple(t.shape)}")
    if SIMULATING:
        return as_kernel_array(t.reshape(-1).view(torch.int32))
    return _gpu_array(t, (t.numel() // 2,), torch.int32)


# --- launching ------------------------------------------------------------------------------

_streams: dict[int, object] = {}


def _current_stream():
    ptr = torch.cuda.current_stream().cuda_stream
    stream = _streams.get(ptr)
    if stream is None:
        stream = _streams[ptr] = cuda.external_stream(ptr)
    return stream


def _dims(d) -> tuple[int, int, int]:
    if isinstance(d, int):
        return (d, 1, 1)
    d = tuple(int(x) for x in d)
    return d + (1,) * (3 - len(d))


class _RawLauncher:
    """One compiled kernel for one tuple of argument types: the parameter block Numba's
    launch builds (every parameter in an 8-byte slot: an array is meminfo, parent, nitems,
    itemsize, data, shape..., strides...; int64; float64; bool) is packed into one reusable
    buffer with ``struct``, and ``cuLaunchKernel`` gets its address.  The return code is
    checked."""

    _SCALAR_FORMATS = {"int64": "q", "float64": "d", "bool": "?7x"}

    def __init__(self, compiled, argtypes: tuple):
        handle = compiled._codelibrary.get_cufunc().kernel.handle
        err, self.function = _cudrv.cuKernelGetFunction(handle)
        _check(err, "cuKernelGetFunction")
        fmt, slots = "<", 0
        for t in argtypes:
            if isinstance(t, _nbtypes.Array):
                fmt += "qqqqQ" + "q" * (2 * t.ndim)
                slots += 5 + 2 * t.ndim
            elif str(t) in self._SCALAR_FORMATS:
                fmt += self._SCALAR_FORMATS[str(t)]
                slots += 1
            else:
                raise NotImplementedError(f"argument type {t}")
        #: the Numba types this launcher was compiled for (``kernel.compile(argtypes)``)
        self.argtypes = argtypes
        self.pack = struct.Struct(fmt).pack_into
        self.buffer = (ctypes.c_byte * (8 * max(1, slots)))()
        base = ctypes.addressof(self.buffer)
        self.params = (ctypes.c_void_p * max(1, slots))(*[base + 8 * i for i in range(slots)])
        self.params_address = ctypes.addressof(self.params)
        self.lock = threading.Lock()

        #: may be launched with programmatic stream serialization (``overlapping`` kernels;
        #: set by _first_launch, cleared if the driver refuses the attribute)
        self.overlap = False
        self.name = ""
        self.py_func = None
        self.configs: dict = {}

    def __call__(self, grid, block, args, overlap: bool) -> None:
        values = []
        for a in args:
            if a.__class__ is GpuArray:
                values.extend(a.abi)
            else:
                values.append(a)
        gx, gy, gz = _dims(grid)
        bx, by, bz = _dims(block)
        stream = _current_stream_handle()
        with self.lock:                       # one parameter buffer per launcher
            self.pack(self.buffer, 0, *values)
            if overlap and self.overlap:
                err, = _cudrv.cuLaunchKernelEx(self._overlap_config(gx, gy, gz, bx, by, bz,
                                                                    stream),
                                               self.function, self.params_address, 0)
                if err == _cudrv.CUresult.CUDA_SUCCESS:
                    return
                # the driver refused the attribute: record it, launch plainly from now on
                FAST_LAUNCH_ERRORS[(self.name, "overlap")] = repr(err)[:300]
                self.overlap = False
            err, = _cudrv.cuLaunchKernel(self.function, gx, gy, gz, bx, by, bz, 0,
                                         stream, self.params_address, 0)
        _check(err, "cuLaunchKernel")

    def _overlap_config(self, gx, gy, gz, bx, by, bz, stream):
        """The ``CUlaunchConfig`` of a launch that may start before the previous kernel on the
        stream has finished (``device/grid_dependency.py``), one per shape and stream."""
        key = (gx, gy, gz, bx, by, bz, stream)
        config = self.configs.get(key)
        if config is None:
            attr = _cudrv.CUlaunchAttribute()
            attr.id = _cudrv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            config = _cudrv.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
            config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
            config.sharedMemBytes = 0
            config.hStream = _cudrv.CUstream(stream)
            config.attrs = [attr]
            config.numAttrs = 1
            self.configs[key] = config
        return config


def _check(err, what: str) -> None:
    if err != _cudrv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err!r}")


def _current_stream_handle() -> int:
    """torch's current stream as an integer handle (the cheap way, when torch offers it)."""
    try:
        return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
    except AttributeError:                    # pragma: no cover - other torch versions
        return torch.cuda.current_stream().cuda_stream


_launchers: dict = {}
#: (kernel name, what failed) -> the error that made a kernel go through Numba's own launch
#: (empty when all is well)
FAST_LAUNCH_ERRORS: dict = {}
_SCALAR_TYPES: dict = {}
_thread_state = threading.local()


def _scalar_type(cls):
    if not _SCALAR_TYPES:
        _SCALAR_TYPES.update({int: _nbtypes.int64, float: _nbtypes.float64,
                              bool: _nbtypes.boolean})
    return _SCALAR_TYPES.get(cls)


def _first_launch(kernel, argtypes, grid, block, args, overlap: bool):
    """Compile, make the launcher and launch; False when the launcher cannot take this kernel
    (nothing was launched then: Numba's own launch takes it)."""
    compiled = kernel.compile(argtypes)
    if compiled.debug or compiled.extensions or compiled.cooperative:
        return False
    try:
        launcher = _RawLauncher(compiled, argtypes)
        py_func = getattr(kernel, "py_func", None)
        launcher.overlap = py_func in _OVERLAPPING
        launcher.name = getattr(py_func, "__name__", "")
        launcher.py_func = py_func
        launcher(grid, block, args, overlap)
        return launcher
    except NotImplementedError:
        return False
    except Exception as exc:                  # record it (tests check it); Numba launches it
        FAST_LAUNCH_ERRORS[(getattr(kernel, "__name__", str(kernel)), "raw")] = repr(exc)[:300]
        return False


def _gpu_launch(kernel, grid, block, args, overlap: bool) -> bool:
    """The launcher; False when an argument is of a kind it does not handle."""
    key = (kernel, *[a.key if a.__class__ is GpuArray else a.__class__ for a in args])
    launcher = _launchers.get(key)
    if launcher:
        launcher(grid, block, args, overlap)
        return True
    if launcher is False:
        return False
    types = []
    for a in args:
        t = a.nbtype if a.__class__ is GpuArray else _scalar_type(a.__class__)
        if t is None:                         # not an argument kind the fast paths know
            _launchers[key] = False
            return False
        types.append(t)
    if not getattr(_thread_state, "context_ready", False):
        _get_context()                        # Numba's context current on this thread (once)
        _thread_state.context_ready = True
    launcher = _launchers[key] = _first_launch(kernel, tuple(types), grid, block, args,
                                               overlap)
    return launcher is not False


def launched_kernels() -> list[tuple]:
    """(Python function, Numba argument types) of every kernel the launcher has launched in
    this process: what a test compiles again for another compute capability."""
    return [(l.py_func, l.argtypes) for l in _launchers.values()
            if l and l.py_func is not None]


#: Python functions of the kernels written for overlapped launches (see ``overlapping``)
_OVERLAPPING: set = set()


def overlapping(py_func):
    """Mark a kernel's Python function (apply below ``@cuda.jit``) as written for launches that
    overlap the previous kernel: every block calls ``grid_dependency.wait_for_previous_grid()``
    before it reads another kernel's output or returns.  The launcher then launches it with
    programmatic stream serialization on GPUs that support it (``device/grid_dependency.py``)
    when the caller asks for overlap; otherwise, and through Numba's own launch, it is launched
    plainly, which is always correct."""
    _OVERLAPPING.add(py_func)
    return py_func


def launch(kernel, grid, block, *args, overlap: bool = True) -> None:
    """Run ``kernel[grid, block](*args)`` on torch's stream (GPU) or in the simulator.
    ``overlap``: a kernel marked ``overlapping`` may start under the previous kernel's tail
    (``NumbaBackend``'s ``KernelOptions.overlap``; False launches it plainly)."""
    if SIMULATING:
        with sim_shim.fast_thread_switching():
            kernel[grid, block](*args)
    elif not _gpu_launch(kernel, grid, block, args, overlap):
        kernel[grid, block, _current_stream()](*args)


def elemwise_grid(n: int, threads: int = ELEMWISE_THREADS) -> int:
    """Blocks for a grid-stride loop over n items."""
    blocks = max(1, -(-n // threads))
    return min(blocks, SIM_MAX_BLOCKS if SIMULATING else GPU_MAX_BLOCKS)


# --- scratch buffers kept for the process ------------------------------------------------------

_persistent: dict = {}
_retired: list = []


#: the persistent buffers that were filled with zeros when made (or since)
_zeroed: set = set()


def persistent_buffer(device, name: str, n: int, dtype=torch.float32,
                      zero: bool = False) -> torch.Tensor:
    """A buffer of at least ``n`` elements, one per (device, name, dtype), kept for the
    process: allocated once instead of per call, and at a fixed address that CUDA graphs can
    capture.  It only grows (a replaced buffer is kept alive: a captured graph may still use
    it).  ``zero``: filled with zeros when allocated (ticket counters, which the kernels
    leave at zero)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:       # "cuda" and "cuda:0" are one GPU
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, name, dtype)
    buf = _persistent.get(key)
    if buf is None or buf.numel() < n:
        size = max(n, 2 * buf.numel() if buf is not None else 0, 1024)
        fresh = (torch.zeros if zero else torch.empty)(size, dtype=dtype, device=device)
        if buf is not None:
            _retired.append(buf)
        buf = _persistent[key] = fresh
        _zeroed.discard(key)
        if zero:
            _zeroed.add(key)
    elif zero and key not in _zeroed:       # made first by a caller that did not ask for zeros
        buf.zero_()
        _zeroed.add(key)
    return buf
