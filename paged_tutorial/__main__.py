"""Command line: ``python -m paged_tutorial "prompt" [--model SOURCE] [--backend B] ...``

One prompt streams its answer to stdout token by token; several prompts are served together
(one slot each) and each answer is printed, labelled, as soon as it finishes.  Engine facts
(backend, cache size), progress and timing go to stderr.

Every failure the user can cause (a model that is missing, gated or cannot be downloaded, a
backend this machine cannot run, a prompt too long for ``--max-seq-len``, an answer standard
output cannot take) ends with one ``error:`` line on stderr and exit status 2; an option value
out of range, or a prompt the terminal's encoding could not decode, is argparse's
``error:`` line (status 2) before anything loads.  The backend is checked before any weights
are loaded.  Ctrl-C at any moment prints one line and exits 130; when nobody reads standard
output any more (``| head -c 1``, or started with it closed) the command stops quietly with
status 141, as a shell reports for a writer that SIGPIPE ended.  No traceback in any of these.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import re
import signal
import sys
import time
import warnings

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130          # 128 + SIGINT: what a shell reports for Ctrl-C
EXIT_OUTPUT_CLOSED = 141        # 128 + SIGPIPE: what `head` expects of a writer it stopped reading

# The largest values the numeric options take: beyond them a value is a typo, not a request.
MAX_TOKENS_OPTION = 2 ** 24
MAX_SLOTS_OPTION = 4096
MAX_KV_CACHE_MIB = 2 ** 24      # 16 TiB
MAX_TEMPERATURE = 100.0
HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3]")

SIM_WARNING = (
    "warning: numba-sim runs every GPU thread of every kernel as a Python thread: the embedded "
    "SmolLM2 (30 layers) needs about a minute per token on a 2-core machine (4 minutes for a "
    "1-token prompt and 3 new tokens, measured).  For a quick "
    "look keep it tiny (a short prompt, --no-chat, --max-new-tokens 4) or pass a small model "
    "folder (2 layers, e.g. one written by paged_tutorial.loading.models.save_hf_folder("
    "random_model(...))); for answers use --backend torch.")


def api_defaults() -> dict:
    """The defaults of the Python API, so the command line cannot drift from them:
    Engine(...)'s max_slots / max_seq_len and SamplingParams' sampling arguments."""
    import dataclasses

    from paged_tutorial.engine.llm_engine import Engine
    from paged_tutorial.engine.sampling_params import SamplingParams

    engine = inspect.signature(Engine.__init__).parameters
    defaults = {name: engine[name].default for name in ("max_slots", "max_seq_len")}
    fields = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    for name in ("max_new_tokens", "temperature", "top_p", "seed"):
        defaults[name] = fields[name]
    return defaults


def integer_in(low: int, high: int):
    """An argparse ``type``: an integer in [low, high], else argparse's one error line."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {low} to {high}, got {text}")
        return value
    return parse


def _plain(number: float) -> str:
    """16777216 rather than 1.67772e+07; 0.5 as 0.5."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def number_in(low: float, high: float, *, low_open: bool = False):
    """An argparse ``type``: a finite number in [low, high] ((low, high] when ``low_open``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        above_low = value > low if low_open else value >= low
        if not (math.isfinite(value) and above_low and value <= high):
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(
                f"must be a finite number in {bracket}{_plain(low)}, {_plain(high)}], got {text}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    from paged_tutorial.backends import BACKEND_NAMES, BACKENDS

    d = api_defaults()
    backends = "\n".join(f"  {name:10s} {entry.help}" for name, entry in BACKENDS.items())
    p = argparse.ArgumentParser(
        prog="python -m paged_tutorial",
        description="Generate text with the paged-attention engine.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"backends:\n{backends}\n\n"
               "models: smollm2-135m (embedded, English only), llama-3.2-1b (gated hub repo), "
               "llama-3.2-1b-ungated\n(same weights, no login), kanana-nano-2.1b (Korean and "
               "English), a .gguf file, a Hugging Face\nmodel folder, or any hub id of a "
               "Llama-architecture model.\n\n"
               "Exit status: 0 on success, 2 on any error (one 'error:' line on stderr), 130\n"
               "after Ctrl-C, 141 when nothing reads standard output any more.")
    p.add_argument("prompt", nargs="+", help="one or more prompts (each served in a slot)")
    p.add_argument("--model", default="smollm2-135m",
                   help="an alias, a .gguf file, an HF folder or a hub id (default: "
                        "%(default)s)")
    p.add_argument("--backend", default="auto", choices=BACKEND_NAMES,
                   help="see 'backends' below (default: %(default)s)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="default: the model's catalog entry decides on a GPU (float32 for "
                        "smollm2-135m; bfloat16 for Llama-3.2-1B and larger, float16 on a GPU "
                        "without native bfloat16 such as a T4), float32 on a CPU; the loading "
                        "line says which and why")
    p.add_argument("--max-new-tokens", type=integer_in(0, MAX_TOKENS_OPTION),
                   default=d["max_new_tokens"],
                   help="tokens to generate per prompt (default: %(default)s)")
    p.add_argument("--temperature", type=number_in(0.0, MAX_TEMPERATURE),
                   default=d["temperature"],
                   help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-p", type=number_in(0.0, 1.0, low_open=True), default=d["top_p"],
                   help="nucleus sampling mass (default: %(default)s)")
    p.add_argument("--seed", type=integer_in(0, 2 ** 64 - 1), default=d["seed"],
                   help="sampling seed (default: random)")
    p.add_argument("--max-slots", type=integer_in(1, MAX_SLOTS_OPTION), default=d["max_slots"],
                   help="requests decoded together (default: %(default)s)")
    p.add_argument("--max-seq-len", type=integer_in(1, MAX_TOKENS_OPTION),
                   default=d["max_seq_len"],
                   help="prompt + answer tokens per request (default: 2048, or the model's "
                        "max_position_embeddings if smaller)")
    p.add_argument("--kv-cache-mib", type=number_in(0.0, MAX_KV_CACHE_MIB, low_open=True),
                   default=None,
                   help="KV cache size in MiB (default: what max-slots x max-seq-len need, "
                        "capped)")
    p.add_argument("--prefix-caching", action="store_true",
                   help="prompts that begin alike share the K/V of their common full blocks "
                        "instead of computing them again")
    p.add_argument("--no-chat", action="store_true",
                   help="feed the prompt as plain text, without the model's chat template")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar while the weights load")
    return p


class StartTiming:
    """The figures printed after each answer: ``loaded in X s, compiled in Y s (N kernels
    compiled, M from the cache), first token after Z s, R tok/s decode``.  Loading counts
    reading the weights; compiling, the time Numba spent compiling kernels or loading them
    from the disk cache (numba backend only); the first token, from the request's arrival
    (after the engine's warm-up); the rate, decode steps only (kernel compiles that happened
    while decoding are taken out)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.load_s = None
        self.compiles_before = _compile_stats_now()   # a process may have compiled before

    def compiles_since_start(self):
        """The kernels compiled or loaded since this run started (None: no numba backend)."""
        now = _compile_stats_now()
        if now is None or self.compiles_before is None:
            return now
        return now.since(self.compiles_before)

    def loaded(self) -> None:
        self.load_s = time.perf_counter() - self.start

    def report(self, result, compiling_while_decoding: float = 0.0, stats=None) -> str:
        parts = []
        if self.load_s is not None:
            parts.append(f"loaded in {self.load_s:.2f} s")
        if stats is not None and (stats.compiled or stats.loaded):
            parts.append(f"compiled in {stats.seconds:.2f} s ({stats.compiled} kernels "
                         f"compiled, {stats.loaded} from the cache)")
        if result.time_to_first_token_s is not None:
            parts.append(f"first token after {result.time_to_first_token_s:.3f} s")
        n = len(result.token_ids)
        if n > 1 and result.total_time_s is not None and result.time_to_first_token_s is not None:
            decoding = result.total_time_s - result.time_to_first_token_s - \
                max(0.0, compiling_while_decoding)
            if decoding > 0:
                parts.append(f"{(n - 1) / decoding:.3g} tok/s decode")
        return "".join(f", {p}" for p in parts)


class UsageError(Exception):
    """A failure the user caused: printed as one 'error:' line."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _warning_line(message, category, filename, lineno, line=None) -> str:
    text = " ".join(str(message).split())
    return text + "\n" if text.startswith("warning:") else f"warning: {text}\n"


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
        raise UsageError(_one_line(exc)) from exc


def _compile_stats():
    """The numba backend's count of kernels compiled / loaded, if it was imported."""
    module = sys.modules.get("paged_tutorial.backends.numba_cuda.runtime.kernel_cache")
    return module.COMPILE_STATS if module is not None else None


def _compile_stats_now():
    """A copy of ``_compile_stats()`` as it stands (None: the numba backend not imported)."""
    stats = _compile_stats()
    return stats.snapshot() if stats is not None else None


def _warm_up(engine, err, progress: bool) -> None:
    """On the GPU numba backend: compile (or load from the disk cache) the kernels before
    the first request, with a progress bar while any compiles."""
    if engine.backend.name != "numba":
        return
    from paged_tutorial.backends.numba_cuda.runtime.kernel_cache import compile_progress

    if not progress:
        engine.warm_up()
        return
    key = f"{engine.model.source} | {engine.model.dtype} | {engine.backend.describe()}"
    with compile_progress(file=err, key=key):
        engine.warm_up()


def run(args, out=None, err=None) -> int:
    from paged_tutorial import Engine, load_model
    from paged_tutorial.loading.catalog import known_model, korean_note
    from paged_tutorial.loading.dtype_choice import choose_dtype

    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err

    if args.backend != "numba-sim":          # the GPU's context is made while numba imports
        from paged_tutorial.engine.cuda_start import CudaStart

        CudaStart().start()
    backend = choose_backend(args.backend)
    if backend.name == "numba-sim":
        print(SIM_WARNING, file=err)
    device = backend.device
    try:
        dtype = choose_dtype(args.model, device, args.dtype)
    except ValueError as exc:
        raise UsageError(_one_line(exc)) from exc
    print(f"loading {args.model} on {device} in {dtype.line()} ...", file=err, flush=True)
    timing = StartTiming()
    try:
        model = load_model(args.model, dtype=dtype.dtype, device=device,
                           progress=not args.no_progress and err.isatty())
        timing.loaded()
        engine = Engine(model, backend=backend, max_slots=args.max_slots,
                        max_seq_len=args.max_seq_len, prefix_caching=args.prefix_caching,
                        kv_cache_bytes=None if args.kv_cache_mib is None
                        else int(args.kv_cache_mib * 2**20))
        _warm_up(engine, err, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, PermissionError, ConnectionError, RuntimeError,
            TypeError) as exc:
        raise UsageError(_one_line(exc)) from exc
    print(f"[{engine.describe()}]", file=err, flush=True)
    if any(HANGUL.search(p) for p in args.prompt):
        entry = known_model(args.model)
        if entry is None or not entry.korean:
            print(f"warning: {korean_note(args.model)}", file=err, flush=True)

    single = len(args.prompt) == 1

    streamed: list[str] = []

    compile_at_first_token: dict[int, float] = {}

    def on_token_for(index):
        def on_token(_request_id, _token, piece):
            if index not in compile_at_first_token:
                stats = _compile_stats()
                compile_at_first_token[index] = stats.seconds if stats is not None else 0.0
            if single and piece:
                streamed.append(piece)
                out.write(piece)
                out.flush()
        return on_token

    try:
        requests = [engine.add_request(prompt, max_new_tokens=args.max_new_tokens,
                                       temperature=args.temperature, top_p=args.top_p,
                                       seed=args.seed, chat=not args.no_chat,
                                       on_token=on_token_for(i))
                    for i, prompt in enumerate(args.prompt)]
    except (ValueError, TypeError) as exc:
        raise UsageError(_one_line(exc)) from exc
    too_long = [(i, r) for i, r in enumerate(requests) if r.finish_reason == "prompt_too_long"]
    if too_long:
        i, request = too_long[0]
        label = "the prompt" if single else f"prompt {i + 1}"
        templated = "" if args.no_chat else " (with the chat template)"
        raise UsageError(
            f"{label} is {len(request.prompt_ids)} tokens{templated}, but --max-seq-len is "
            f"{engine.max_seq_len} (prompt and answer together, so prompts of at most "
            f"{engine.max_seq_len - 1} tokens): shorten the prompt or raise --max-seq-len")
    index_of = {r.request_id: i for i, r in enumerate(requests)}
    shown: set[int] = set()

    def show(request_id):
        i = index_of[request_id]
        result = engine.result(request_id)
        if single:       # what the streaming detokenizer still held back (an incomplete
            done = "".join(streamed)          # UTF-8 sequence at the very end), then a newline
            out.write((result.text[len(done):] if result.text.startswith(done) else "") + "\n")
        else:
            out.write(f"--- [{i}] {args.prompt[i]!r}\n{result.text}\n")
        out.flush()
        stats = timing.compiles_since_start()
        compiling = (_compile_stats().seconds if stats is not None else 0.0) - \
            compile_at_first_token.get(i, 0.0)
        label = "" if single else f"{i}: "
        print(f"[{label}{len(result.token_ids)} tokens, finish_reason={result.finish_reason}"
              f"{timing.report(result, compiling, stats)}]", file=err, flush=True)
        shown.add(request_id)

    while engine.has_unfinished():
        report = engine.step()
        for request_id in report.finished:
            if request_id in index_of and request_id not in shown:
                show(request_id)
    for r in requests:                  # finished when queued (prompt too long, 0 tokens)
        if r.request_id not in shown:
            show(r.request_id)
    return 0


class OutputClosed(Exception):
    """Nobody reads standard output any more (the reader of the pipe left, or it was closed)."""


class OutputFailed(Exception):
    """Standard output refused the answer (a full disk, ``/dev/full``, an I/O error)."""


class AnswerOutput:
    """Standard output for the answer.  A write that fails becomes OutputClosed or OutputFailed,
    and stays failed: an engine that hands a callback's exception to its caller later still
    ends the command the same way."""

    def __init__(self, stream):
        self.stream = stream
        self.failure: Exception | None = None

    def write(self, text: str) -> int:
        return self._guarded(self.stream.write, text)

    def flush(self) -> None:
        self._guarded(self.stream.flush)

    def _guarded(self, call, *args):
        if self.failure is not None:
            raise self.failure
        try:
            if getattr(self.stream, "closed", False):    # a stand-in stdout may not say
                raise BrokenPipeError
            return call(*args)
        except BrokenPipeError:
            self.failure = OutputClosed()
        except OSError as exc:
            self.failure = OutputFailed(exc.strerror or _one_line(exc))
        raise self.failure


def bad_prompt_encoding(prompts: list[str]) -> str | None:
    """What to say about the first prompt holding a byte the terminal's encoding could not
    decode (Python gives such argv bytes as lone surrogates), or None."""
    from paged_tutorial.loading.text_input import escaped_byte, find_lone_surrogate

    for i, prompt in enumerate(prompts):
        found = find_lone_surrogate(prompt)
        if found is None:
            continue
        position, char = found
        byte = escaped_byte(char)
        what = f"the byte 0x{byte:02X}" if byte is not None else f"U+{ord(char):04X}"
        label = "the prompt" if len(prompts) == 1 else f"prompt {i + 1}"
        return (f"{label} holds {what} at position {position}, which is not valid in this "
                f"terminal's encoding ({sys.getfilesystemencoding()}, from LANG / LC_ALL): the "
                "terminal sent text in another encoding; make the terminal and LANG / LC_ALL "
                "agree (both UTF-8, say) and type the prompt again")
    return None


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null, so the interpreter's last flush of stdout at exit
    cannot fail again (what Python's documentation advises after a BrokenPipeError)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _error(message: str) -> None:
    if sys.stderr is not None:
        try:
            print(message, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass


def main(argv=None) -> int:
    if sys.stdout is None:           # started with stdout closed (>&-): nobody reads the answer
        return EXIT_OUTPUT_CLOSED
    out = AnswerOutput(sys.stdout)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        problem = bad_prompt_encoding(args.prompt)
        if problem:
            parser.error(problem)
        warnings.formatwarning = _warning_line
        status = run(args, out=out)
        if out.failure is not None:
            raise out.failure
        return status
    except UsageError as exc:
        _error(f"error: {exc}")
    except KeyboardInterrupt:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C: no traceback
        try:
            _error("\nerror: interrupted (Ctrl-C)")
        finally:                         # an in-process caller (a test, a notebook) keeps its Ctrl-C
            signal.signal(signal.SIGINT, previous)
        return EXIT_INTERRUPTED
    except OutputClosed:
        _stdout_to_devnull()
        return EXIT_OUTPUT_CLOSED
    except OutputFailed as exc:
        _stdout_to_devnull()
        _error(f"error: cannot write the answer to standard output: {exc}")
    return EXIT_USAGE


if __name__ == "__main__":
    status = main()
    if status == EXIT_INTERRUPTED:       # the process is ending: a second Ctrl-C changes nothing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)
