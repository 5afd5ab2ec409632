"""The article's limit 3 on hardware: compute-sanitizer's racecheck over the article's decode
kernel, once in the article's shared-memory layout and once in the port's (and, given a
reader's ``token_score``, once in hers, "yours").

The article's kernel keeps the warps' partial sums in the shared array ``dot_products`` and
writes the scaled score back into ``dot_products[0]``, where every thread reads it after the
second barrier; warp 0's lane 0 writes its next partial sum into the same cell at the next
token with no barrier in between (``attention.DEPARTURES``).  The port gives the score its own
shared cell; ``attention.ARTICLE_LAYOUT_PARTS`` rebuilds the article's layout to show the race.

``run`` checks each layout in a child process (``python -m paged_tutorial.measure.racecheck
--child LAYOUT``) started under ``compute-sanitizer --tool racecheck --racecheck-report all``:
the child launches the kernel once on the article's shapes (``GPU_CASE``), compiled with line
information, and compares its output with the torch oracle; the parent reads the sanitizer's
report (``sanitizer_report.parse_report``).  A dry run runs the children in Numba's simulator
at a tiny size (``DRY_CASE``) without the sanitizer.  ``benchmarks/racecheck.py`` and
notebook 05's ``races.rerun_racecheck`` call ``run``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import paged_tutorial
from paged_tutorial.measure.result_files import write_json
from paged_tutorial.measure.sanitizer_report import kernel_source_lines, parse_report

#: the module each layout's child process runs
CHILD_MODULE = "paged_tutorial.measure.racecheck"

#: name in the JSON -> where the score waits between the barriers ("score_cell")
LAYOUTS = {"article": "article", "port": "own"}
#: the layout of a reader's part (--part FILE:FUNCTION), checked besides the two above
YOURS = "yours"
#: --print-limit 0: every hazard printed (the default stops at 100, which hid all but 100 of
#: the 17282 the first run on the H200 reported)
SANITIZER_ARGS = ["--tool", "racecheck", "--racecheck-report", "all", "--print-limit", "0"]

#: the launch checked on the GPU: the article's shapes (Llama-3.2-1B, bf16, two slots)
GPU_CASE = dict(head_dim=64, num_kv_heads=8, n_q_heads=32, num_layers=16, layer=5,
                rows=((1, 100), (0, 37)), dtype="bfloat16")
#: the dry run's launch in the simulator: the same two-warp layout, tiny
DRY_CASE = dict(head_dim=64, num_kv_heads=1, n_q_heads=2, num_layers=2, layer=1,
                rows=((1, 5), (0, 3)), dtype="float32")


def load_part(spec: str):
    """``"FILE.py:FUNCTION"`` -> (part name, the function ``FUNCTION`` defined in FILE.py).  The
    part is the function's name unless the spec says ``FILE.py:FUNCTION=PART``."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name:
        raise SystemExit(f"--part {spec!r}: give FILE.py:FUNCTION (e.g. mine.py:token_score)")
    function, _, part = name.partition("=")
    namespace = {"__name__": "reader_part", "__file__": path}
    code = compile(Path(path).read_text(), path, "exec")
    exec(code, namespace)
    if not callable(namespace.get(function)):
        raise SystemExit(f"--part {spec!r}: {path} defines no function {function!r}")
    return part or function, namespace[function]


def run_kernel(layout: str, case: dict, seed: int = 0, part: str | None = None) -> dict:
    """Launch the article's kernel in ``layout`` (``YOURS``: with the reader's ``part``, a
    ``--part`` spec) on ``case``; compare with the torch oracle."""
    import math

    import torch

    from paged_tutorial.backends.numba_cuda import SIMULATING
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.backends.torch_ref import TorchBackend
    from paged_tutorial.config import CacheConfig
    from paged_tutorial.backends.availability import kernel_device
    from paged_tutorial.cache.paged_cache import PagedKVCache, clone_cache

    rows = case["rows"]
    max_seq = 128
    probe = CacheConfig(num_layers=case["num_layers"], num_kv_heads=case["num_kv_heads"],
                        head_dim=case["head_dim"], dtype=case["dtype"], max_slots=2,
                        max_seq_len=max_seq)
    blocks = case["num_layers"] * sum(probe.blocks_for_tokens(n) for _, n in rows) + 1
    config = CacheConfig(num_layers=case["num_layers"], num_kv_heads=case["num_kv_heads"],
                         head_dim=case["head_dim"], dtype=case["dtype"], max_slots=2,
                         max_seq_len=max_seq, kv_cache_bytes=blocks * probe.BLOCK_BYTES)
    dev = kernel_device()
    cache = PagedKVCache(config, dev)
    for slot, n in rows:
        cache.ensure_capacity(slot, n)
    g = torch.Generator().manual_seed(seed)
    cache.buffer.copy_(torch.randn(cache.buffer.numel(), generator=g).to(cache.buffer.dtype)
                       .to(dev))
    q = torch.randn(len(rows), case["n_q_heads"], case["head_dim"], generator=g) \
        .to(cache.buffer.dtype)
    slots, lens = [s for s, _ in rows], [n for _, n in rows]
    scale = 1.0 / math.sqrt(case["head_dim"])
    cpu = clone_cache(cache, "cpu")
    reference = TorchBackend().decode_attention(q.clone(), cpu, cpu.device_block_table(),
                                                case["layer"], torch.tensor(lens),
                                                torch.tensor(slots), scale)
    if layout == YOURS:
        name, fn = load_part(part)
        parts = attention.ARTICLE_PARTS.replace(**{name: fn})
    else:
        parts = attention.ARTICLE_LAYOUT_PARTS if LAYOUTS[layout] == "article" \
            else attention.ARTICLE_PARTS
    out = attention.decode(q.to(dev).clone(), cache, cache.device_block_table(), case["layer"],
                           lens, slots, scale, parts, lineinfo=not SIMULATING).cpu()
    err = float((out.float() - reference.float()).abs().max())
    return {"layout": layout, "score_cell": LAYOUTS.get(layout, "the reader's"),
            "parts_replaced": list(parts.replaced()),
            "device": "simulator" if SIMULATING else torch.cuda.get_device_name(0),
            "max_abs_err_vs_oracle": err, "agrees_with_oracle": err <= 2 ** -6}


def child_main(argv=None) -> int:
    """The child process: one launch in one layout, its result written to ``--report``."""
    p = argparse.ArgumentParser(description="one racecheck launch (started by racecheck.run)")
    p.add_argument("--child", required=True, choices=sorted([*LAYOUTS, YOURS]))
    p.add_argument("--report", required=True)
    p.add_argument("--part", default=None)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    case = DRY_CASE if args.dry_run else GPU_CASE
    result = run_kernel(args.child, case, part=args.part)
    Path(args.report).write_text(json.dumps(result))
    return 0


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for folder in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if folder and (Path(folder) / "bin" / "compute-sanitizer").is_file():
            return str(Path(folder) / "bin" / "compute-sanitizer")
    return None


def child_args(layout: str, dry_run: bool = False, part: str | None = None) -> list[str]:
    """The child's command line after ``python``, without its ``--report`` file."""
    return (["-m", CHILD_MODULE, "--child", layout] + (["--part", part] if layout == YOURS else [])
            + (["--dry-run"] if dry_run else []))


def sanitizer_command(layout: str, dry_run: bool = False, part: str | None = None) -> str:
    """The command line one layout runs (as the JSON records it)."""
    return " ".join(["compute-sanitizer", *SANITIZER_ARGS, "python",
                     *child_args(layout, dry_run, part)])


def run_layout(layout: str, sanitizer: str | None, dry_run: bool, workdir: Path,
               part: str | None = None, timeout: float | None = None) -> dict:
    """Run one layout in a child process (under ``sanitizer`` unless it is None)."""
    report = workdir / f"child-{layout}.json"
    child = [sys.executable, *child_args(layout, dry_run, part), "--report", str(report)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [
        str(Path(paged_tutorial.__file__).resolve().parents[1]), env.get("PYTHONPATH")]))
    if dry_run:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run(([sanitizer, *SANITIZER_ARGS] if sanitizer else []) + child,
                          capture_output=True, text=True, env=env, timeout=timeout)
    out = {"command": sanitizer_command(layout, part=part) if sanitizer else
           " ".join(["python", *child_args(layout, dry_run, part)]),
           "returncode": proc.returncode}
    if report.is_file():
        out.update(json.loads(report.read_text()))
    else:
        tail = proc.stderr.strip().splitlines() or ["no output"]
        out["error"] = f"the kernel did not run: {tail[-1]}"
    if sanitizer:
        text = proc.stdout + "\n" + proc.stderr
        out.update(parse_report(text, kernel_source_lines(part if layout == YOURS else None)))
        kept = [line for line in text.splitlines() if line.startswith("=")]
        out["report_head"], out["report_tail"] = kept[:40], kept[-10:]
        if out["summary"] is None:
            out.setdefault("error", "no RACECHECK SUMMARY line in the sanitizer's output "
                                    "(see report_tail)")
    else:
        out["hazards"] = None
        out["note"] = "dry run: the simulator ran the kernel; no sanitizer, no hazards counted"
    return out


def run(dry_run: bool = False, part: str | None = None, out=None,
        timeout: float | None = None) -> dict:
    """Check every layout (the reader's too, given ``part``, a ``FILE.py:FUNCTION`` spec) and
    return the result; written as ``racecheck-<date>.json`` (a dry run: ``racecheck-dryrun-``)
    into the folder ``out`` when it is given.  On a GPU (not ``dry_run``) it needs CUDA and
    compute-sanitizer and says so when either is missing; ``timeout``: seconds per child."""
    sanitizer = None
    if not dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("racecheck needs an NVIDIA GPU (compute-sanitizer checks real "
                             "launches); use --dry-run to run both layouts in the simulator")
        sanitizer = find_sanitizer()
        if sanitizer is None:
            raise SystemExit("compute-sanitizer not found: it ships with the CUDA toolkit "
                             "(put its bin/ on PATH or set CUDA_HOME)")
    case = DRY_CASE if dry_run else GPU_CASE
    data = {"date": dt.date.today().isoformat(), "dry_run": bool(dry_run),
            "kernel": "attention.py paged_attention_kernel (the article's pagedAttentionKernel)",
            "case": {**case, "rows": [{"slot": s, "seq_len": n} for s, n in case["rows"]]},
            "sanitizer": (subprocess.run([sanitizer, "--version"], capture_output=True,
                                         text=True).stdout.strip().splitlines() or [""])[-1]
            if sanitizer else None,
            "layouts": {}}
    layouts = [*LAYOUTS, *([YOURS] if part else [])]
    if part:
        load_part(part)                        # refuse a bad spec before any child starts
        data["part"] = part
    data["commands"] = {layout: sanitizer_command(layout, part=part) for layout in layouts}
    if sanitizer:
        import torch

        data["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        for layout in layouts:
            result = run_layout(layout, sanitizer, dry_run, Path(tmp), part, timeout)
            data["layouts"][layout] = result
            print(f"{layout:>8}: " + (f"{result['hazards']} hazards {result.get('by_cell')}"
                                      if sanitizer else
                                      f"ran in the simulator, max |err| vs oracle "
                                      f"{result.get('max_abs_err_vs_oracle')}"), file=sys.stderr)
    if out is not None:
        write_json(data, "racecheck-dryrun" if dry_run else "racecheck", out)
    return data


def failed_layouts(data: dict) -> list[str]:
    """The layouts of a ``run`` result whose child failed (or, in a dry run, whose output
    differs from the oracle's)."""
    return [name for name, layout in data["layouts"].items() if "error" in layout
            or (data["dry_run"] and not layout.get("agrees_with_oracle"))]


if __name__ == "__main__":
    sys.exit(child_main())
