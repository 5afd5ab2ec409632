"""``python -m paged_tutorial serve``: the OpenAI-compatible server from the command line.

    python -m paged_tutorial serve --model smollm2-135m --port 8000

``serve_main(argv)`` parses the arguments before anything heavy is imported (``--help`` and
argument errors are instant), loads the model, builds the engine, and serves on 127.0.0.1
unless ``--host`` says otherwise, until Ctrl-C or SIGTERM: then it lets the requests in flight
finish (``--drain-timeout``) and exits, 0 after SIGTERM, 130 after Ctrl-C (as the main command).
"""

from __future__ import annotations

import argparse
import signal
import sys

MAX_TOKENS_OPTION = 1 << 20


def _integer_in(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {value}")
        return value
    return parse


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m paged_tutorial serve",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, "
                    "/v1/chat/completions, /v1/models, /health, /metrics).  Ctrl-C or SIGTERM "
                    "finishes the requests in flight and exits.")
    p.add_argument("--model", default="smollm2-135m",
                   help="an alias, a .gguf file, an HF folder or a hub id (default: "
                        "%(default)s)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients pass as 'model' (default: --model as given)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, this machine only)")
    p.add_argument("--port", type=_integer_in(0, 65535), default=8000,
                   help="TCP port (default: %(default)s)")
    p.add_argument("--backend", default="auto", help="torch, numba, ... (default: %(default)s)")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="default: as the main command (the model's catalog entry decides)")
    p.add_argument("--max-slots", type=_integer_in(1, 4096), default=8,
                   help="requests decoded together; more wait in the queue (default: "
                        "%(default)s)")
    p.add_argument("--max-seq-len", type=_integer_in(1, MAX_TOKENS_OPTION), default=None,
                   help="prompt + answer tokens per request (default: 2048, or the model's "
                        "max_position_embeddings if smaller)")
    p.add_argument("--kv-cache-mib", type=_positive_number, default=None,
                   help="KV cache size in MiB (default: what max-slots x max-seq-len need, "
                        "capped)")
    p.add_argument("--prefix-caching", action="store_true",
                   help="prompts that begin alike share the K/V of their common full blocks")
    p.add_argument("--drain-timeout", type=_positive_number, default=30.0,
                   help="seconds the requests in flight get to finish after Ctrl-C or SIGTERM "
                        "(default: %(default)s)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    return p


def serve_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("error: the server needs FastAPI and uvicorn: pip install 'paged-tutorial[serve]'",
              file=sys.stderr)
        return 2
    from paged_tutorial.backends import BACKEND_NAMES
    if args.backend not in BACKEND_NAMES:
        print(f"error: --backend must be one of {', '.join(BACKEND_NAMES)}, got "
              f"{args.backend!r}", file=sys.stderr)
        return 2
    from paged_tutorial.engine.llm_engine import Engine
    from paged_tutorial.loading.models import load_model
    from paged_tutorial.serving.app import build_app
    from paged_tutorial.serving.server import serve

    try:
        model = load_model(args.model, dtype=args.dtype)
        engine = Engine(model, backend=args.backend, max_slots=args.max_slots,
                        max_seq_len=args.max_seq_len, prefix_caching=args.prefix_caching,
                        kv_cache_bytes=None if args.kv_cache_mib is None
                        else int(args.kv_cache_mib * 2 ** 20))
        engine.warm_up()
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or args.model
    print(f"serving {name!r} on http://{args.host}:{args.port}/v1 ({engine.describe()})",
          file=sys.stderr, flush=True)
    stopped_by = serve(build_app(engine, name), host=args.host, port=args.port,
                       drain_timeout_s=args.drain_timeout, log_level=args.log_level)
    return 130 if stopped_by == signal.SIGINT else 0
