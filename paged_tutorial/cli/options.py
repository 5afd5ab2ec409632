"""The command line's options.  Parsing imports nothing heavy (no torch, numba, numpy or
transformers), so ``--help`` and every option error answer at once; the Python API's
defaults are read from its source files rather than imported."""

from __future__ import annotations

import argparse
import ast
import math
import sys
from functools import lru_cache
from pathlib import Path

from paged_tutorial.loading.catalog import models_help

EXIT_USAGE = 2
# The largest values the numeric options take: beyond them a value is a typo, not a request.
MAX_TOKENS_OPTION = 2 ** 24
MAX_SLOTS_OPTION = 4096
MAX_KV_CACHE_MIB = 2 ** 24      # 16 TiB
MAX_TEMPERATURE = 100.0
STDIN = "-"                     # the prompt (or -f FILE) that means standard input
SERVE = "serve"                 # the subcommand that starts the OpenAI-compatible server

BACKEND_HELP = {
    "auto": "numba on an NVIDIA GPU when it starts there (else torch on that GPU, with a "
            "warning); torch on a CPU",
    "torch": "every op in plain torch: the reference; GPU if visible, else CPU",
    "numba": "Numba CUDA kernels + cuBLAS on an NVIDIA GPU (the engine the notebooks take apart)",
    "numba-sim": "the same kernels in Numba's CUDA simulator on the CPU: every GPU thread is a "
                 "Python thread, so it is very slow; for small models and a few tokens",
}


def backend_help() -> dict[str, str]:
    """Every backend name with its line of help, in the order ``--help`` lists them (the one
    place the command line reads backend names from)."""
    return BACKEND_HELP


PACKAGE = Path(__file__).resolve().parents[1]


def _class_node(path: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name)


@lru_cache(maxsize=1)
def api_defaults() -> dict:
    """The defaults of the Python API, so the command line cannot drift from them:
    ``Engine(...)``'s max_slots / max_seq_len and ``SamplingParams``' sampling fields, read
    from their source (importing them would import torch)."""
    engine = _class_node(PACKAGE / "engine" / "llm_engine.py", "Engine")
    init = next(node for node in engine.body
                if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    arguments = init.args
    positional = arguments.posonlyargs + arguments.args
    pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults))
    pairs += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
    engine_defaults = {a.arg: ast.literal_eval(d) for a, d in pairs}
    params = _class_node(PACKAGE / "engine" / "sampling_params.py", "SamplingParams")
    fields = {node.target.id: ast.literal_eval(node.value) for node in params.body
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and node.value is not None}
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

server: '{prog} serve --help' lists the options of the OpenAI-compatible server.

Exit status: 0 on success, 2 on any error (one 'error:' line on stderr), 130 after Ctrl-C,
141 when nothing reads standard output any more."""


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    d = api_defaults()
    prog = prog or program_name()
    backends = "\n".join(f"  {name:10s} {text}" for name, text in backend_help().items())
    p = argparse.ArgumentParser(
        prog=prog,
        description="Generate text with the paged-attention engine: answer prompts, or chat.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG.format(backends=backends, prog=prog, models=models_help()))
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
    p.add_argument("--max-tokens", type=integer_in(0, MAX_TOKENS_OPTION),
                   default=d["max_tokens"],
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


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed options, or argparse's one ``error:`` line and exit status 2 for a
    combination that cannot work."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
