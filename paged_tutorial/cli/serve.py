"""``paged-tutorial serve``: the OpenAI-compatible server, started from the command line.

    python -m paged_tutorial serve --model smollm2-135m --port 8000

The options are parsed by ``options.py`` (the same parser as the main command's, before
anything heavy is imported); ``run_serve`` starts the engine -- in a process of its own
(``serving/engine_process.py``, the default) or, with ``--engine thread``, on a thread of the
server's process -- and serves on 127.0.0.1 unless ``--host`` says otherwise, until Ctrl-C or SIGTERM: then it lets the requests
in flight finish (``--drain-timeout``) and exits, 0 after SIGTERM, 130 after Ctrl-C (as the
main command).
"""

from __future__ import annotations

import signal
import sys

from paged_tutorial.cli.options import EXIT_USAGE, MIB


def run_serve(args, err=None) -> int:
    err = err or sys.stderr
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print("error: the server needs FastAPI and uvicorn: pip install 'paged-tutorial[serve]'",
              file=err)
        return EXIT_USAGE
    from paged_tutorial.serving.app import build_app
    from paged_tutorial.serving.engine_process import EngineProcess, EngineRecipe
    from paged_tutorial.serving.server import serve

    recipe = EngineRecipe(args.model, backend=args.backend, dtype=args.dtype,
                          max_slots=args.max_slots, max_seq_len=args.max_seq_len,
                          prefix_caching=args.prefix_caching, threads=args.threads,
                          async_scheduling=args.async_scheduling,
                          kv_cache_bytes=None if args.kv_cache_mib is None
                          else int(args.kv_cache_mib * MIB))
    try:
        if args.engine == "process":
            engine_loop = EngineProcess(recipe)
            engine = engine_loop.frontend
        else:
            engine_loop, engine = None, recipe.build()
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=err)
        return EXIT_USAGE
    name = args.served_model_name or args.model
    print(f"serving {name!r} on http://{args.host}:{args.port}/v1 ({engine.describe()}; "
          f"engine in a {args.engine} of its own)", file=err, flush=True)
    app = build_app(engine, name, engine_loop, api_key=args.api_key,
                    max_body_bytes=args.max_body_bytes, body_timeout_s=args.body_timeout)
    stopped_by = serve(app, host=args.host, port=args.port, drain_timeout_s=args.drain_timeout,
                       log_level=args.log_level, limit_concurrency=args.limit_concurrency,
                       timeout_keep_alive_s=args.timeout_keep_alive)
    return 130 if stopped_by == signal.SIGINT else 0
