"""The command line's one parser: the main command (answer prompts, or ``--chat``) and its
``serve`` subcommand (the OpenAI-compatible server), sharing one definition of every option
they have in common.  Parsing imports nothing heavy (no torch, numba, numpy or transformers),
so ``--help`` and every option error answer at once: the Engine's defaults and the backends'
help are read from their source files; the limits (``engine/limits.py``) and the sampling
rules (``SamplingParams``) are the API's own, imported, so an option is refused with the words
the Python API and the server use."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import math
import os
import sys
import textwrap
from functools import lru_cache
from pathlib import Path

from paged_tutorial.engine.limits import MAX_SLOTS_LIMIT, MAX_TOKENS_LIMIT, AdmissionError
from paged_tutorial.engine.sampling_params import SamplingParams
from paged_tutorial.loading.catalog import models_help

EXIT_USAGE = 2
# The largest value --kv-cache-mib takes: beyond it a value is a typo, not a request.
MAX_KV_CACHE_MIB = 2 ** 24      # 16 TiB
STDIN = "-"                     # the prompt (or -f FILE) that means standard input
SERVE = "serve"                 # the subcommand that starts the OpenAI-compatible server
MIB = 2 ** 20

PACKAGE = Path(__file__).resolve().parents[1]


def _class_node(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)


@lru_cache(maxsize=1)
def backend_help() -> dict[str, str]:
    """Every backend name with its line of help, in the order ``--help`` lists them: the
    entries of ``backends.BACKENDS``, read from its source (importing it would import
    torch)."""
    tree = ast.parse((PACKAGE / "backends" / "__init__.py").read_text(encoding="utf-8"))
    registry = next(node for node in tree.body if isinstance(node, ast.AnnAssign)
                    and isinstance(node.target, ast.Name) and node.target.id == "BACKENDS")
    entries = [node for node in ast.walk(registry.value) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Name) and node.func.id == "BackendEntry"]
    return {ast.literal_eval(e.args[0]): ast.literal_eval(e.args[1]) for e in entries}


@lru_cache(maxsize=1)
def api_defaults() -> dict:
    """The defaults of the Python API, so the command line cannot drift from them:
    ``Engine(...)``'s max_slots / max_seq_len (read from its source: importing it would import
    torch) and ``SamplingParams``' sampling fields."""
    engine = _class_node(PACKAGE / "engine" / "llm_engine.py", "Engine")
    init = next(node for node in engine.body
                if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    arguments = init.args
    positional = arguments.posonlyargs + arguments.args
    pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults))
    pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
    engine_defaults = {a.arg: ast.literal_eval(d) for a, d in pairs}
    fields = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    defaults = {name: engine_defaults[name] for name in ("max_slots", "max_seq_len")}
    for name in ("max_tokens", "temperature", "top_p", "seed"):
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


def integer(text: str) -> int:
    """An argparse ``type``: any integer (its range is checked where its rule is)."""
    return integer_in(-math.inf, math.inf)(text)


def number(text: str) -> float:
    """An argparse ``type``: any number, nan and inf included (its range is checked where its
    rule is: ``SamplingParams``)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def plain_number(number: float) -> str:
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
                f"must be a finite number in {bracket}{plain_number(low)}, "
                f"{plain_number(high)}], got {text}")
        return value
    return parse


def program_name() -> str:
    """What the usage line calls the command: ``paged-tutorial`` when it was started as the
    installed command, ``python -m paged_tutorial`` when started as a module."""
    started_as = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if started_as.startswith("paged-tutorial"):
        return "paged-tutorial"
    return "python -m paged_tutorial"


EPILOG = """\
prompts: each PROMPT argument is one prompt; '-' reads one from standard input, and -f FILE
reads one from a file (repeatable).  Without prompts and without --chat, nothing to do.

backends:
{backends}

{models}

commands: '{prog} serve --help' lists the options of the OpenAI-compatible server.

Exit status: 0 on success, 2 on any error (one 'error:' line on stderr), 130 after Ctrl-C,
141 when nothing reads standard output any more."""

SERVE_DESCRIPTION = """\
Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,
/v1/models, /health, /metrics).  Ctrl-C or SIGTERM finishes the requests in flight and exits
(status 130 after Ctrl-C, 0 after SIGTERM)."""


def add_engine_options(p: argparse.ArgumentParser, max_slots: int) -> None:
    """The model, the backend and the engine: the same options for both commands."""
    d = api_defaults()
    p.add_argument("--model", default="smollm2-135m",
                   help="an alias, a .gguf file, an HF folder or a hub id (default: "
                        "%(default)s)")
    p.add_argument("--backend", default="auto", choices=tuple(backend_help()),
                   help="see 'backends' below (default: %(default)s)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="default: the model's catalog entry decides on a GPU (float32 for "
                        "smollm2-135m; bfloat16 for Llama-3.2-1B and larger, float16 on a GPU "
                        "without native bfloat16 such as a T4), float32 on a CPU; the loading "
                        "line says which and why")
    p.add_argument("--max-slots", type=integer_in(1, MAX_SLOTS_LIMIT), default=max_slots,
                   help="requests decoded together; more wait in the queue (default: "
                        "%(default)s)")
    p.add_argument("--max-seq-len", type=integer_in(1, MAX_TOKENS_LIMIT),
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
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="launch each decode step before the previous one is read back, so "
                        "the GPU does not wait for the host between steps (same tokens; "
                        "default: on where decode steps replay CUDA graphs)")
    p.add_argument("--threads", type=integer_in(1, MAX_SLOTS_LIMIT), default=None,
                   metavar="N",
                   help="CPU threads torch may use, set before the model loads (default: "
                        "chosen for this machine from the cores other processes leave free)")


def backend_lines() -> str:
    """The registry's backends, one described entry each, for an epilog."""
    return "\n".join(textwrap.fill(text, width=96, initial_indent=f"  {name:10s} ",
                                    subsequent_indent=" " * 13)
                      for name, text in backend_help().items())


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The main command: answer prompts, or chat."""
    d = api_defaults()
    prog = prog or program_name()
    p = argparse.ArgumentParser(
        prog=prog,
        usage=f"%(prog)s [options] PROMPT ...\n       {prog} serve [options]",
        description="Generate text with the paged-attention engine: answer prompts, or chat.\n"
                    "'serve' starts the OpenAI-compatible server.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG.format(backends=backend_lines(), prog=prog, models=models_help()))
    p.add_argument("prompt", nargs="*", metavar="PROMPT",
                   help="prompts, each served in a slot; '-' reads one from standard input")
    p.add_argument("-f", "--file", action="append", default=[], metavar="FILE",
                   help="read a prompt from FILE (UTF-8; '-' is standard input); repeatable")
    p.add_argument("--system", metavar="TEXT",
                   help="a system message put before every prompt (through the chat template)")
    p.add_argument("--chat", action="store_true",
                   help="an interactive conversation with history: type a line, get an answer; "
                        "Ctrl-C stops an answer and keeps the conversation, Ctrl-D ends it")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per answer (a line each): index, prompt, text, "
                        "token_ids, finish_reason, timings")
    add_engine_options(p, max_slots=d["max_slots"])
    # sampling: parsed as numbers here, their ranges are SamplingParams' (see parse)
    p.add_argument("--max-tokens", type=integer,
                   default=d["max_tokens"],
                   help=f"tokens to generate per prompt (default: %(default)s), 1 to "
                        f"{MAX_TOKENS_LIMIT}")
    p.add_argument("--temperature", type=number,
                   default=d["temperature"], help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-p", type=number, default=d["top_p"],
                   help="nucleus sampling mass, in (0, 1] (default: %(default)s)")
    p.add_argument("--seed", type=integer, default=d["seed"],
                   help="sampling seed (default: random)")
    p.add_argument("--no-chat", action="store_true",
                   help="feed the prompt as plain text, without the model's chat template")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar while the weights load")
    return p


def build_serve_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """``serve``: the OpenAI-compatible server; the engine options are the main command's."""
    p = argparse.ArgumentParser(prog=f"{prog or program_name()} {SERVE}",
                                usage="%(prog)s [options]", description=SERVE_DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"backends:\n{backend_lines()}")
    add_engine_options(p, max_slots=SERVE_MAX_SLOTS)
    p.add_argument("--served-model-name", default=None,
                   help="the name clients pass as 'model' (default: --model as given)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, this machine only)")
    p.add_argument("--port", type=integer_in(0, 65535), default=8000,
                   help="TCP port (default: %(default)s)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on /v1 requests (default: the "
                        f"environment variable {API_KEY_ENV} if set, else no key)")
    p.add_argument("--max-body-bytes", type=integer_in(1, 2 ** 40), default=MIB,
                   help="the largest request body accepted, in bytes (default: %(default)s)")
    p.add_argument("--limit-concurrency", type=integer_in(1, 2 ** 20), default=512,
                   help="connections served at once; more get 503 (default: %(default)s)")
    p.add_argument("--timeout-keep-alive", type=number_in(0.0, math.inf, low_open=True),
                   default=5.0, metavar="SECONDS",
                   help="an idle keep-alive connection is closed after this (default: "
                        "%(default)s)")
    p.add_argument("--body-timeout", type=number_in(0.0, math.inf, low_open=True),
                   default=30.0, metavar="SECONDS",
                   help="a request body must arrive within this (default: %(default)s)")
    p.add_argument("--drain-timeout", type=number_in(0.0, math.inf, low_open=True),
                   default=30.0, metavar="SECONDS",
                   help="seconds the requests in flight get to finish after Ctrl-C or SIGTERM "
                        "(default: %(default)s)")
    p.add_argument("--engine", default="process", choices=["process", "thread"],
                   help="where the engine steps: 'process', a process of its own, so the HTTP "
                        "server never waits for the engine's share of the interpreter lock "
                        "(default); 'thread', a thread of the server's process")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    return p


#: requests a server decodes together unless --max-slots says otherwise
SERVE_MAX_SLOTS = 8
#: the environment variable --api-key falls back to
API_KEY_ENV = "PAGED_TUTORIAL_API_KEY"


def check_sampling(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The sampling options through ``SamplingParams``: a value out of range is refused with
    the words the Python API and the server use, as argparse's one error line."""
    try:
        SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                       top_p=args.top_p, seed=args.seed)
    except AdmissionError as exc:
        parser.error(f"argument --{exc.field.replace('_', '-')}: {exc}")


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed options (``command``: ``"answer"`` or ``"serve"``), or argparse's one
    ``error:`` line and exit status 2 for a value or a combination that cannot work."""
    if argv[:1] == [SERVE]:
        args = build_serve_parser().parse_args(argv[1:])
        args.command = SERVE
        if args.api_key is None:
            args.api_key = os.environ.get(API_KEY_ENV) or None
        return args
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command = "answer"
    check_sampling(parser, args)
    prompts = args.prompt + args.file
    if prompts.count(STDIN) > 1:
        parser.error("standard input ('-') can give only one prompt")
    if args.chat and prompts:
        parser.error("--chat reads its prompts from the terminal, one line each: drop the "
                     "prompt arguments and -f, or drop --chat")
    if args.chat and args.json:
        parser.error("--json prints one object per answer of a one-shot run: drop --json "
                     "(or --chat)")
    if args.chat and args.no_chat:
        parser.error("--chat needs the chat template that --no-chat turns off: drop one")
    if args.system is not None and args.no_chat:
        parser.error("--system is a message for the chat template, which --no-chat turns off: "
                     "drop one (or put the instructions into the prompt itself)")
    if not args.chat and not prompts:
        parser.error("no prompt: give one (\"What is PagedAttention?\"), '-' to read standard "
                     "input, -f FILE, or --chat for a conversation")
    return args
