"""The article's limit 3 on hardware: compute-sanitizer's racecheck over the article's decode
kernel, once in the article's shared-memory layout and once in the port's.

The article's kernel (``kernels.cu:486-508``) keeps the warps' partial sums in the shared array
``dot_products`` and then writes the scaled score back into ``dot_products[0]``, where every
thread reads it after the second barrier.  Warp 0's lane 0 writes its next partial sum into the
same cell at the next token with no barrier in between (``attention.DEPARTURES``).  The port
gives the score its own shared cell.  ``attention.ARTICLE_LAYOUT_PARTS`` rebuilds the article's
layout (its ``token_score`` writes the score back into ``dot_products[0]``) to show the race.

    python benchmarks/racecheck.py             # on a GPU with compute-sanitizer: both layouts,
                                               # writes benchmarks/results/racecheck-<date>.json
    python benchmarks/racecheck.py --dry-run   # anywhere: both layouts in Numba's simulator at
                                               # a tiny size, no sanitizer; prints the JSON

For each layout the script starts itself again under
``compute-sanitizer --tool racecheck --racecheck-report all`` (``--child LAYOUT``): the child
launches the kernel once on the article's shapes (Llama-3.2-1B: head_dim 64 = two warps, 32 q
heads over 8 kv heads, bf16, a batch of two rows whose cache slots are 1 and 0), compiled with
line information, and checks its output against the torch oracle.  The parent reads the
sanitizer's report: its summary line, every race it analysed (the two accesses, their
``attention.py`` lines and the number of hazards) and every single hazard (kind, shared byte
offset, thread block, the two threads), and names the shared array (and, where the source line
says, the element) that each one is on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results"
#: name in the JSON -> where the score waits between the barriers ("score_cell")
LAYOUTS = {"article": "article", "port": "own"}
SHARED_ARRAYS = ("dot_products", "score")            # the kernel's shared arrays
#: --print-limit 0: every hazard printed (the default stops at 100, which hid all but 100 of
#: the 17282 the first run on the H200 reported)
SANITIZER_ARGS = ["--tool", "racecheck", "--racecheck-report", "all", "--print-limit", "0"]

#: the launch checked on the GPU: the article's shapes (Llama-3.2-1B, bf16, two slots)
GPU_CASE = dict(head_dim=64, num_kv_heads=8, n_q_heads=32, num_layers=16, layer=5,
                rows=((1, 100), (0, 37)), dtype="bfloat16")
#: the dry run's launch in the simulator: the same two-warp layout, tiny
DRY_CASE = dict(head_dim=64, num_kv_heads=1, n_q_heads=2, num_layers=2, layer=1,
                rows=((1, 5), (0, 3)), dtype="float32")


# =========================================================================================
# the child: one launch of the kernel in one layout
# =========================================================================================

def run_kernel(layout: str, case: dict, seed: int = 0) -> dict:
    """Launch the article's kernel in ``layout`` on ``case``; compare with the torch oracle."""
    import math

    import torch

    from paged_tutorial.backends.numba_cuda import SIMULATING
    from paged_tutorial.backends.numba_cuda.kernels import attention
    from paged_tutorial.backends.torch_ref import TorchBackend
    from paged_tutorial.config import CacheConfig
    from paged_tutorial.cache.paged_cache import PagedKVCache
    from paged_tutorial.teaching.oracles import clone_cache, kernel_device

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
    parts = attention.ARTICLE_LAYOUT_PARTS if LAYOUTS[layout] == "article" \
        else attention.ARTICLE_PARTS
    out = attention.decode(q.to(dev).clone(), cache, cache.device_block_table(), case["layer"],
                           lens, slots, scale, parts, lineinfo=not SIMULATING).cpu()
    err = float((out.float() - reference.float()).abs().max())
    return {"layout": layout, "score_cell": LAYOUTS[layout],
            "device": "simulator" if SIMULATING else torch.cuda.get_device_name(0),
            "max_abs_err_vs_oracle": err, "agrees_with_oracle": err <= 2 ** -6}


def child_main(args) -> int:
    case = DRY_CASE if args.dry_run else GPU_CASE
    result = run_kernel(args.child, case)
    Path(args.report).write_text(json.dumps(result))
    return 0


# =========================================================================================
# reading the sanitizer's report
# =========================================================================================

_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+) hazards? displayed\s*\((\d+) errors?,\s*"
                      r"(\d+) warnings?\)")
_RACE = re.compile(r"(Error|Warning|ERROR|WARN\S*)\s*:?\s*Race reported between (Read|Write) "
                   r"access at (.+?)\s*$")
_AND = re.compile(r"^\s*and (Read|Write) access at (.+?)\s*\[(\d+) hazards?\]")
_HAZARD = re.compile(r"(ERROR|WARN|Error|Warning)\S*.*?Potential (RAW|WAR|WAW) hazard "
                     r"detected at __shared__ (0x[0-9a-fA-F]+) in block \(([^)]*)\)")
_THREAD = re.compile(r"^\s*(Read|Write) Thread \(([^)]*)\) at (.+?)\s*$")
_WHERE = re.compile(r"\bin (\S+?):(\d+)\b")
_PREFIX = re.compile(r"^=+\s?")


def _ints(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def source_line(location: str, source: dict) -> dict:
    """{'file', 'line', 'code', 'array', 'index'} for a sanitizer location such as
    ``paged_attention_kernel+0x2f0 in /x/attention.py:313:...``; ``source`` maps a file's base
    name to its lines."""
    found = _WHERE.search(location)
    out = {"at": location.strip()}
    if not found:
        return out
    name, line = Path(found.group(1)).name, int(found.group(2))
    out.update(file=name, line=line)
    lines = source.get(name)
    if lines and 1 <= line <= len(lines):
        code = lines[line - 1].strip()
        out["code"] = code
        cell = re.search(r"\b(" + "|".join(SHARED_ARRAYS) + r")\[([^\]]+)\]", code)
        if cell:
            out["array"], out["index"] = cell.group(1), cell.group(2).strip()
    return out


def cell_name(access: dict, thread: tuple | None = None) -> str | None:
    """``dot_products[0]`` from an access's source line (a literal index, or ``thread_id //
    WARP_SIZE`` with the thread known); the array alone when the element cannot be told."""
    array, index = access.get("array"), access.get("index")
    if array is None:
        return None
    if index is not None and index.isdigit():
        return f"{array}[{index}]"
    if index is not None and thread and re.fullmatch(r"thread_id\s*//\s*WARP_SIZE", index):
        return f"{array}[{thread[0] // 32}]"
    return array


def parse_report(text: str, source: dict) -> dict:
    """The racecheck report ``text`` as data: summary, races (analysis mode: two accesses and
    a hazard count each), single hazards (hazard mode: one per byte) and hazards per shared
    cell.  ``source``: {file base name: list of lines} to name the shared arrays."""
    lines = [_PREFIX.sub("", line.rstrip()) for line in text.splitlines()]
    summary, first = None, None
    races, hazards = [], []
    for i, line in enumerate(lines):
        m = _SUMMARY.search(line)
        if m:
            summary = dict(zip(("displayed", "errors", "warnings"), _ints(m.group(0))))
            continue
        m = _RACE.search(line)
        if m:
            rest = m.group(3)
            inline = re.search(r"^(.*?)\s+and (Read|Write) access at (.+?)\s*\[(\d+) hazards?\]",
                               rest)
            first = (m.group(1), m.group(2), inline.group(1) if inline else rest)
            if inline:
                races.append(_race(first, inline.group(2), inline.group(3),
                                   int(inline.group(4)), source))
            continue
        m = _AND.search(line)
        if m and first is not None:
            races.append(_race(first, m.group(1), m.group(2), int(m.group(3)), source))
            continue
        m = _HAZARD.search(line)
        if m:
            hazard = {"severity": m.group(1), "kind": m.group(2), "offset": m.group(3),
                      "block": list(_ints(m.group(4))), "accesses": []}
            for follow in lines[i + 1:i + 4]:
                t = _THREAD.search(follow)
                if not t:
                    continue
                access = source_line(t.group(3), source)
                thread = _ints(t.group(2))
                access.update(op=t.group(1), thread=list(thread), cell=cell_name(access, thread))
                hazard["accesses"].append(access)
            hazards.append(hazard)
    by_cell: dict = {}
    if races:
        for r in races:
            key = _where(r["first"].get("cell"), r["second"].get("cell"), hazards) \
                if _in_kernel(r["first"], r["second"]) else OUTSIDE
            by_cell[key] = by_cell.get(key, 0) + r["hazards"]
    else:
        for h in hazards:
            cells = [a.get("cell") for a in h["accesses"]] + [None, None]
            key = _where(cells[0], cells[1], [h]) if _in_kernel(*h["accesses"]) else OUTSIDE
            by_cell[key] = by_cell.get(key, 0) + 1
    return {"summary": summary,
            "hazards": sum(r["hazards"] for r in races) if races else len(hazards),
            "counted_from": "races (analysis)" if races else "single hazards (one per byte)",
            "by_cell": by_cell, "races": races, "single_hazards": len(hazards),
            "single_hazard_kinds": _count(h["kind"] for h in hazards),
            "single_hazard_offsets": _count(h["offset"] for h in hazards),
            "single_hazard_examples": hazards[:4]}


def _race(first, op: str, location: str, count: int, source) -> dict:
    a = source_line(first[2], source)
    a.update(op=first[1], cell=cell_name(a))
    b = source_line(location, source)
    b.update(op=op, cell=cell_name(b))
    return {"severity": first[0], "first": a, "second": b, "hazards": count}


OUTSIDE = "outside the attention kernel"
KERNEL_NAME = "paged_attention_kernel"


def _in_kernel(*accesses) -> bool:
    """True unless the accesses' locations name a function other than the attention kernel
    (a location without a function name counts as the kernel's)."""
    text = " ".join(a.get("at", "") for a in accesses)
    return KERNEL_NAME in text or not re.search(r"[A-Za-z_]\w*\s*(\(|\+0x)", text) or \
        "attention.py" in text


def _where(cell_a, cell_b, hazards) -> str:
    """One name for the place of a race: the element both accesses name, else the array,
    else the byte offsets the single hazards give."""
    cells = [c for c in (cell_a, cell_b) if c]
    if cells:
        exact = [c for c in cells if "[" in c]
        return exact[0] if exact else cells[0]
    offsets = sorted({h["offset"] for h in hazards})
    return f"__shared__ {','.join(offsets)}" if offsets else "unknown"


def _count(items) -> dict:
    out: dict = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def kernel_source_lines() -> dict:
    """{base name: lines} of the files a report can name (the kernel's module)."""
    from paged_tutorial.backends.numba_cuda.kernels import attention

    path = Path(attention.__file__)
    return {path.name: path.read_text().splitlines()}


# =========================================================================================
# the parent: run each layout (under the sanitizer on a GPU), write the JSON
# =========================================================================================

def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for folder in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if folder and (Path(folder) / "bin" / "compute-sanitizer").is_file():
            return str(Path(folder) / "bin" / "compute-sanitizer")
    return None


def sanitizer_command(layout: str, dry_run: bool = False) -> str:
    """The command line one layout runs (as the JSON records it)."""
    return " ".join(["compute-sanitizer", *SANITIZER_ARGS, "python", "benchmarks/racecheck.py",
                     "--child", layout] + (["--dry-run"] if dry_run else []))


def run_layout(layout: str, sanitizer: str | None, dry_run: bool, workdir: Path) -> dict:
    """Run one layout in a child process (under ``sanitizer`` unless it is None)."""
    report = workdir / f"child-{layout}.json"
    child = [sys.executable, str(HERE), "--child", layout, "--report", str(report)]
    if dry_run:
        child.append("--dry-run")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parents[1]),
                                                      env.get("PYTHONPATH")]))
    if dry_run:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    proc = subprocess.run(([sanitizer, *SANITIZER_ARGS] if sanitizer else []) + child,
                          capture_output=True, text=True, env=env)
    out = {"command": sanitizer_command(layout) if sanitizer else
           f"python benchmarks/racecheck.py --child {layout} --dry-run",
           "returncode": proc.returncode}
    if report.is_file():
        out.update(json.loads(report.read_text()))
    else:
        tail = proc.stderr.strip().splitlines() or ["no output"]
        out["error"] = f"the kernel did not run: {tail[-1]}"
    if sanitizer:
        text = proc.stdout + "\n" + proc.stderr
        out.update(parse_report(text, kernel_source_lines()))
        kept = [line for line in text.splitlines() if line.startswith("=")]
        out["report_head"], out["report_tail"] = kept[:40], kept[-10:]
        if out["summary"] is None:
            out.setdefault("error", "no RACECHECK SUMMARY line in the sanitizer's output "
                                    "(see report_tail)")
    else:
        out["hazards"] = None
        out["note"] = "dry run: the simulator ran the kernel; no sanitizer, no hazards counted"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None,
                   help="folder for racecheck-<date>.json (default benchmarks/results; a dry run "
                        "writes only when --out is given)")
    p.add_argument("--dry-run", action="store_true",
                   help="both layouts in Numba's CUDA simulator at a tiny size, no sanitizer")
    p.add_argument("--child", choices=sorted(LAYOUTS), help=argparse.SUPPRESS)
    p.add_argument("--report", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        if args.dry_run:
            os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
        return child_main(args)

    sanitizer = None
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("racecheck.py needs an NVIDIA GPU (compute-sanitizer checks real "
                             "launches); use --dry-run to run both layouts in the simulator")
        sanitizer = find_sanitizer()
        if sanitizer is None:
            raise SystemExit("compute-sanitizer not found: it ships with the CUDA toolkit "
                             "(put its bin/ on PATH or set CUDA_HOME)")
    case = DRY_CASE if args.dry_run else GPU_CASE
    data = {"date": dt.date.today().isoformat(), "dry_run": bool(args.dry_run),
            "kernel": "attention.py paged_attention_kernel (the article's pagedAttentionKernel)",
            "case": {**case, "rows": [{"slot": s, "seq_len": n} for s, n in case["rows"]]},
            "sanitizer": (subprocess.run([sanitizer, "--version"], capture_output=True,
                                         text=True).stdout.strip().splitlines() or [""])[-1]
            if sanitizer else None,
            "commands": {layout: sanitizer_command(layout) for layout in LAYOUTS},
            "layouts": {}}
    if sanitizer:
        import torch

        data["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        for layout in LAYOUTS:
            result = run_layout(layout, sanitizer, args.dry_run, Path(tmp))
            data["layouts"][layout] = result
            print(f"{layout:>8}: " + (f"{result['hazards']} hazards {result.get('by_cell')}"
                                      if sanitizer else
                                      f"ran in the simulator, max |err| vs oracle "
                                      f"{result.get('max_abs_err_vs_oracle')}"), file=sys.stderr)
    text = json.dumps(data, indent=1)
    if args.out or not args.dry_run:
        folder = Path(args.out) if args.out else RESULTS
        folder.mkdir(parents=True, exist_ok=True)
        stem = "racecheck-dryrun" if args.dry_run else "racecheck"
        path = folder / f"{stem}-{data['date']}.json"
        path.write_text(text)
        print(f"wrote {path}", file=sys.stderr)
    else:
        print(text)
    failed = [name for name, layout in data["layouts"].items() if "error" in layout
              or (args.dry_run and not layout.get("agrees_with_oracle"))]
    if failed:
        print(f"failed: {', '.join(failed)} (see the JSON)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
