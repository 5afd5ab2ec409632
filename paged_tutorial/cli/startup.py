"""From options to a running engine: the backend (checked before any weights load), the
model (found before the loading line says it loads), the engine and its warm-up."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from paged_tutorial.cli.streams import one_line
from paged_tutorial.cli.timing import StartTiming

HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3]")
SIM_WARNING = (
    "warning: numba-sim runs every GPU thread of every kernel as a Python thread: the embedded "
    "SmolLM2 (30 layers) needs about a minute per token on a 2-core machine (4 minutes for a "
    "1-token prompt and 3 new tokens, measured).  For a quick "
    "look keep it tiny (a short prompt, --no-chat, --max-tokens 4) or pass a small model "
    "folder (2 layers, e.g. one written by paged_tutorial.loading.models.save_hf_folder("
    "random_model(...))); for answers use --backend torch.")
#: what loading a model or starting the engine raises for a cause the user can fix
USER_FAULTS = (ValueError, FileNotFoundError, PermissionError, ConnectionError, RuntimeError,
               TypeError)


class UsageError(Exception):
    """A failure the user caused: printed as one 'error:' line."""


def choose_backend(name: str):
    """The backend object, made (and for numba, test-launched) before any weights load."""
    from paged_tutorial.backends import make_backend
    from paged_tutorial.backends.availability import check_backend

    if name == "numba-sim" and "numba.cuda" not in sys.modules:
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "1").strip() in ("", "0"):
            raise UsageError("--backend numba-sim needs Numba's CUDA simulator, but "
                             "NUMBA_ENABLE_CUDASIM=0 is set: unset it")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"     # this process simulates
    try:
        check_backend(name)
        return make_backend(name)
    except RuntimeError as exc:
        raise UsageError(one_line(exc)) from exc


def check_model_is_there(source: str) -> None:
    """A local model that is missing fails here, with the loader's own message, before the
    loading line; an alias, an existing path or a hub id goes on to load."""
    from paged_tutorial.loading import models

    resolved = models.MODEL_ALIASES.get(source.lower(), source)
    try:
        if resolved == models.EMBEDDED_SMOLLM2:
            models.find_embedded_smollm2()
        elif not Path(resolved).expanduser().exists() and not models.looks_like_hub_id(resolved):
            models.load_model(source)            # raises: "no model at ...: accepted: ..."
    except USER_FAULTS as exc:
        raise UsageError(one_line(exc)) from exc


def _warm_up(engine, err, progress: bool) -> None:
    """On the GPU numba backend: compile (or load from the disk cache) the kernels before
    the first request, with a progress bar while any compiles."""
    if not engine.backend.compiles_kernels:
        return
    from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import compile_progress

    if not progress:
        engine.warm_up()
        return
    key = f"{engine.model.source} | {engine.model.dtype} | {engine.backend.describe()}"
    with compile_progress(file=err, key=key):
        engine.warm_up()


def start_engine(args, err):
    """(engine, timing): the backend, the model and the engine ``args`` ask for, with the
    loading line and the engine's line on ``err``."""
    import paged_tutorial as pt
    from paged_tutorial.loading.dtype_choice import choose_dtype
    from paged_tutorial.threads import configure_threads

    configure_threads(args.threads)

    if args.backend != "numba-sim":          # the GPU's context is made while numba imports
        from paged_tutorial.engine.cuda_start import CudaStart

        CudaStart().start()
    backend = choose_backend(args.backend)
    if backend.simulated:
        print(SIM_WARNING, file=err)
    device = backend.device
    try:
        dtype = choose_dtype(args.model, device, args.dtype)
    except ValueError as exc:
        raise UsageError(one_line(exc)) from exc
    check_model_is_there(args.model)
    print(f"loading {args.model} on {device} in {dtype.line()} ...", file=err, flush=True)
    timing = StartTiming()
    try:
        model = pt.load_model(args.model, dtype=dtype.dtype, device=device,
                              progress=not args.no_progress and err.isatty())
        timing.loaded()
        engine = pt.Engine(model, backend=backend, max_slots=args.max_slots,
                           max_seq_len=args.max_seq_len, prefix_caching=args.prefix_caching,
                           kv_cache_bytes=None if args.kv_cache_mib is None
                           else int(args.kv_cache_mib * 2**20),
                           async_scheduling=args.async_scheduling)
        _warm_up(engine, err, progress=not args.no_progress)
    except USER_FAULTS as exc:
        raise UsageError(one_line(exc)) from exc
    print(f"[{engine.describe()}]", file=err, flush=True)
    return engine, timing


def warn_about_korean(args, texts, err) -> None:
    """A pointer to a Korean-speaking model when Korean text goes to one that is not."""
    from paged_tutorial.loading.catalog import known_model, korean_note

    if any(HANGUL.search(text) for text in texts if text):
        entry = known_model(args.model)
        if entry is None or not entry.korean:
            print(f"warning: {korean_note(args.model)}", file=err, flush=True)
