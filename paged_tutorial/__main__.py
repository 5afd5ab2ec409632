"""Command line: ``python -m paged_tutorial "prompt" [--model SOURCE] [--backend B] ...``

Streams the answer to stdout; engine facts (backend, cache size) and timing go to stderr.
"""

from __future__ import annotations

import argparse
import sys

from .backends import BACKEND_NAMES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paged_tutorial",
                                description="Generate text with the paged-attention engine.")
    p.add_argument("prompt", nargs="+", help="one or more prompts (each served in a slot)")
    p.add_argument("--model", default="smollm2-135m",
                   help="smollm2-135m (embedded, default), a .gguf file, an HF folder, or a hub "
                        "id such as meta-llama/Llama-3.2-1B-Instruct")
    p.add_argument("--backend", default="auto", choices=BACKEND_NAMES)
    p.add_argument("--dtype", default=None,
                   help="bfloat16 | float16 | float32 (default: bfloat16 on a GPU, float32 on "
                        "a CPU)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-slots", type=int, default=2)
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--kv-cache-mib", type=float, default=None, help="KV cache size in MiB")
    p.add_argument("--prefix-caching", action="store_true",
                   help="prompts that begin alike share the K/V of their common full blocks "
                        "instead of computing them again")
    p.add_argument("--no-chat", action="store_true",
                   help="feed the prompt as plain text, without the chat template")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from . import Engine, load_model

    dtype = args.dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    try:
        model = load_model(args.model, dtype=dtype)
        engine = Engine(model, backend=args.backend, max_slots=args.max_slots,
                        max_seq_len=args.max_seq_len, prefix_caching=args.prefix_caching,
                        kv_cache_bytes=None if args.kv_cache_mib is None
                        else int(args.kv_cache_mib * 2**20))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[{engine.describe()}]", file=sys.stderr)
    many = len(args.prompt) > 1

    def on_token(i, _token, piece):
        if not many:
            sys.stdout.write(piece)
            sys.stdout.flush()

    try:
        results = engine.generate(args.prompt, max_new_tokens=args.max_new_tokens,
                                  temperature=args.temperature, top_p=args.top_p,
                                  seed=args.seed, chat=not args.no_chat, on_token=on_token)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for i, r in enumerate(results):
        if many:
            print(f"--- [{i}] {args.prompt[i]!r}")
            print(r.text)
        else:
            print()
        tps = f", {r.decode_tokens_per_s:.1f} tok/s decode" if r.decode_tokens_per_s else ""
        print(f"[{len(r.token_ids)} tokens, finish_reason={r.finish_reason}{tps}]",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
