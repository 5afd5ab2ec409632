"""The article's fourth limit on a GPU: what copying the whole block table host -> device in
every decode layer costs a real decode step, in one command:

    python benchmarks/table_copy.py [--out DIR] [--steps 64]
    python benchmarks/table_copy.py --dry-run [--out DIR]      # any CPU, tiny model, seconds

Llama-3.2-1B shapes (16 layers), random bf16 weights (``pt.random_model``; the GPU machine
cannot download the real ones), the article's 2 slots, ``max_seq_len`` 2048 (so the table is
its 2 x 16 x 128 = 4096 int32 entries) and its 2 GiB cache; 2 greedy requests of 128 random
prompt tokens, no EOS.  Two arms on the numba backend, both eager (no CUDA graphs) and through
the same forwarding wrapper (``paged_tutorial.measure.table_copy.WholeTableCopyBackend``):

- ``article_ms_per_step``: before each layer's decode attention, the whole host table (a
  pageable numpy array) is copied into the device table, as ``src/main.cpp:876`` does: 16
  copies per step, each waiting for the work queued before it;
- ``engine_ms_per_step``: only the engine's own sync, once per step, of the entries that
  changed (none on most steps; 32 when the two sequences cross a 16-token boundary).

Also: the difference per copy, one copy timed on an idle GPU and behind ~2 ms of queued
matmuls, and the stock engine with CUDA graphs for scale.  The tokens of both arms must be
identical (checked).  Writes ``table-copy-<date>.json`` to --out (default
benchmarks/results/).

``--dry-run`` runs the same code path on the CPU with the torch backend and a tiny random
model that keeps the article's 16 layers (so the table is still 4096 entries); its JSON says
``"dry_run": true`` and is printed, and written only with --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys

GiB = 1024 ** 3


def build(dry_run: bool):
    """(model, backend name, kv_cache_bytes, run sizes) for a GPU run or a dry run."""
    import paged_tutorial as pt

    if dry_run:
        config = pt.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=16, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8)
        model = pt.random_model(config, dtype="float32", seed=0)
        block_bytes = pt.CacheConfig.for_model(config, dtype="float32").BLOCK_BYTES
        return model, "torch", 2 * 4 * 16 * block_bytes, dict(prompt_len=20, steps=3, warmup=1)
    model = pt.random_model(pt.llama_3_2_1b_config(), dtype="bfloat16", seed=0, device="cuda")
    return model, "numba", 2 * GiB, dict(prompt_len=128, steps=64, warmup=4)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for table-copy-<date>.json "
                        "(default benchmarks/results; a dry run writes only when given)")
    parser.add_argument("--steps", type=int, help="timed decode steps per arm (default 64)")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny model, torch backend, CPU: checks the code path in seconds")
    args = parser.parse_args(argv)

    if not args.dry_run:
        from paged_tutorial.measure.gpu_machine import setup_numba_env

        setup_numba_env()
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA GPU visible: run on a GPU, or pass --dry-run")

    import torch

    from paged_tutorial.measure.table_copy import measure_decode

    model, backend, kv_cache_bytes, sizes = build(args.dry_run)
    if args.steps is not None:
        sizes["steps"] = args.steps
    result = measure_decode(model, backend, batch=2, max_seq_len=2048,
                            kv_cache_bytes=kv_cache_bytes, **sizes)
    data = {
        "what": ("ms per decode step (median, wall) with the article's whole block table "
                 "copied host->device from pageable memory before every layer's attention "
                 "(main.cpp:876) vs this engine's changed-entries-only sync; both eager, same "
                 "wrapper, same greedy requests"),
        "date": dt.date.today().isoformat(),
        "dry_run": args.dry_run,
        "model": ("tiny random, 16 layers (dry run)" if args.dry_run
                  else "Llama-3.2-1B shapes, random bf16 weights (seed 0)"),
        "device": (torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.dry_run
                   else f"cpu ({platform.machine()})"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **result,
    }
    print(json.dumps(data, indent=1))
    if not args.dry_run or args.out:
        from common import write_json

        write_json(data, "table-copy", args.out)
    return data


if __name__ == "__main__":
    sys.exit(main() and 0)
