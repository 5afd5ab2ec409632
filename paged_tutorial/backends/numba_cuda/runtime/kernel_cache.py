"""Kernels compiled once per machine: every kernel of the numba backend is made by
``cached_kernel``.

    @cached_kernel                  # instead of @cuda.jit
    def rms_norm(x, ...): ...

    @cached_kernel(fastmath=True)   # instead of @cuda.jit(fastmath=True)
    def decode(q, ...): ...

On a GPU, compiling a kernel (Numba -> LLVM -> PTX -> cubin) takes a second or more, and the
engine needs a few dozen of them.  ``cached_kernel`` gives each one Numba's on-disk cache with two
changes:

- **Where.**  ``cache_dir()``: ``$NUMBA_CACHE_DIR/paged_tutorial/...`` when the user has set
  ``NUMBA_CACHE_DIR``, else ``$XDG_CACHE_HOME/paged_tutorial/numba/...`` (``~/.cache`` when
  ``XDG_CACHE_HOME`` is unset), never next to the package's source (site-packages).
- **The key.**  An entry is found by the argument types, the GPU's compute capability,
  numba-cuda's version and ``kernel_key``: the kernel's code, the values its closure holds
  (so a factory's constants such as ``HEAD_DIM`` are part of the key: two values never share
  an entry; device functions made in a factory count by their code and closure, recursively)
  and the plain constants it reads from its module.  Numba's own key pickles the closure,
  which differs from process to process as soon as it reaches a Numba intrinsic (each gets a
  random id): such kernels would compile in every process.
- **When it is stale.**  The folder's name holds a digest of every source file of the numba
  backend (``source_digest``): any change to them, in the kernel's file or in a device
  function's, starts a fresh cache.

- **What a hit loads.**  The linked cubin for the GPU's compute capability: numba-cuda binds a
  kernel (links it into a cubin) before saving it, and the saved code library keeps its cubins
  by compute capability beside the PTX; a loaded kernel's first launch hands that cubin to the
  driver, so no process after the first JIT-compiles PTX.  What a hit still costs is reading
  and unpickling the entry, the key (``kernel_key``, a few milliseconds per kernel, once per
  process) and, on the first lookup of a process, Numba's set-up of its CUDA target
  (``COMPILE_STATS.first_lookup_seconds``).

The simulator compiles nothing: there ``cached_kernel`` is plain ``cuda.jit``.
``PAGED_TUTORIAL_KERNEL_CACHE=0`` turns the disk cache off (every process compiles again).

``COMPILE_STATS`` counts what happened in this process (kernels loaded from the cache,
kernels compiled, seconds spent in each), and ``compile_progress(file, key)`` shows a progress
bar while kernels compile ("compiling N kernels (first run only)", N remembered from the last
time ``key`` was warmed up); when every kernel comes from the cache nothing is printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sys
import threading
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

from numba import cuda

from paged_tutorial.backends.numba_cuda.device.sim_shim import SIMULATING

CACHE_SWITCH_ENV = "PAGED_TUTORIAL_KERNEL_CACHE"
#: the numba backend's source: kernels/, device/, runtime/ and the backend itself
SOURCE_ROOT = Path(__file__).resolve().parents[1]


def cache_root(environ=None) -> Path:
    """The folder this package's kernel caches live in (one subfolder per source digest)."""
    environ = os.environ if environ is None else environ
    numba_dir = environ.get("NUMBA_CACHE_DIR", "").strip()
    if numba_dir:
        return Path(numba_dir).expanduser() / "paged_tutorial"
    base = environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base).expanduser() / "paged_tutorial" / "numba"


@functools.lru_cache(maxsize=None)
def source_digest(root: Path = SOURCE_ROOT) -> str:
    """sha256 over the path and bytes of every ``.py`` file under ``root``, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_dir(environ=None) -> Path:
    """Where the kernels of this source tree are cached."""
    return cache_root(environ) / f"kernels-{source_digest()[:16]}"


def cache_enabled(environ=None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(CACHE_SWITCH_ENV, "1").strip() not in ("0", "false", "no", "off")


_CONSTANT_TYPES = (bool, int, float, complex, str, bytes, type(None))


class Uncacheable(Exception):
    """A kernel whose key cannot be written down the same way in every process."""


def _is_constant(value) -> bool:
    if isinstance(value, tuple):
        return all(_is_constant(v) for v in value)
    return isinstance(value, _CONSTANT_TYPES)


def global_constants(py_func) -> tuple:
    """``(name, value)`` of the plain constants a kernel reads from its module's globals
    (Numba freezes them into the compiled code)."""
    names = sorted(set(py_func.__code__.co_names))
    glb = py_func.__globals__
    return tuple((n, glb[n]) for n in names if n in glb and _is_constant(glb[n]))


def _const_text(c) -> str:
    if isinstance(c, types.CodeType):
        return _code_text(c)
    if isinstance(c, frozenset):                          # `x in {...}`: ordered by hash
        return "frozenset(" + ",".join(sorted(map(repr, c))) + ")"
    return repr(c)


def _code_text(code: types.CodeType) -> str:
    consts = ",".join(_const_text(c) for c in code.co_consts)
    return f"{code.co_name}:{code.co_code.hex()}:{','.join(code.co_names)}:[{consts}]"


def _function_text(fn, seen: set) -> str:
    name = f"{fn.__module__}.{fn.__qualname__}"
    if id(fn) in seen:                                    # a function that calls itself
        return name
    seen.add(id(fn))
    cells = ",".join(f"{n}={describe(c.cell_contents, seen)}"
                     for n, c in zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    # the functions and constants it reads from its module, recursively: a notebook's helper
    # that a learner's part calls, or a device function of this package
    glb = fn.__globals__
    used = ",".join(f"{n}={describe(glb[n], seen)}" for n in global_names(fn.__code__)
                    if n in glb and _is_described_global(glb[n]))
    return f"{name}<{_code_text(fn.__code__)}>[{cells}]{{{used}}}"


def global_names(code: types.CodeType) -> list[str]:
    """The global names ``code`` (and any code nested in it) reads, in order, once each."""
    names = dict.fromkeys(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.update(dict.fromkeys(global_names(c)))
    return list(names)


def _is_described_global(value) -> bool:
    """Globals that shape compiled code: constants, functions, dispatchers, intrinsics."""
    return (_is_constant(value) or isinstance(value, types.FunctionType)
            or isinstance(getattr(value, "py_func", None), types.FunctionType)
            or isinstance(getattr(value, "_defn", None), types.FunctionType))


def describe(value, seen: set | None = None) -> str:
    """A text standing for ``value`` in a kernel's key, the same in every process.

    Numba's own key pickles the kernel's closure, and a pickled Numba intrinsic carries a fresh
    random id in each process (so a kernel whose closure reaches one would never be found in
    the cache); here functions are written as their code and their closures' values,
    recursively, with the functions and constants they read from their module's globals,
    intrinsics as their defining function, Numba types by name.  Raises ``Uncacheable`` for a
    value that only has an address-based repr."""
    seen = set() if seen is None else seen
    if _is_constant(value):
        return repr(value)
    if isinstance(value, tuple):
        return "(" + ",".join(describe(v, seen) for v in value) + ")"
    if isinstance(value, (set, frozenset)):
        return "{" + ",".join(sorted(describe(v, seen) for v in value)) + "}"
    py_func = getattr(value, "py_func", None)             # a Numba dispatcher
    if isinstance(py_func, types.FunctionType):
        return "dispatcher:" + _function_text(py_func, seen)
    if isinstance(value, types.FunctionType):
        return "function:" + _function_text(value, seen)
    defn = getattr(value, "_defn", None)                  # a Numba intrinsic
    if isinstance(defn, types.FunctionType):
        return "intrinsic:" + _function_text(defn, seen)
    if isinstance(value, types.ModuleType):
        return "module:" + value.__name__
    if isinstance(value, type):
        return f"type:{value.__module__}.{value.__qualname__}"
    if dataclasses.is_dataclass(value):
        fields = ",".join(f"{f.name}={describe(getattr(value, f.name), seen)}"
                          for f in dataclasses.fields(value))
        return f"{type(value).__qualname__}({fields})"
    if isinstance(value, (list, dict)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return type(value).__name__ + "{" + ",".join(
            f"{describe(k, seen)}:{describe(v, seen)}" for k, v in items) + "}"
    text = repr(value)
    if " at 0x" in text:
        raise Uncacheable(f"no stable key for {type(value).__qualname__} {text[:80]}")
    return f"{type(value).__module__}.{type(value).__qualname__}:{text}"


def kernel_key(py_func) -> str:
    """sha256 of the kernel's code, its closure's values and its module constants."""
    text = _function_text(py_func, set()) + repr(global_constants(py_func))
    return hashlib.sha256(text.encode()).hexdigest()


# --- what this process compiled ---------------------------------------------------------------

@dataclass
class CompileStats:
    """Kernels this process took from the disk cache (``loaded``) or compiled (``compiled``),
    and the seconds each took in all.  Of those seconds: ``key_seconds`` went into computing
    ``kernel_key`` (once per kernel and process), and ``first_lookup_seconds`` is the first
    cache lookup of the process, which also pays Numba's one-time set-up of its CUDA target
    (its typing and lowering registries, the NVRTC library that names the toolkit version)."""
    loaded: int = 0
    compiled: int = 0
    load_seconds: float = 0.0
    compile_seconds: float = 0.0
    key_seconds: float = 0.0
    first_lookup_seconds: float | None = None

    @property
    def seconds(self) -> float:
        return self.load_seconds + self.compile_seconds

    def snapshot(self) -> "CompileStats":
        return dataclasses.replace(self)

    def since(self, earlier: "CompileStats") -> "CompileStats":
        """What was loaded and compiled after ``earlier`` (a snapshot of this process's)."""
        return CompileStats(self.loaded - earlier.loaded, self.compiled - earlier.compiled,
                            self.load_seconds - earlier.load_seconds,
                            self.compile_seconds - earlier.compile_seconds,
                            self.key_seconds - earlier.key_seconds,
                            self.first_lookup_seconds if earlier.first_lookup_seconds is None
                            else None)


COMPILE_STATS = CompileStats()
_progress = threading.local()          # .file: where the bar goes; .bar: the open tqdm bar


WARM_UP_COUNTS = "warm-up-kernels.json"


def remembered_kernel_count(key: str, environ=None) -> int | None:
    """How many kernels the warm-up named ``key`` needed last time (None: never seen)."""
    try:
        counts = json.loads((cache_root(environ) / WARM_UP_COUNTS).read_text())
    except (OSError, ValueError):
        return None
    value = counts.get(key) if isinstance(counts, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def remember_kernel_count(key: str, count: int, environ=None) -> None:
    """Record ``count`` for ``key`` (best effort: an unwritable folder is no error)."""
    path = cache_root(environ) / WARM_UP_COUNTS
    try:
        counts = json.loads(path.read_text()) if path.is_file() else {}
        counts = counts if isinstance(counts, dict) else {}
        counts[key] = int(count)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(counts, indent=1, sort_keys=True))
    except (OSError, ValueError):
        pass


def _kernels_seen() -> int:
    return COMPILE_STATS.loaded + COMPILE_STATS.compiled


@contextlib.contextmanager
def compile_progress(file=None, key: str | None = None):
    """Show a tqdm bar on ``file`` (default stderr) while kernels compile inside the block.
    The bar opens at the first kernel that is not in the cache: a fully cached run prints
    nothing.  ``key`` names what is warmed up (a model on an engine): the number of kernels
    it needed is remembered beside the caches (``warm-up-kernels.json``) and is the bar's
    total the next time the kernels compile (after a change to their source, say)."""
    _progress.file = sys.stderr if file is None else file
    _progress.total = remembered_kernel_count(key) if key else None
    _progress.bar = None
    _progress.before = _kernels_seen()
    try:
        yield COMPILE_STATS
    finally:
        bar = getattr(_progress, "bar", None)
        if bar is not None:
            bar.close()
        if key:
            remember_kernel_count(key, _kernels_seen() - _progress.before)
        _progress.file = _progress.bar = None


def _compile_started() -> None:
    file = getattr(_progress, "file", None)
    if file is None or getattr(_progress, "bar", None) is not None:
        return
    from tqdm.auto import tqdm

    done = _kernels_seen() - _progress.before           # loaded from the cache so far
    total = getattr(_progress, "total", None)
    total = total if total is not None and total > done else None
    what = f"{total - done} kernels" if total else "kernels"
    _progress.bar = tqdm(total=total, initial=done, desc=f"compiling {what} (first run only)",
                         unit="kernel", file=file, leave=True, dynamic_ncols=True)


def _kernel_ready(name: str) -> None:
    """A kernel compiled, or loaded from the cache, while the bar is open."""
    bar = getattr(_progress, "bar", None)
    if bar is not None:
        bar.set_postfix_str(name, refresh=False)
        bar.update(1)


# --- Numba's cache with this package's location and key --------------------------------------

if not SIMULATING:                                     # pragma: no cover - GPU only
    import numba_cuda
    from numba.cuda.core.caching import _CacheLocator
    from numba.cuda.dispatcher import CUDACache, CUDACacheImpl

    class _PackageLocator(_CacheLocator):
        """Every kernel of this source tree in ``cache_dir()``; the source digest stands for
        the source file's time stamp."""

        def __init__(self, py_func, py_file):
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(cache_dir())

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            return source_digest()

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            self = cls(py_func, py_file)
            try:
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    class _PackageCacheImpl(CUDACacheImpl):
        _locator_classes = [_PackageLocator]

    class PackageKernelCache(CUDACache):
        """Numba's CUDA cache in ``cache_dir()``, keyed on ``kernel_key`` instead of a pickle
        of the closure, counting into ``COMPILE_STATS``.  A kernel whose key cannot be
        written down (``Uncacheable``) compiles every time, as without a cache."""

        _impl_class = _PackageCacheImpl

        def __init__(self, py_func):
            super().__init__(py_func)
            self._function_key = None
            self._started = None

        def _index_key(self, sig, codegen):
            if self._function_key is None:
                started = time.perf_counter()
                self._function_key = kernel_key(self._py_func)
                COMPILE_STATS.key_seconds += time.perf_counter() - started
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__, self._function_key)
            if self._launch_config_key is not None:
                key += (("launch_config", self._launch_config_key),)
            return key

        def load_overload(self, sig, target_context):
            self._started = time.perf_counter()
            try:
                kernel = super().load_overload(sig, target_context)
            except Uncacheable:
                kernel = None
            if COMPILE_STATS.first_lookup_seconds is None:
                COMPILE_STATS.first_lookup_seconds = time.perf_counter() - self._started
            if kernel is not None:
                COMPILE_STATS.loaded += 1
                COMPILE_STATS.load_seconds += time.perf_counter() - self._started
                _kernel_ready(self._name_short)
            else:
                _compile_started()
            return kernel

        def save_overload(self, sig, data):
            if self._started is not None:
                COMPILE_STATS.compiled += 1
                COMPILE_STATS.compile_seconds += time.perf_counter() - self._started
                self._started = None
            _kernel_ready(self._name_short)
            try:
                super().save_overload(sig, data)
            except Uncacheable:
                pass

        @property
        def _name_short(self) -> str:
            return self._py_func.__name__


def _with_disk_cache(dispatcher):                      # pragma: no cover - GPU only
    try:
        cache = PackageKernelCache(dispatcher.py_func)
    except (RuntimeError, OSError) as exc:               # no writable cache folder
        warnings.warn(f"kernels are compiled in every process: no writable cache folder at "
                      f"{cache_dir()} ({exc}); set NUMBA_CACHE_DIR to a writable folder",
                      stacklevel=3)
        return dispatcher
    if not cache_enabled():
        cache.disable()                                  # still counts compiles
    dispatcher._cache = cache
    return dispatcher


def cached_kernel(fn=None, **options):
    """``cuda.jit(**options)(fn)`` with the disk cache of this module on a GPU; usable as
    ``@kernel`` and ``@kernel(option=...)``.  For ``__global__`` kernels only (device
    functions are compiled into the kernels that call them)."""
    if fn is None:
        return functools.partial(cached_kernel, **options)
    if options.get("device"):
        raise ValueError("kernel() builds __global__ kernels; use cuda.jit(device=True) for "
                         "device functions")
    dispatcher = cuda.jit(**options)(fn)
    if SIMULATING:
        return dispatcher
    return _with_disk_cache(dispatcher)                  # pragma: no cover - GPU only
